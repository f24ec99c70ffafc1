"""Options resolve marker > CLI > env > ini > default, and every bad value names its source."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

PROBE = """
from pytest_moeperf import options

def test_probe(request):
    r = options.resolve(request.config, "{name}")
    print("RESOLVED", repr(r.value), "FROM", r.source)
"""


def _probe(pytester: pytest.Pytester, name: str, *args: str) -> str:
    pytester.makepyfile(PROBE.format(name=name))
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", *args)
    return result.stdout.str()


def test_default(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOEPERF_RUNS", raising=False)
    assert "RESOLVED None FROM default" in _probe(pytester, "moeperf_runs")


def test_ini_beats_default(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOEPERF_RUNS", raising=False)
    pytester.makeini("[pytest]\nmoeperf_runs = 4\n")
    out = _probe(pytester, "moeperf_runs")
    assert "RESOLVED 4 FROM ini option moeperf_runs" in out


def test_env_beats_ini(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nmoeperf_runs = 4\n")
    monkeypatch.setenv("MOEPERF_RUNS", "6")
    assert "RESOLVED 6 FROM environment variable MOEPERF_RUNS" in _probe(pytester, "moeperf_runs")


def test_cli_beats_env(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPERF_RUNS", "6")
    out = _probe(pytester, "moeperf_runs", "--moeperf-runs", "8")
    assert "RESOLVED 8 FROM command line --moeperf-runs" in out


def test_bad_cli_value_names_flag(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MOEPERF_RUNS", raising=False)
    out = _probe(pytester, "moeperf_runs", "--moeperf-runs", "zero")
    assert "command line --moeperf-runs: moeperf_runs = 'zero'" in out
    assert "Fix: set a valid value" in out


def test_bad_env_value_names_variable(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOEPERF_STARTUP_TIMEOUT", "-3")
    out = _probe(pytester, "moeperf_startup_timeout")
    assert "environment variable MOEPERF_STARTUP_TIMEOUT: moeperf_startup_timeout = '-3'" in out


def test_bad_ini_value_names_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MOEPERF_GPU", raising=False)
    pytester.makeini("[pytest]\nmoeperf_gpu = maybe\n")
    out = _probe(pytester, "moeperf_gpu")
    assert "ini option moeperf_gpu" in out and "tox.ini" in out and "'maybe'" in out


def test_bad_url(pytester: pytest.Pytester) -> None:
    out = _probe(pytester, "moeperf_server_url", "--moeperf-server-url", "localhost:8000")
    assert "must start with http:// or https://" in out


def test_url_normalised(pytester: pytest.Pytester) -> None:
    out = _probe(pytester, "moeperf_server_url", "--moeperf-server-url", "http://h:1/v1/")
    assert "RESOLVED 'http://h:1' FROM command line" in out


def test_every_option_has_help_and_ini(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    out = result.stdout.str()
    for flag in (
        "--gpu",
        "--moeperf-refresh-baselines",
        "--moeperf-baseline-dir",
        "--moeperf-server-url",
        "--moeperf-quick",
        "--moeperf-report",
        "--moeperf-ci",
    ):
        assert flag in out
    for ini in ("moeperf_gpu (string)", "moeperf_baseline_dir (string)", "moeperf_quick (string)"):
        assert ini in out


GPU_TEST = """
import pytest

@pytest.mark.moeperf_gpu
def test_needs_gpu():
    pass

def test_plain():
    pass
"""


def test_gpu_tests_skipped_without_flag(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MOEPERF_GPU", raising=False)
    pytester.makepyfile(GPU_TEST)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs a GPU*run `pytest perf_tests --gpu`*"])


def test_gpu_tests_run_with_flag(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(GPU_TEST)
    pytester.runpytest("--gpu").assert_outcomes(passed=2)


def test_gpu_tests_run_with_env(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPERF_GPU", "1")
    pytester.makepyfile(GPU_TEST)
    pytester.runpytest().assert_outcomes(passed=2)
