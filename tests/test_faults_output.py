"""Output files that cannot be written: the measurements survive, nothing claims "written".

"Unwritable" here is a path below a regular file: it fails for root too (the CI containers run
as root, where a chmod 000 folder is still writable).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_moeperf.report_cli import main as report_main

pytest_plugins = ["pytester"]

DATA = Path(__file__).parent / "data"

CONFTEST = """
import json
import pytest
from pytest_moeperf.plugin import SESSION_KEY
from pytest_moeperf.session import PerfResult

@pytest.fixture
def recorded_perf(request):
    '''Stands in for moeperf.run(): records the result a real run wrote (results_sample.json).'''
    data = dict(json.load(open("sample.json"))["results"][0])
    outcome, reasons = data.pop("outcome"), data.pop("reasons")
    del data["nodeid"]
    request.config.stash[SESSION_KEY].record(
        PerfResult.from_dict(request.node.nodeid, outcome, data, reasons=reasons))
"""

TEST = """
def test_measured(recorded_perf):
    pass
"""


def _project(pytester: pytest.Pytester) -> Path:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_it=TEST)
    (pytester.path / "sample.json").write_text((DATA / "results_sample.json").read_text())
    blocker = pytester.path / "blocker"
    blocker.write_text("a file, not a folder\n")
    return blocker


def _no_traceback(result: pytest.RunResult) -> str:
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out, out
    return out


def test_unwritable_results_path_saves_a_fallback_and_fails_the_session(
    pytester: pytest.Pytester,
) -> None:
    blocker = _project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--moeperf-results", "blocker/results.json")  # fmt: skip
    out = _no_traceback(result)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    target = blocker / "results.json"
    lines = [line for line in out.splitlines() if "results not written" in line]
    assert len(lines) == 1, out
    line = lines[0]
    assert line.startswith(f"warning: command line --moeperf-results: moeperf_results = "
                           f"'{target}': results not written (File exists: {blocker})")  # fmt: skip
    assert "Fix: give --moeperf-results / MOEPERF_RESULTS / moeperf_results a path" in line
    m = re.search(r"saved to (\S+) instead", line)
    assert m is not None, line
    fallback = Path(m.group(1))
    try:
        saved = json.loads(fallback.read_text())
        assert saved["results"][0]["nodeid"] == "test_it.py::test_measured"
        assert f"results written to {fallback}" in out
        assert f"results written to {target}" not in out
    finally:
        fallback.unlink()


def test_unwritable_results_path_from_the_ini_file_is_named(pytester: pytest.Pytester) -> None:
    _project(pytester)
    pytester.makeini("[pytest]\nmoeperf_results = blocker/r.json\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    out = _no_traceback(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    line = next(line for line in out.splitlines() if "results not written" in line)
    assert "ini option moeperf_results (" in line and "tox.ini" in line, line
    m = re.search(r"saved to (\S+) instead", line)
    assert m is not None, line
    Path(m.group(1)).unlink()


def test_unwritable_report_path_is_never_claimed_written(pytester: pytest.Pytester) -> None:
    blocker = _project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--moeperf-report", "blocker/report")  # fmt: skip
    out = _no_traceback(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "report written" not in out, out
    lines = [line for line in out.splitlines() if "report not written" in line]
    assert lines == [f"warning: command line --moeperf-report: moeperf_report = "
                     f"'{blocker / 'report'}': report not written (File exists: {blocker}). "
                     "Fix: give --moeperf-report / MOEPERF_REPORT / moeperf_report a path in a "
                     "writable folder"], out  # fmt: skip
    # the results file, written first, is intact
    results = pytester.path / "moeperf-results" / "results.json"
    assert json.loads(results.read_text())["results"][0]["outcome"] == "passed"
    assert f"results written to {results}" in out


def test_written_report_is_still_claimed(pytester: pytest.Pytester) -> None:
    _project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--moeperf-report", "out/report")  # fmt: skip
    out = _no_traceback(result)
    assert result.ret == 0, out
    assert f"report written to {pytester.path / 'out' / 'report.html'} and .md" in out
    assert (pytester.path / "out" / "report.html").is_file()


@pytest.mark.parametrize(
    ("out", "needle"),
    [
        ("blocker/report", "report not written (File exists: {tmp}/blocker)"),
        ("/proc/no-such-folder/report", "report not written (No such file or directory: "
         "/proc/no-such-folder)"),
        ("", "names no file"),
        (".", "names no file"),
    ],
)  # fmt: skip
def test_report_cli_unwritable_out_is_one_error_line(
    out: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    (tmp_path / "blocker").write_text("a file\n")
    monkeypatch.chdir(tmp_path)
    out_arg = out.replace("blocker", str(tmp_path / "blocker"))
    code = report_main([str(DATA / "results_sample.json"), "--title", "T", "--out", out_arg])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""  # no "report written" line
    (line,) = captured.err.splitlines()
    assert line.startswith(
        f"moeperf report: error: command line: --out = {out_arg!r}"
    ) or line.startswith(f"moeperf report: error: --out = {out_arg!r}"), line
    assert needle.format(tmp=tmp_path) in line and "Fix: give" in line, line
