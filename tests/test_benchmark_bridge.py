"""pytest-benchmark beside moeperf: no clashing options, separate storage, and a real bridge.

The bridge file must be read by pytest-benchmark's own ``compare`` CLI (run here as a
subprocess), and its stats must be the ones pytest-benchmark itself computes from the rounds.
The measurement is stood in for by a recorded session payload (tests/data/results_sample.json):
what is under test is the session -> file path, not vLLM.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf import options
from pytest_moeperf.report.benchmark_json import stats, to_benchmark_json

pytest_plugins = ["pytester"]
pytest.importorskip("pytest_benchmark", reason="needs pytest-benchmark (the dev extra has it)")

DATA = Path(__file__).parent / "data"
SAMPLE = json.loads((DATA / "results_sample.json").read_text())
AB = json.loads((DATA / "results_ab_h200.json").read_text())


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `pytest -n`, pytest-benchmark in the inner sessions would see the worker's variable
    and disable itself ("benchmarks are automatically disabled because xdist is active")."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


def _compare_cli(*args: str, cwd: Path) -> str:
    """Run pytest-benchmark's own CLI (``python -m pytest_benchmark`` = ``pytest-benchmark``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "compare", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 9, 15])
def test_stats_are_pytest_benchmarks_own(n: int) -> None:
    from pytest_benchmark.stats import Stats

    rng = random.Random(n)
    data = [rng.lognormvariate(0, 0.3) for _ in range(n)]
    if n > 4:
        data[0] *= 5  # an outlier, so the IQR and stddev outlier counts are exercised
    theirs = Stats()
    for x in data:
        theirs.update(x)
    expected = theirs.as_dict()
    ours = stats(data)
    assert set(ours) == set(expected)
    for key, value in expected.items():
        if isinstance(value, str):  # "outliers": "stddev;iqr" counts
            assert ours[key] == value
        else:
            assert ours[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_payload_maps_metrics_to_benchmarks() -> None:
    out = to_benchmark_json(SAMPLE, source="results_sample.json")
    assert set(out) >= {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    by_name = {b["name"]: b for b in out["benchmarks"]}
    # only measured metrics of complete results: 4 of 7 (energy and MBU were not measured)
    assert sorted(by_name) == [
        f"test_embedded_goodput::moeperf.{m}"
        for m in ("slo_goodput_tok_s", "slo_rate_rps", "tpot_p99_ms", "ttft_p99_ms")
    ]
    goodput = by_name["test_embedded_goodput::moeperf.slo_goodput_tok_s"]
    assert goodput["stats"]["data"] == [95.1467, 95.8787, 95.1747]
    assert goodput["stats"]["rounds"] == 3 and goodput["stats"]["iterations"] == 1
    assert goodput["extra_info"]["better"] == "higher"
    assert goodput["extra_info"]["verdict"] == "unchanged"
    assert "higher is better" in goodput["group"]
    ttft = by_name["test_embedded_goodput::moeperf.ttft_p99_ms"]
    # pytest-benchmark reads seconds: latencies are converted, the original kept in extra_info
    assert ttft["stats"]["data"] == pytest.approx([0.6166687, 0.6040407, 0.6152907])
    assert ttft["extra_info"]["center"] == 612.0 and ttft["extra_info"]["unit"] == "ms"
    # a partial result is left out, with the reason
    (left,) = out["moeperf"]["left_out"]
    assert left["outcome"] == "partial" and "server died" in left["why"]
    assert out["commit_info"]["id"] == "3f9c2ab"
    assert out["machine_info"]["node"] == "ci-runner-07"
    # never the bare nodeid: it would pair with the test's own benchmark in `compare --between`
    assert all(b["fullname"] != "perf_tests/test_embedded.py::test_embedded_goodput"
               for b in out["benchmarks"])  # fmt: skip


def test_compare_cli_lists_and_compares_the_files(tmp_path: Path) -> None:
    (tmp_path / "night1.json").write_text(json.dumps(to_benchmark_json(SAMPLE)))
    (tmp_path / "night2.json").write_text(json.dumps(to_benchmark_json(AB)))
    listing = _compare_cli("night1.json", "night2.json", "--columns", "min,mean,rounds",
                           "--time-unit", "s", cwd=tmp_path)  # fmt: skip
    assert "benchmark 'moeperf: slo_goodput_tok_s (tok/s, not a time; higher is better)'" in listing
    assert re.search(r"test_embedded_goodput::moeperf\.slo_goodput_tok_s .*95\.4000", listing)
    assert re.search(r"test_moe_config_ab\[tuned-h200\]::moeperf\.mbu .*0\.5330", listing)
    assert re.search(r"test_embedded_goodput::moeperf\.ttft_p99_ms .*0\.6120", listing)
    # the same test in two files, side by side with the change
    shutil.copy(tmp_path / "night1.json", tmp_path / "night1b.json")
    between = _compare_cli("night1.json", "night1b.json", "--between", "mean", "-k", "goodput",
                           cwd=tmp_path)  # fmt: skip
    assert re.search(r"test_embedded_goodput::moeperf\.slo_goodput_tok_s\s+95\.4000\s+95\.4000\s+"
                     r"\+0\.0%", between), between  # fmt: skip


# -- both plugins in one session ------------------------------------------------------------------

CONFTEST = """
import json
import pytest
from pytest_moeperf.plugin import SESSION_KEY
from pytest_moeperf.session import PerfResult

@pytest.fixture
def recorded_perf(request):
    '''Stands in for moeperf.run(): records the result a real run wrote (results_sample.json).'''
    def run():
        data = dict(json.load(open("sample.json"))["results"][0])
        outcome, reasons = data.pop("outcome"), data.pop("reasons")
        del data["nodeid"]
        result = PerfResult.from_dict(request.node.nodeid, outcome, data, reasons=reasons)
        request.config.stash[SESSION_KEY].record(result)
        return result
    return run
"""

BOTH = """
import pytest

def tokenize(text):
    return text.split()

@pytest.mark.moeperf_slo(ttft_p99_ms=2000, tpot_p99_ms=200)
def test_both(benchmark, recorded_perf):
    assert benchmark(tokenize, "a b c") == ["a", "b", "c"]
    recorded_perf()

def test_only_theirs(benchmark):
    benchmark(tokenize, "x y")
"""


FAST = ("--benchmark-max-time=0.001", "--benchmark-min-rounds=1")  # their timing is not tested


def _project(pytester: pytest.Pytester, test_source: str) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_source)
    (pytester.path / "sample.json").write_text(json.dumps(SAMPLE))


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_help_with_both_plugins_has_no_clash(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stderr.str()
    text = result.stdout.str()
    theirs = set(re.findall(r"--benchmark-[a-z-]+", text))
    assert "--benchmark-json" in theirs and "--benchmark-autosave" in theirs
    ours = {s.flag for s in options.SETTINGS}
    for flag in ours:
        assert flag in text, f"{flag} missing from pytest --help"
    assert not ours & theirs
    # every moeperf flag, ini key and env variable is namespaced; --gpu is the one short flag
    assert all(f.startswith("--moeperf-") for f in ours - {"--gpu"})
    assert all(s.ini.startswith("moeperf_") and s.env.startswith("MOEPERF_")
               for s in options.SETTINGS)  # fmt: skip
    markers = pytester.runpytest("--markers", "-p", "no:cacheprovider").stdout.str()
    assert "@pytest.mark.benchmark" in markers and "@pytest.mark.moeperf_spec" in markers


def test_session_with_both_plugins_keeps_storage_apart(pytester: pytest.Pytester) -> None:
    _project(pytester, BOTH)
    result = pytester.runpytest_subprocess("--benchmark-autosave", *FAST, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    ours = pytester.path / "moeperf-results" / "pytest-benchmark.json"
    assert f"pytest-benchmark JSON written to {ours}" in out
    # storage apart: theirs under .benchmarks/, ours under moeperf-results/, nothing crossed
    (theirs,) = _files(pytester.path / ".benchmarks")
    assert Path(theirs).name.startswith("0001_")
    theirs = f".benchmarks/{theirs}"
    assert _files(pytester.path / "moeperf-results") == ["pytest-benchmark.json", "results.json"]
    assert not (pytester.path / "baselines").exists()
    # their record of the test carries our centers (named like the junitxml properties)
    saved: dict[str, Any] = json.loads((pytester.path / theirs).read_text())
    mine = next(b for b in saved["benchmarks"] if b["name"] == "test_both")
    assert mine["extra_info"]["moeperf.slo_goodput_tok_s"] == 95.4
    assert mine["extra_info"]["moeperf.outcome"] == "passed"
    other = next(b for b in saved["benchmarks"] if b["name"] == "test_only_theirs")
    assert other["extra_info"] == {}
    # pytest-benchmark's CLI lists theirs and ours together
    listing = _compare_cli(theirs, "moeperf-results/pytest-benchmark.json", "--columns", "mean",
                           cwd=pytester.path)  # fmt: skip
    assert "test_both (" in listing and "test_only_theirs (" in listing
    assert "test_both::moeperf.slo_goodput_tok_s (" in listing


def test_option_writes_the_file_without_the_fixture(pytester: pytest.Pytester) -> None:
    _project(pytester, "def test_perf(recorded_perf):\n    recorded_perf()\n")
    result = pytester.runpytest("--moeperf-benchmark-json", "out/bench.json",
                                "-p", "no:cacheprovider")  # fmt: skip
    result.assert_outcomes(passed=1)
    data = json.loads((pytester.path / "out" / "bench.json").read_text())
    prefix = "test_option_writes_the_file_without_the_fixture.py::test_perf::moeperf."
    assert [b["fullname"] for b in data["benchmarks"]] == [
        prefix + m for m in ("slo_goodput_tok_s", "slo_rate_rps", "tpot_p99_ms", "ttft_p99_ms")
    ]
    assert _files(pytester.path / ".benchmarks") == []  # pytest-benchmark's, left empty


def test_no_fixture_no_option_writes_no_benchmark_file(pytester: pytest.Pytester) -> None:
    _project(pytester, "def test_perf(recorded_perf):\n    recorded_perf()\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert _files(pytester.path / "moeperf-results") == ["results.json"]
    assert "pytest-benchmark JSON" not in result.stdout.str()


def test_unwritable_path_is_one_warning_naming_the_option(pytester: pytest.Pytester) -> None:
    _project(pytester, "def test_perf(recorded_perf):\n    recorded_perf()\n")
    (pytester.path / "taken").mkdir()
    result = pytester.runpytest("--moeperf-benchmark-json", "taken",
                                "-p", "no:cacheprovider")  # fmt: skip
    result.assert_outcomes(passed=1)  # the perf result itself is fine; the results file is kept
    result.stdout.fnmatch_lines(["warning: command line --moeperf-benchmark-json: "
                                 "moeperf_benchmark_json = '*taken': pytest-benchmark JSON not "
                                 "written (*). Fix: give --moeperf-benchmark-json *"])  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # a file asked for is missing
    assert (pytester.path / "moeperf-results" / "results.json").is_file()


def test_option_under_xdist_is_written_once_by_the_controller(pytester: pytest.Pytester) -> None:
    """Workers measure and relay; the controller writes the file (pytest-benchmark itself is
    disabled under xdist, so the option is the way there)."""
    _project(pytester, "def test_a(recorded_perf):\n    recorded_perf()\n\n"
                       "def test_b(recorded_perf):\n    recorded_perf()\n")  # fmt: skip
    result = pytester.runpytest_subprocess("-n", "2", "--moeperf-benchmark-json", "b.json",
                                           "-p", "no:cacheprovider")  # fmt: skip
    result.assert_outcomes(passed=2)
    data = json.loads((pytester.path / "b.json").read_text())
    tests = sorted({b["extra_info"]["nodeid"].rsplit("::", 1)[-1] for b in data["benchmarks"]})
    assert tests == ["test_a", "test_b"] and len(data["benchmarks"]) == 8
    assert result.stdout.str().count("pytest-benchmark JSON written to") == 1
