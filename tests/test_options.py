"""Options resolve marker > CLI > env > ini > default, and every bad value names its source."""

from __future__ import annotations

import re

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
    assert "must start with http://" in out


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://lb.example/v1", "https is not supported (the load client does not speak TLS)"),
        ("http://h:99999", "is not a valid URL"),
        ("http://h:port", "is not a valid URL"),
        ("http://:8000", "has no host"),
        ("http://h:0", "port 0 is not a server's port"),
        ("http://h:8000/v1?x=1", "must not have a query, fragment or user name"),
        ("http://u@h:8000", "must not have a query, fragment or user name"),
    ],
)
def test_parse_url_refuses(url: str, message: str) -> None:
    from pytest_moeperf import options

    with pytest.raises(ValueError, match=re.escape(message)):
        options.parse_url(url)


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


# -- the parsers, one value at a time (the resolver's error text comes from them)
@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("true", True), (" YES ", True), ("on", True),
     ("0", False), ("False", False), ("no", False), ("off", False), ("", False)],
)  # fmt: skip
def test_parse_bool_accepts_the_usual_spellings(text: str, expected: bool) -> None:
    from pytest_moeperf.options import parse_bool

    assert parse_bool(text) is expected


@pytest.mark.parametrize("text", ["2", "yep", "truthy", "-1"])
def test_parse_bool_rejects_anything_else_with_the_choices(text: str) -> None:
    from pytest_moeperf.options import parse_bool

    with pytest.raises(ValueError, match="expected one of 1/0, true/false, yes/no, on/off"):
        parse_bool(text)


def test_parse_positive_int() -> None:
    from pytest_moeperf.options import parse_positive_int

    assert parse_positive_int("3") == 3
    for bad in ("0", "-2"):
        with pytest.raises(ValueError, match=">= 1"):
            parse_positive_int(bad)
    with pytest.raises(ValueError):  # int()'s own message: names the text
        parse_positive_int("2.5")


@pytest.mark.parametrize("text", ["0", "-1.5", "nan", "inf", "-inf"])
def test_parse_positive_float_rejects_zero_negative_and_non_finite(text: str) -> None:
    """A NaN timeout would compare False to everything and never fire: rejected up front."""
    from pytest_moeperf.options import parse_positive_float

    with pytest.raises(ValueError, match="finite number > 0"):
        parse_positive_float(text)


def test_parse_positive_float_accepts_plain_and_exponent_forms() -> None:
    from pytest_moeperf.options import parse_positive_float

    assert parse_positive_float("4.8") == 4.8
    assert parse_positive_float("1e-3") == 0.001


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1,4,16", "1,4,16"), (" 1 , 04 ,64", "1,4,64"), ("8", "8")],
)
def test_parse_levels_normalises(text: str, expected: str) -> None:
    from pytest_moeperf.options import parse_levels

    assert parse_levels(text) == expected


@pytest.mark.parametrize("text", ["", "0", "1,,4", "1,-4", "1,4.5", "a,b"])
def test_parse_levels_rejects_with_an_example(text: str) -> None:
    from pytest_moeperf.options import parse_levels

    with pytest.raises(ValueError, match=r"e\.g\. 1,4,16,64"):
        parse_levels(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://h:8000", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h:8000/v1", "http://h:8000"),
        (" http://lb.example/v1/ ", "http://lb.example"),
    ],
)
def test_parse_url_takes_the_server_root(text: str, expected: str) -> None:
    """Users paste the OpenAI base URL (with /v1); the client adds /v1 itself."""
    from pytest_moeperf.options import parse_url

    assert parse_url(text) == expected


def test_every_setting_has_a_distinct_flag_env_and_ini() -> None:
    from pytest_moeperf.options import SETTINGS

    for attr in ("name", "flag"):
        values = [getattr(s, attr) for s in SETTINGS]
        assert len(values) == len(set(values)), attr
    assert all(s.env == s.name.upper() and s.ini == s.name for s in SETTINGS)
    assert all(s.flag == "--gpu" or s.flag.startswith("--moeperf-") for s in SETTINGS)
    # a flag's default is False, so "not given" and "given" are the only two states
    assert all(not s.is_flag or s.default is False for s in SETTINGS)


RESOLVE_PROBE = """
import pytest
from pytest_moeperf import options

def test_probe(request):
    r = options.resolve(request.config, "moeperf_runs", marker_value={marker!r},
                        marker_name="moeperf_spec")
    print("RESOLVED", repr(r.value), "FROM", r.source)
    p = options.resolve_path(request.config, "moeperf_baseline_dir")
    print("PATH", p, "ROOT", request.config.rootpath)
"""


def test_marker_beats_the_command_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(RESOLVE_PROBE.format(marker=5))
    out = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--moeperf-runs", "8")
    out.stdout.fnmatch_lines(["*RESOLVED 5 FROM marker @pytest.mark.moeperf_spec*"])


def test_a_bad_marker_value_names_the_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(RESOLVE_PROBE.format(marker="0"))
    out = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    out.stdout.fnmatch_lines(["*marker @pytest.mark.moeperf_spec: moeperf_runs = '0'*"])


def test_relative_paths_are_taken_from_the_rootdir(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from a sub-folder: the baseline folder is still <rootdir>/baselines, not ./baselines."""
    pytester.makeini("[pytest]\n")
    sub = pytester.mkdir("sub")
    (sub / "test_p.py").write_text(RESOLVE_PROBE.format(marker=None))
    monkeypatch.chdir(sub)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "test_p.py")
    line = next(x for x in result.outlines if x.startswith("PATH "))
    _, path, _, root = line.split()
    assert path == f"{root}/baselines" and root == str(pytester.path)
