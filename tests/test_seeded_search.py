"""A run compared against a stored baseline starts its first search from that baseline's bracket
(``record.stored_bracket`` -> ``RunDriver.seed_bracket``), as a refresh's later runs start from
its first: an unchanged nightly certifies the bracket in two probes a run instead of a search
from the warm-up's rate (7 probes for H100 chat-mix's first run, 2026-12-06)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from baseline_helpers import PROV, make_key
from test_driver import _driver, _fake_search

from pytest_moeperf.baseline import Baseline, BaselineStore
from pytest_moeperf.run import probe
from pytest_moeperf.run.record import median_bracket, stored_bracket

TEST_ID = "perf_tests/test_h200.py::test_h200_fixed_in_tree"


def _runs(*brackets: tuple[float | None, float | None], converged: bool = True) -> list[dict]:  # type: ignore[type-arg]
    return [{"bracket": list(b), "converged": converged} for b in brackets]


def test_the_median_converged_run_gives_the_bracket() -> None:
    runs = _runs((14.84, 15.27), (16.67, 18.0), (15.43, 16.67))  # the H100 bf16 baseline
    assert median_bracket(runs) == (15.43, 16.67)
    assert median_bracket(runs[:2]) == (14.84, 15.27)  # an even count: the lower middle
    assert median_bracket([*runs[:1], *_runs((30.0, 33.0), converged=False)]) == (14.84, 15.27)
    assert median_bracket(_runs((40.0, None), (None, 8.0), (9.0, 9.0))) is None  # no bracket
    assert median_bracket([{"bracket": "15..16", "converged": True}, {}]) is None


def test_the_stored_baseline_of_this_setup_gives_it(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    key = make_key()
    assert stored_bracket(tmp_path, TEST_ID, key) is None  # nothing stored
    store.write(Baseline(TEST_ID, key, {"slo_goodput_tok_s": [1900.0, 2133.0, 1975.0]},
                         _runs((14.84, 15.27), (16.67, 18.0), (15.43, 16.67)), PROV),
                complete=True)  # fmt: skip
    assert stored_bracket(tmp_path, TEST_ID, key) == (
        15.43, 16.67, str(store.path_for(TEST_ID, key)))  # fmt: skip
    assert stored_bracket(tmp_path, TEST_ID, make_key(gpu_name="NVIDIA H100")) is None
    path = store.path_for(TEST_ID, key)
    path.write_text(json.dumps({"not": "a baseline"}))
    assert stored_bracket(tmp_path, TEST_ID, key) is None  # the comparison reports the file


def test_a_seeded_first_search_starts_at_the_met_rate_and_aims_at_the_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[str] = []
    d = _driver(lines)
    calls = _fake_search(monkeypatch, [(15.43, 16.67), (15.43, 16.67)])
    ep = probe.Endpoint("http://127.0.0.1:1", "m")
    d.seed_bracket(ep, "t", 15.43, 16.67, "baselines/x/cuda.json")
    d.run(ep, 0, "t run 1/2")
    d.run(ep, 1, "t run 2/2")
    assert [(c["start_rate"], c["hint_hi"]) for c in calls] == [(15.43, 16.67)] * 2
    assert lines[0] == ("t: the first search starts from the baseline's bracket, met 15.4, "
                        "missed 16.7 req/s (baselines/x/cuda.json)")  # fmt: skip
    assert d._warm.get("http://127.0.0.1:2") is None  # another server is not seeded


def test_a_seeded_warm_up_names_no_other_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A night's log said "the first search starts at 8 req/s (search.rate_min)" and then "the
    first search starts from the baseline's bracket": a seeded warm-up names no start."""
    ok = SimpleNamespace(fixed={"n_ok": 16, "request_throughput": 30.0})
    monkeypatch.setattr(probe, "measure_fixed", lambda *a, **kw: ok)
    lines: list[str] = []
    d = _driver(lines)
    ep = probe.Endpoint("http://127.0.0.1:1", "m")
    d.warm_up(ep, "t", seeded=True)
    d.seed_bracket(ep, "t", 15.43, 16.67, "baselines/x/cuda.json")
    assert lines == ["t: warmed up (16 requests at concurrency 8, not measured)",
                     "t: the first search starts from the baseline's bracket, met 15.4, missed "
                     "16.7 req/s (baselines/x/cuda.json)"]  # fmt: skip


def test_a_baseline_of_another_machine_seeds_nothing(tmp_path: Path) -> None:
    """The gate calls a baseline whose calibration is x2 off another machine's; the search
    does not start from its bracket either (it said so, then "no baseline for this machine")."""
    from test_calibration import FAST, SAME_SLOW_SESSION, SLOW

    store = BaselineStore(tmp_path)
    stored = make_key(calibration=FAST)
    store.write(Baseline(TEST_ID, stored, {"slo_goodput_tok_s": [1.0, 1.0, 1.0]},
                         _runs((15.43, 16.67)), PROV), complete=True)  # fmt: skip
    assert stored_bracket(tmp_path, TEST_ID, make_key(calibration=SLOW)) is None
    assert stored_bracket(tmp_path, TEST_ID, make_key(calibration=SAME_SLOW_SESSION)) is not None
    assert stored_bracket(tmp_path, TEST_ID, make_key(calibration=None)) is not None  # remote


def test_a_machine_whose_calibration_drifted_seeds_nothing(tmp_path: Path) -> None:
    """Compared (x1.5 to x2 is the same machine in another state), but not seeded: an H100 host
    whose copy figure was 48 % below the baseline's started at the baseline's 25.6 req/s and
    cut two probes on its way down to 16.7 (2026-12-07)."""
    from test_calibration import FAST

    from pytest_moeperf.baseline.calibration import Calibration
    from pytest_moeperf.gates import calibration_speed

    drifted = Calibration({"gemm_gflops": 86.3, "copy_gb_s": 9.2}, threads=1)  # copy -48 %
    store = BaselineStore(tmp_path)
    store.write(Baseline(TEST_ID, make_key(calibration=FAST), {"slo_goodput_tok_s": [1.0] * 3},
                         _runs((23.75, 25.65)), PROV), complete=True)  # fmt: skip
    here = make_key(calibration=drifted)
    assert calibration_speed(here, make_key(calibration=FAST)) is not None  # compared, drifted
    assert stored_bracket(tmp_path, TEST_ID, here) is None
