"""``--moeperf-records``: every load's per-request records on disk, read back whole.

A GPU probe's summary says that it stopped; only its records say on which requests (2026-12-06:
an H100 chat-mix probe stopped on 3 TTFT misses whose send times nobody could read afterwards).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_pending import SPEC as PENDING_SPEC

from pytest_moeperf.load.records import RequestRecord, RunRecord, read_records, write_records

pytest_plugins = ["pytester"]


def _run() -> RunRecord:
    ok = RequestRecord(index=0, scheduled_s=0.0, send_s=0.0012345678, input_tokens=16,
                       max_tokens=4, first_token_s=0.2, end_s=0.5, output_tokens=4,
                       token_times_s=[0.2, 0.3, 0.4, 0.5])  # fmt: skip
    cut = RequestRecord(index=1, scheduled_s=0.1, send_s=0.1, input_tokens=16, max_tokens=100,
                        status="cut", first_token_s=0.4, end_s=None, output_tokens=3,
                        token_times_s=[0.4, 0.45, 0.5])  # fmt: skip
    failed = RequestRecord(index=1_000_000, scheduled_s=0.0, send_s=0.0, input_tokens=16,
                           max_tokens=4, status="http_error", error="503",
                           http_status=503)  # fmt: skip
    return RunRecord("poisson", 3.8, 1.0, 7, 12.5, [ok, cut, failed], 1.7e9, True, "3 missed")


def test_records_round_trip_to_the_microsecond(tmp_path: Path) -> None:
    path = tmp_path / "a" / "run1-01-3.8rps.jsonl.gz"
    write_records(_run(), path, rate=3.8, probe_number=1)
    head, back = read_records(path)
    assert head["rate"] == 3.8 and head["probe_number"] == 1 and head["abort_reason"] == "3 missed"
    want = _run()
    assert back.requests[0].send_s == pytest.approx(want.requests[0].send_s, abs=1e-6)
    assert back.requests[0].send_s != want.requests[0].send_s  # rounded: files stay small
    assert [r.status for r in back.requests] == ["ok", "cut", "http_error"]
    assert back.requests[1].tpot_s == pytest.approx(0.05)  # a cut request's TPOT survives
    assert back.requests[0].tpot_s == pytest.approx(0.1)  # a finished one's needs no token times
    assert back.requests[0].token_times_s == []  # not kept: files stay small
    assert back.requests[2].http_status == 503 and back.aborted_early
    assert (back.mode, back.target, back.seed) == ("poisson", 3.8, 7)


SPEC = PENDING_SPEC.replace("name: pending", "name: records")  # a quick external-server spec


def _project(pytester: pytest.Pytester, serve: Any) -> str:
    url, _ = serve(delay_s=0.001)
    (pytester.path / "perf_tests" / "specs").mkdir(parents=True)
    (pytester.path / "perf_tests" / "specs" / "records.yaml").write_text(SPEC)
    pytester.makepyfile(test_it="import pytest\n\n\n@pytest.mark.moeperf_spec('records.yaml')\n"
                        "def test_goodput(moeperf):\n    moeperf.run()\n")  # fmt: skip
    return str(url)


def test_a_perf_test_writes_every_loads_records(pytester: pytest.Pytester, serve: Any) -> None:
    url = _project(pytester, serve)
    results = pytester.path / "results.json"
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-server-url", url,
                                        "--moeperf-results", str(results),
                                        "--moeperf-records", "recs")  # fmt: skip
    out.assert_outcomes(passed=1)
    files = sorted((pytester.path / "recs").rglob("*.jsonl.gz"))
    (res,) = json.loads(results.read_text())["results"]
    probes = res["search_runs"][0]["probes"]
    assert len(files) >= len(probes) >= 1, files
    assert all(f.parent.parent.name == "test_it.py_test_goodput" for f in files), files
    head, run = read_records(files[0])
    assert head["run_number"] == 1 and head["rate"] == probes[0]["rate"]
    assert len(run.requests) == probes[0]["summary"]["n_requests"]


def test_without_the_option_nothing_is_written(pytester: pytest.Pytester, serve: Any) -> None:
    url = _project(pytester, serve)
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-server-url", url,
                                        "--moeperf-results", "r.json")  # fmt: skip
    out.assert_outcomes(passed=1)
    assert not list(pytester.path.rglob("*.jsonl.gz"))


def test_a_failed_write_mid_run_is_said_and_the_run_goes_on(
    pytester: pytest.Pytester, serve: Any
) -> None:
    """A disk that fills during a night's run: the records stop, the measurement does not."""
    url = _project(pytester, serve)
    pytester.makeconftest(
        "from pathlib import Path\n\n\ndef pytest_moeperf_probe_start(config, nodeid, "
        "run_number, probe_number, rate, server_pid):\n"
        "    Path('recs/test_it.py_test_goodput').write_text('a file where a folder goes')\n"
    )  # root ignores permission bits: a file in the folder's place fails for anyone
    results = pytester.path / "results.json"
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-server-url", url,
                                        "--moeperf-results", str(results),
                                        "--moeperf-records", "recs")  # fmt: skip
    (res,) = json.loads(results.read_text())["results"]
    out.stdout.fnmatch_lines(["*records of run 1 probe 1 not written to *recs/*: *; the "
                              "measurement goes on*"])  # fmt: skip
    out.assert_outcomes(passed=1)
    assert res["outcome"] == "passed" and res["search_runs"][0]["probes"]
