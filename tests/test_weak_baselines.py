"""Baselines that cannot gate say so, and never replace one that can.

A search that meets the SLO at ``search.rate_max`` reports floors, not a boundary. Seen in a
hostile-input check (2026-12-06): a spec whose ``rate_max`` the server easily met printed "SLO
boundary 40 req/s (met 40, missed not probed)", wrote it as a baseline without a word, and every
later run read "unchanged", whatever the server's speed. And a refresh with fewer runs than a
verdict needs replaced a 3-run baseline, after which every verdict read "too few runs".
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_pending import OWN_SPEC as PENDING_SPEC

pytest_plugins = ["pytester"]

#: test_pending's own spec: a 10 req/s cap the fake server meets beside the other xdist worker's
#: vLLM server, and SLOs so loose that the machine's stalls never refuse the writes tested here.
SPEC = PENDING_SPEC.replace("name: pending", "name: capped").replace("runs: 1", "runs: 3")


def test_met_at_rate_max_says_floor_and_never_reads_unchanged(
    pytester: pytest.Pytester, serve: Any
) -> None:
    url, _ = serve(delay_s=0.001)  # answers at once: 10 req/s (the spec's rate_max) is met
    (pytester.path / "perf_tests" / "specs").mkdir(parents=True)
    (pytester.path / "perf_tests" / "specs" / "capped.yaml").write_text(SPEC)
    pytester.makepyfile(test_it="import pytest\n\n\n@pytest.mark.moeperf_spec('capped.yaml')\n"
                        "def test_goodput(moeperf):\n    moeperf.run()\n")  # fmt: skip
    # the session's calibration (the server is on loopback) moves under a loaded machine:
    # compare regardless, this test is not about which machine
    args = ("-p", "no:cacheprovider", "--moeperf-server-url", url, "--moeperf-results", "r.json",
            "--moeperf-allow-other-hardware")  # fmt: skip
    first = pytester.runpytest_subprocess(*args, "--moeperf-refresh-baselines")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines([
        "*run 1/3: SLO met at search.rate_max 10 req/s, SLO goodput * tok/s: both are floors, "
        "the boundary is higher (raise search.rate_max to find it)*",
        "*this baseline's boundary is a floor: every run met the SLO at search.rate_max*",
    ])  # fmt: skip
    assert "missed not probed" not in first.stdout.str()

    second = pytester.runpytest_subprocess(*args)
    second.assert_outcomes(passed=1)
    (res,) = json.loads((pytester.path / "r.json").read_text())["results"]
    verdicts = {v["metric"]: v for v in res["verdicts"]}
    for name in ("slo_goodput_tok_s", "slo_rate_rps"):
        assert verdicts[name]["outcome"] == "inconclusive", verdicts[name]
        assert "met the SLO at search.rate_max (10 req/s)" in verdicts[name]["reason"]


def test_a_refresh_with_too_few_runs_never_replaces_a_baseline_that_had_enough(
    pytester: pytest.Pytester, serve: Any
) -> None:
    """A 1-run refresh over a 3-run baseline: every later verdict would read "too few runs",
    so the gate would stop gating without a word. Refused; a first 1-run baseline warns."""
    url, _ = serve(delay_s=0.001)
    (pytester.path / "perf_tests" / "specs").mkdir(parents=True)
    (pytester.path / "perf_tests" / "specs" / "capped.yaml").write_text(SPEC)
    pytester.makepyfile(test_it="import pytest\n\n\n@pytest.mark.moeperf_spec('capped.yaml')\n"
                        "def test_goodput(moeperf):\n    moeperf.run()\n")  # fmt: skip
    # the session's calibration moves under a loaded machine: compare regardless
    args = ("-p", "no:cacheprovider", "--moeperf-server-url", url, "--moeperf-refresh-baselines",
            "--moeperf-allow-other-hardware")  # fmt: skip
    first = pytester.runpytest_subprocess(*args, "--moeperf-runs", "1")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["*this baseline has 1 run, fewer than the 3 a verdict needs: "
                                "every comparison with it reads inconclusive*"])  # fmt: skip
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)  # 3 runs replace it
    (path,) = (pytester.path / "baselines").glob("*/*.json")
    three = path.read_bytes()
    assert len(json.loads(three)["metrics"]["slo_goodput_tok_s"]) == 3
    again = pytester.runpytest_subprocess(*args, "--moeperf-runs", "1")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["*baseline not-written: this run has 1 run, fewer than the 3 a "
                                "verdict needs, so it does not replace the baseline it was "
                                "compared with (*, 3 runs)*"])  # fmt: skip
    assert path.read_bytes() == three
