"""Gates after measurement: baseline verdicts, other-hardware refusal, accuracy gate, refresh.

The numbers are chosen so every verdict is certain: 10 runs a side with +-0.4 % noise, and a
30 % shift where a change is meant (the verdict's minimum effect is 1-2 %).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from baseline_helpers import PROV, make_key

from pytest_moeperf import gates
from pytest_moeperf.accuracy import AccuracyResult, QuestionOutcome
from pytest_moeperf.baseline import Baseline, BaselineKey, BaselineStore
from pytest_moeperf.markers import AccuracyGate

TEST_ID = "tests/perf/test_moe.py::test_goodput[qwen-moe]"
TARGET = "tests/perf/test_moe.py"
NOISE = [1.0, 1.004, 0.997, 1.002, 0.999, 1.001, 0.998, 1.003, 0.996, 1.0]
Runs = dict[str, list[float]]
GATE = AccuracyGate("gsm8k", 5, 1.0, None, "marker @pytest.mark.moeperf_accuracy on t.py:3")


def runs(goodput: float = 1000.0, ttft: float = 120.0, power: float = 500.0) -> Runs:
    """Per-run values of three metrics (gate higher-better, gate lower-better, informational)."""
    return {
        "slo_goodput_tok_s": [goodput * n for n in NOISE],
        "ttft_p99_ms": [ttft * n for n in reversed(NOISE)],
        "power_w": [power * n for n in NOISE],
    }


def accuracy(correct: int, n: int = 100) -> dict[str, Any]:
    """A gsm8k result whose first ``correct`` questions are right (so drops pair up)."""
    outcomes = [QuestionOutcome(i, i < correct, i < correct, "1", "1", "1") for i in range(n)]
    result = AccuracyResult.from_outcomes(outcomes, task="gsm8k", shots=5, limit=None, seed=1234,
                                          model="m", data_digest="d0", duration_s=1.0)  # fmt: skip
    return result.to_dict()


def store_baseline(store: BaselineStore, key: BaselineKey | None = None,
                   acc: dict[str, Any] | None = None) -> Path:  # fmt: skip
    base = Baseline(TEST_ID, key or make_key(), runs(), [{"run": i} for i in range(10)], PROV,
                    accuracy=acc)  # fmt: skip
    return store.write(base, complete=True)


def compare(
    store: BaselineStore,
    candidate: Runs,
    *,
    key: BaselineKey | None = None,
    ci_mode: bool = False,
    allow: bool = False,
    **kw: Any,
) -> gates.BaselineOutcome:
    return gates.compare(store, TEST_ID, key or make_key(), candidate, allow_other_hardware=allow,
                         ci_mode=ci_mode, target=TARGET, **kw)  # fmt: skip


# -- compared with the baseline of the same setup ----------------------------------------------
def test_same_numbers_are_unchanged_and_pass(tmp_path: Path) -> None:
    """An A/A comparison: every metric judged, nothing fails or warns."""
    store = BaselineStore(tmp_path)
    path = store_baseline(store)
    out = compare(store, runs())
    assert (out.status, out.path, out.failures, out.warnings) == ("compared", str(path), [], [])
    assert {v.metric: v.outcome for v in out.verdicts} == {
        "slo_goodput_tok_s": "unchanged",
        "ttft_p99_ms": "unchanged",
        "power_w": "unchanged",
    }
    assert out.baseline is not None and out.baseline.metrics == runs()


def test_a_candidate_with_prefix_cache_hits_unlike_the_baseline_says_so(tmp_path: Path) -> None:
    """Same figures, but the candidate's boundary probes hit the prefix cache (a spec with the
    cache on and repeated prompts): the comparison passes and says the work was not the same."""
    store = BaselineStore(tmp_path)
    base_runs = [
        {
            "boundary_rate": 10.0,
            "probes": [
                {
                    "rate": 10.0,
                    "met": True,
                    "summary": {
                        "server": {
                            "available": True,
                            "prefix_cache_hit_rate": 0.0,
                            "preemptions": 0,
                        }
                    },
                }
            ],
        }
    ]
    base = Baseline(TEST_ID, make_key(), runs(), base_runs * 10, PROV)
    store.write(base, complete=True)
    hot = json.loads(
        json.dumps(base_runs).replace(
            '"prefix_cache_hit_rate": 0.0', '"prefix_cache_hit_rate": 0.9'
        )
    )
    out = compare(store, runs(), candidate_runs=hot * 10)
    assert out.failures == []
    (note,) = out.warnings
    assert "prefix-cache hit rate at the boundary differs: baseline 0 %, this run 90 %" in note
    assert compare(store, runs(), candidate_runs=base_runs * 10).warnings == []


def test_a_30_percent_drop_fails_naming_the_metric(tmp_path: Path) -> None:
    """Goodput down 30 % and TTFT up 30 %: both regressions become failures, each naming its
    metric; the informational power metric is judged but never fails."""
    store = BaselineStore(tmp_path)
    store_baseline(store)
    out = compare(store, runs(goodput=700.0, ttft=156.0, power=650.0))
    outcomes = {v.metric: v.outcome for v in out.verdicts}
    assert outcomes == {"slo_goodput_tok_s": "regressed", "ttft_p99_ms": "regressed",
                        "power_w": "regressed"}  # fmt: skip
    assert len(out.failures) == 2, out.failures
    assert out.failures[0].startswith("slo_goodput_tok_s regressed vs baseline: -30.00 % (worse)")
    assert out.failures[1].startswith("ttft_p99_ms regressed vs baseline: +30.00 % (worse)")
    assert not any("power_w" in f for f in out.failures)
    assert out.warnings == []


def test_a_drop_while_other_processes_took_the_cpus_is_inconclusive_with_both_figures(
    tmp_path: Path,
) -> None:
    """The same -30 % while other processes took 40 % of the CPUs over this run's (2 % over the
    baseline's): the machine explains it, so it warns and does not fail; on an equally quiet
    machine the same drop fails."""
    store = BaselineStore(tmp_path)
    quiet = [{"machine": {"steal": 0.0, "others": 0.02, "seconds": 40.0}}] * 10
    busy = [{"machine": {"steal": 0.0, "others": 0.40, "seconds": 40.0}}] * 10
    store.write(Baseline(TEST_ID, make_key(), runs(), quiet, PROV), complete=True)
    slow = runs(goodput=700.0, ttft=156.0, power=650.0)
    out = compare(store, slow, candidate_runs=busy)
    assert out.failures == []
    assert {v.metric: v.outcome for v in out.verdicts}["slo_goodput_tok_s"] == "inconclusive"
    assert any(w.startswith("the machine left this run 39 % less of its CPUs") and
               "other processes 40 %" in w and "other processes 2 %" in w
               for w in out.warnings), out.warnings  # fmt: skip
    assert len(compare(store, slow, candidate_runs=quiet).failures) == 2


def test_a_30_percent_gain_is_improved_and_passes(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store_baseline(store)
    out = compare(store, runs(goodput=1300.0, ttft=84.0))
    outcomes = {v.metric: v.outcome for v in out.verdicts}
    assert outcomes["slo_goodput_tok_s"] == outcomes["ttft_p99_ms"] == "improved"
    assert (out.failures, out.warnings) == ([], [])


def test_inconclusive_gating_metric_warns_with_advice(tmp_path: Path) -> None:
    """Two candidate runs cannot be tested: a warning saying how many more runs to make,
    not a silent pass and not a failure."""
    store = BaselineStore(tmp_path)
    store_baseline(store)
    out = compare(store, {"slo_goodput_tok_s": [700.0, 701.0]})
    (v,) = out.verdicts
    assert v.outcome == "inconclusive"
    assert out.failures == []
    assert out.warnings == [
        "slo_goodput_tok_s inconclusive: too few runs to test (10 baseline, 2 candidate; "
        "need >= 3 each); run 0 more baseline and 1 more candidate runs (defaults: 15 and 10)"
    ]


def test_metrics_missing_on_either_side_are_not_judged(tmp_path: Path) -> None:
    """A metric the baseline lacks, or that no candidate run measured, is skipped, not a crash."""
    store = BaselineStore(tmp_path)
    store_baseline(store)
    out = compare(store, {"slo_goodput_tok_s": [], "tpot_p99_ms": [10.0] * 10,
                          "ttft_p99_ms": runs()["ttft_p99_ms"]})  # fmt: skip
    assert [v.metric for v in out.verdicts] == ["ttft_p99_ms"]


# -- a baseline only for another setup ---------------------------------------------------------
@pytest.mark.parametrize("ci_mode", [False, True])
def test_other_hardware_is_not_compared(tmp_path: Path, ci_mode: bool) -> None:
    """An A100 baseline says nothing about an H200: a warning (a CI failure) that names the
    differing fields, the refresh command and the opt-in flag."""
    store = BaselineStore(tmp_path)
    other = store_baseline(store, make_key(gpu_name="NVIDIA A100", driver="535.1"))
    out = compare(store, runs(goodput=700.0), ci_mode=ci_mode)
    assert (out.status, out.path, out.verdicts) == ("other-hardware", str(other), [])
    (msg,) = out.failures if ci_mode else out.warnings
    assert (out.warnings if ci_mode else out.failures) == []
    assert msg == (
        f"baseline for {TEST_ID} exists only for another setup (hardware: gpu_name "
        "'NVIDIA H200' vs 'NVIDIA A100', driver '570.86' vs '535.1'); not compared. Record one "
        f"here with `pytest {TARGET} --moeperf-refresh-baselines --moeperf-reason '...'` or pass "
        "--moeperf-allow-other-hardware"
    )


def test_software_only_difference_names_the_software_fields(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store_baseline(store, make_key(vllm_version="0.8.5", moe_config_hash="000"))
    out = compare(store, runs())
    assert out.status == "other-hardware"
    (msg,) = out.warnings
    assert "(software differs: vllm_version, moe_config_hash); not compared" in msg
    assert "hardware:" not in msg


def test_allow_other_hardware_compares_against_it(tmp_path: Path) -> None:
    """With --moeperf-allow-other-hardware the other setup's file is the baseline: a 30 % drop
    against it fails, and the outcome points at that file."""
    store = BaselineStore(tmp_path)
    other = store_baseline(store, make_key(gpu_name="NVIDIA A100"))
    out = compare(store, runs(goodput=700.0), allow=True, ci_mode=True)
    assert (out.status, out.path) == ("compared", str(other))
    assert out.baseline is not None and out.baseline.key.gpu_name == "NVIDIA A100"
    assert [f.split(":")[0] for f in out.failures] == ["slo_goodput_tok_s regressed vs baseline"]


# -- unreadable baselines ----------------------------------------------------------------------
def test_truncated_baseline_is_unreadable_with_one_failure_naming_the_file(
    tmp_path: Path,
) -> None:
    store = BaselineStore(tmp_path)
    path = store_baseline(store)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    out = compare(store, runs())
    assert (out.status, out.path, out.verdicts, out.warnings) == (
        "unreadable", str(path), [], [])  # fmt: skip
    (msg,) = out.failures
    assert msg.startswith(f"{path}: JSON = 'line ")
    assert "the file is corrupt or truncated" in msg


def test_truncated_baseline_of_another_setup_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    """No baseline for this key, and the one of another setup is truncated: the outcome says
    so (naming that file) instead of raising out of compare and losing the run's results."""
    store = BaselineStore(tmp_path)
    other = store_baseline(store, make_key(gpu_name="NVIDIA A100"))
    other.write_text(other.read_text()[:40])
    for allow in (False, True):
        out = compare(store, runs(), allow=allow)
        assert out.status == "unreadable"
        (msg,) = out.failures
        assert msg.startswith(f"{other}: JSON = ")


# -- the accuracy gate -------------------------------------------------------------------------
def test_baseline_without_accuracy_warns_and_does_not_gate(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store_baseline(store, acc=None)
    out = compare(store, runs(), accuracy=accuracy(10), accuracy_gate=GATE)
    assert out.accuracy is None
    assert out.failures == []
    assert out.warnings == [f"baseline {path} has no accuracy results; accuracy not gated"]


def test_accuracy_drop_beyond_max_drop_fails(tmp_path: Path) -> None:
    """90 % -> 60 % on the same 100 questions: 30 points lost, far beyond max_drop=1."""
    store = BaselineStore(tmp_path)
    store_baseline(store, acc=accuracy(90))
    out = compare(store, runs(), accuracy=accuracy(60), accuracy_gate=GATE)
    (msg,) = out.failures
    assert msg.startswith(f"accuracy gate ({GATE.source}): accuracy dropped 30.0 points, more "
                          "than the 1 allowed")  # fmt: skip
    assert out.accuracy is not None and out.accuracy["passed"] is False
    assert out.accuracy["discordant"] == [30, 0]


def test_accuracy_within_tolerance_passes(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store_baseline(store, acc=accuracy(90))
    out = compare(store, runs(), accuracy=accuracy(90), accuracy_gate=GATE)
    assert (out.failures, out.warnings) == ([], [])
    assert out.accuracy is not None and out.accuracy["passed"] is True


def test_accuracy_is_not_gated_without_a_gate(tmp_path: Path) -> None:
    """No @moeperf_accuracy marker: a measured drop is not judged (the marker opts in)."""
    store = BaselineStore(tmp_path)
    store_baseline(store, acc=accuracy(90))
    out = compare(store, runs(), accuracy=accuracy(10), accuracy_gate=None)
    assert (out.accuracy, out.failures) == (None, [])


# -- refresh -----------------------------------------------------------------------------------
def _refresh(
    store: BaselineStore,
    metrics: dict[str, list[Any]],
    *,
    complete: bool = True,
    why: str | None = None,
    run_rows: list[dict[str, Any]] | None = None,
) -> str:
    return gates.refresh(store, TEST_ID, make_key(), metrics, run_rows or [{"run": 0}],
                         accuracy=None, reason="new kernel", complete=complete,
                         why_incomplete=why)  # fmt: skip


def test_complete_run_writes_the_baseline(tmp_path: Path) -> None:
    """The written file reads back with the run's values; non-finite per-run details become
    null (strict JSON), and a metric with a missing run is left out rather than half-kept."""
    store = BaselineStore(tmp_path)
    metrics: dict[str, list[Any]] = {**runs(), "mbu": [0.5, None, 0.5]}
    rows = [{"run": 0, "ttft_p99_ms": math.nan, "tpot": [math.inf, 1.0]}]
    status = _refresh(store, metrics, run_rows=rows)
    path = store.path_for(TEST_ID, make_key())
    assert status == f"written: {path}"
    saved = store.load(TEST_ID, make_key())
    assert saved is not None
    assert saved.metrics == runs()
    assert saved.runs == [{"run": 0, "ttft_p99_ms": None, "tpot": [None, 1.0]}]
    assert saved.provenance.reason == "new kernel"


@pytest.mark.parametrize(
    ("why", "status"),
    [
        ("server died (run 2 of 10)", "not-written: server died (run 2 of 10)"),
        ("quick mode", "not-written: quick mode"),
        (None, "not-written: partial run"),
    ],
)
def test_incomplete_run_writes_nothing(tmp_path: Path, why: str | None, status: str) -> None:
    store = BaselineStore(tmp_path)
    assert _refresh(store, runs(), complete=False, why=why) == status
    assert not store.path_for(TEST_ID, make_key()).exists()
    assert list(tmp_path.rglob("*.json")) == []


def test_incomplete_run_never_overwrites_the_baseline(tmp_path: Path) -> None:
    """A partial refresh run with a 30 % drop must leave the recorded file byte for byte."""
    store = BaselineStore(tmp_path)
    path = store_baseline(store)
    before = path.read_bytes()
    status = _refresh(store, runs(goodput=700.0), complete=False, why="quick mode")
    assert status == "not-written: quick mode"
    assert path.read_bytes() == before


def test_json_safe_replaces_non_finite_floats_recursively() -> None:
    value = {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf, "d": (2, math.nan)}],
             "e": "nan", "f": None, "g": 0, "h": True}  # fmt: skip
    safe = gates.json_safe(value)
    assert safe == {"a": None, "b": [1.5, None, {"c": None, "d": [2, None]}], "e": "nan",
                    "f": None, "g": 0, "h": True}  # fmt: skip
    json.dumps(safe, allow_nan=False)  # strict JSON now
    assert value["a"] != value["a"]  # the input is not modified


def test_a_baseline_sharing_no_gated_metric_fails_instead_of_passing(tmp_path: Path) -> None:
    """Was: nothing compared, nothing failed, the test passed against a baseline it never read."""
    store = BaselineStore(tmp_path)
    path = store_baseline(store)
    out = compare(store, {"mbu": [0.4, 0.41, 0.39]})
    assert out.status == "compared" and not any(v.gating for v in out.verdicts)
    (failure,) = out.failures
    assert failure.startswith(
        f"baseline {path} shares no gated metric with this run (baseline: "
        "power_w, slo_goodput_tok_s, ttft_p99_ms; this run: mbu)"
    )
    assert "Fix: re-record it with `pytest tests/perf/test_moe.py --moeperf-refresh" in failure


def test_searched_metrics_are_judged_to_within_the_search_bracket(tmp_path: Path) -> None:
    """Three baseline runs on one 10 % bracket, a candidate one bracket lower: not regressed.
    The bracket comes from the runs as stored (each search run records its tolerance)."""
    store = BaselineStore(tmp_path)
    searched = [{"index": i, "tolerance": 0.10, "bracket": [24.19, 26.6]} for i in range(3)]
    store.write(Baseline(TEST_ID, make_key(), {"slo_rate_rps": [24.19] * 3}, searched, PROV),
                complete=True)  # fmt: skip
    lower = {"slo_rate_rps": [21.99] * 3}
    out = compare(store, lower, candidate_runs=searched)
    assert out.status == "compared" and out.failures == []
    (v,) = out.verdicts
    assert v.outcome != "regressed", v.reason
    halved = compare(store, {"slo_rate_rps": [12.1] * 3}, candidate_runs=searched)
    assert any("slo_rate_rps regressed" in f for f in halved.failures)
