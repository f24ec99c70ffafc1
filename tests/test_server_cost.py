"""The comparison's note when the two sides did not ask the server for the same work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_moeperf.verdict.server_cost import boundary_server_stats, server_cost_notes

ROOT = Path(__file__).resolve().parent.parent


def _run(hit: float | None, preempt: int = 0, rate: float = 10.0, met: bool = True,
         available: bool = True) -> dict[str, Any]:  # fmt: skip
    server = {"available": available, "prefix_cache_hit_rate": hit, "preemptions": preempt}
    other = {"rate": 12.0, "met": False, "summary": {"server": {**server, "preemptions": 99}}}
    probe = {"rate": rate, "met": met, "summary": {"server": server}}
    return {"boundary_rate": rate, "probes": [probe, other]}


def test_equal_hit_rates_and_no_preemptions_say_nothing() -> None:
    assert server_cost_notes([_run(0.0)] * 3, [_run(0.02)] * 3) == []


def test_a_hit_rate_gap_is_named_with_both_figures() -> None:
    (note,) = server_cost_notes([_run(0.0)] * 3, [_run(0.4), _run(0.5), _run(0.45)])
    assert "prefix-cache hit rate at the boundary differs: baseline 0 %, this run 45 %" in note
    assert "model.prefix_caching" in note


def test_preemptions_on_one_side_only_are_named() -> None:
    (note,) = server_cost_notes([_run(0.0, preempt=0)] * 2, [_run(0.0, preempt=11), _run(0.0)])
    assert note.startswith("preemptions at the boundary: baseline 0, this run 11 over 2 and 2 runs")
    # both sides preempted: the same regime, nothing to say; a missed probe's count is not read
    assert server_cost_notes([_run(0.0, preempt=3)], [_run(0.0, preempt=5)]) == []


def test_nothing_recorded_on_either_side_says_nothing() -> None:
    assert server_cost_notes([_run(None)], [_run(0.9)]) == []
    assert server_cost_notes([_run(0.0, available=False)], [_run(0.9)]) == []
    assert server_cost_notes([{"boundary_rate": None, "probes": []}], [_run(0.9)]) == []
    assert boundary_server_stats(_run(0.1, met=False)) is None


def test_the_committed_cpu_baseline_has_the_stats_at_its_boundary() -> None:
    (path,) = (ROOT / "baselines").rglob("cpu-*.json")
    runs = json.loads(path.read_text())["runs"]
    stats = [boundary_server_stats(r) for r in runs]
    assert all(s is not None and s["prefix_cache_hit_rate"] == 0.0 for s in stats)
    assert server_cost_notes(runs, runs) == []
    hot = [dict(r) for r in runs]
    for r in hot:  # the same runs with a warm prefix cache at the boundary
        r["probes"] = [
            {**p, "summary": {**p["summary"], "server": {**p["summary"]["server"],
                                                          "prefix_cache_hit_rate": 0.6}}}
            for p in r["probes"]
        ]  # fmt: skip
    (note,) = server_cost_notes(runs, hot)
    assert "baseline 0 %, this run 60 %" in note


def _lag_run(lag_ms: float, rate: float = 24.0) -> dict[str, Any]:
    summary = {"send_lag_p99_ms": lag_ms, "slo": {"ttft_p99_ms": 2000.0}}
    return {"boundary_rate": rate, "probes": [{"rate": rate, "met": True, "summary": summary}]}


def _verdicts() -> list[Any]:
    from pytest_moeperf.verdict import judge_all

    base = {"slo_goodput_tok_s": [774.0, 760.0, 790.0], "tpot_p99_ms": [11.0, 10.8, 11.2]}
    cand = {"slo_goodput_tok_s": [418.0, 418.0, 437.0], "tpot_p99_ms": [30.0, 31.0, 29.5]}
    return judge_all(base, cand, source="test")


def test_a_quiet_machine_keeps_every_verdict() -> None:
    from pytest_moeperf.verdict.server_cost import stalled_verdicts

    raw = _verdicts()
    assert {v.metric: v.outcome for v in raw} == {
        "slo_goodput_tok_s": "regressed", "tpot_p99_ms": "regressed"}  # fmt: skip
    assert stalled_verdicts(raw, [_lag_run(3.0)] * 3, [_lag_run(150.0)] * 3) == raw


def test_a_stalled_client_makes_the_boundary_inconclusive_with_both_figures() -> None:
    from pytest_moeperf.verdict.server_cost import stalled_verdicts

    out = {v.metric: v for v in stalled_verdicts(_verdicts(), [_lag_run(3.0)] * 3,
                                                 [_lag_run(448.0)] * 3)}  # fmt: skip
    goodput = out["slo_goodput_tok_s"]
    assert goodput.outcome == "inconclusive" and not goodput.fails
    assert "the machine stalled the client at the boundary (p99 send lag this run 448 ms" in (
        goodput.reason)  # fmt: skip
    assert "10 % of the 2,000 ms TTFT SLO" in goodput.reason
    assert "machine_stalls.py" in goodput.advice
    assert out["tpot_p99_ms"].outcome == "regressed"  # not searched: its verdict stands


def test_an_inconclusive_boundary_also_names_the_stalls() -> None:
    from dataclasses import replace

    from pytest_moeperf.verdict.server_cost import stalled_verdicts

    raw = [replace(v, outcome="inconclusive", reason="within the band", advice="rerun")
           if v.metric == "slo_goodput_tok_s" else v for v in _verdicts()]  # fmt: skip
    (goodput, tpot) = stalled_verdicts(raw, [_lag_run(3.0)] * 3, [_lag_run(448.0)] * 3)
    assert goodput.outcome == "inconclusive"
    assert goodput.reason.startswith("within the band; and the machine stalled the client")
    assert goodput.advice.startswith("rerun; measure on a quiet machine")
    assert tpot == raw[1]


def test_the_committed_cpu_baseline_was_itself_recorded_during_stalls() -> None:
    # its boundary probes' clients sent p99 ~470 ms late; a fresh clone on the same VM read
    # -45 % goodput "regressed" against it with unchanged code (2026-12-05)
    from pytest_moeperf.verdict.server_cost import boundary_send_lag, stalled_verdicts

    (path,) = (ROOT / "baselines").rglob("cpu-*.json")
    runs = json.loads(path.read_text())["runs"]
    got = boundary_send_lag(runs)
    assert got is not None and got[0] > 200.0 and got[1] == 2000.0
    (goodput, _) = stalled_verdicts(_verdicts(), runs, [_lag_run(3.0)] * 3)
    assert goodput.outcome == "inconclusive" and "baseline 468 ms" in goodput.reason


def test_runs_without_a_recorded_lag_leave_the_verdicts_alone() -> None:
    from pytest_moeperf.verdict.server_cost import stalled_verdicts

    raw = _verdicts()
    assert stalled_verdicts(raw, [_run(0.0)] * 3, [_run(0.0)] * 3) == raw


def _at_rates(base_rate: list[float], cand_rate: list[float], base_tpot: list[float],
              cand_tpot: list[float]) -> dict[str, Any]:  # fmt: skip
    from pytest_moeperf.verdict import judge_all
    from pytest_moeperf.verdict.server_cost import load_confounded

    base = {"slo_rate_rps": base_rate, "tpot_p99_ms": base_tpot, "ttft_p99_ms": [400.0] * 3}
    cand = {"slo_rate_rps": cand_rate, "tpot_p99_ms": cand_tpot, "ttft_p99_ms": [400.0] * 3}
    raw = judge_all(base, cand, source="test")
    return {"raw": {v.metric: v for v in raw},
            "out": {v.metric: v for v in load_confounded(raw)}}  # fmt: skip


def test_worse_latency_at_a_higher_boundary_is_the_load_not_a_regression() -> None:
    """CI on the stalling VM (2026-12-05): the tutorial's baseline put the boundary at 14.6 req/s,
    the next run at 35.7 (+144 %), and p99 TPOT read there came out +92 % "regressed"."""
    got = _at_rates([14.0, 14.6, 15.2], [35.0, 35.7, 36.4], [6.0, 6.1, 6.2], [11.5, 11.7, 11.9])
    assert got["raw"]["tpot_p99_ms"].outcome == "regressed"  # what the stats alone say
    tpot = got["out"]["tpot_p99_ms"]
    assert tpot.outcome == "inconclusive" and not tpot.fails
    assert ("read at the SLO boundary, whose rate moved +145 % from the baseline's (more load)"
            in tpot.reason)  # fmt: skip
    assert "fixed arrival rate" in tpot.advice
    assert got["out"]["slo_rate_rps"] == got["raw"]["slo_rate_rps"]
    assert got["out"]["ttft_p99_ms"] == got["raw"]["ttft_p99_ms"]


def test_worse_latency_at_a_lower_boundary_stays_regressed() -> None:
    """The slowed server: fewer req/s and slower tokens. Nothing about load excuses that."""
    got = _at_rates([24.0, 24.2, 24.4], [9.0, 9.2, 9.4], [11.0, 11.1, 11.2], [70.0, 72.0, 74.0])
    assert got["out"]["tpot_p99_ms"].outcome == "regressed"
    assert got["out"]["tpot_p99_ms"] == got["raw"]["tpot_p99_ms"]


def test_better_latency_at_a_lower_boundary_is_not_an_improvement() -> None:
    got = _at_rates([24.0, 24.2, 24.4], [9.0, 9.2, 9.4], [11.0, 11.1, 11.2], [5.0, 5.1, 5.2])
    assert got["raw"]["tpot_p99_ms"].outcome == "improved"
    assert got["out"]["tpot_p99_ms"].outcome == "inconclusive"
    assert "(less load)" in got["out"]["tpot_p99_ms"].reason


def test_an_unchanged_boundary_leaves_latency_verdicts_alone() -> None:
    got = _at_rates([24.0, 24.2, 24.4], [24.1, 24.2, 24.3], [6.0, 6.1, 6.2], [11.5, 11.7, 11.9])
    assert got["raw"]["slo_rate_rps"].outcome == "unchanged"
    assert got["out"] == got["raw"]


def test_a_refresh_recorded_during_stalls_says_so_with_its_lag() -> None:
    """The median boundary lag of the refreshed runs decides; the committed CPU baseline's own
    runs (468 ms against a 2,000 ms SLO) would have been written with this line."""
    from pytest_moeperf.verdict.server_cost import stalled_recording

    assert stalled_recording([_lag_run(3.0)] * 3) is None
    assert stalled_recording([_lag_run(150.0), _lag_run(900.0), _lag_run(199.0)]) is None
    got = stalled_recording([_lag_run(150.0), _lag_run(900.0), _lag_run(828.0)])
    assert got is not None and got.startswith(
        "recorded while the machine stalled the client at the boundary (p99 send lag 828 ms, "
        "over 10 % of the 2,000 ms TTFT SLO): SLO goodput and rate compared with it will read "
        "inconclusive")  # fmt: skip
    (path,) = (ROOT / "baselines").rglob("cpu-*.json")
    committed = stalled_recording(json.loads(path.read_text())["runs"])
    assert committed is not None and "p99 send lag 468 ms" in committed
    assert stalled_recording([_run(0.0)] * 3) is None  # no lag recorded: nothing to say


def _lag_run_tokens(lag_ms: float, tokens: float = 32.0) -> dict[str, Any]:
    run = _lag_run(lag_ms)
    run["probes"][0]["summary"]["mean_output_tokens"] = tokens
    return run


def _latency_verdicts(cand_tpot: list[float], cand_ttft: list[float]) -> list[Any]:
    from pytest_moeperf.verdict import judge_all

    base = {"tpot_p99_ms": [11.0, 10.8, 11.2], "ttft_p99_ms": [480.0, 490.0, 495.0]}
    return judge_all(base, {"tpot_p99_ms": cand_tpot, "ttft_p99_ms": cand_ttft}, source="test")


def test_a_latency_change_a_stall_explains_is_inconclusive() -> None:
    """make perf, 2026-12-05: the same code, p99 TPOT 11.1 -> 25.8 ms "regressed" at an
    unchanged boundary, its client ~1.1 s late: 1,119 ms over 31 tokens is 36 ms a token."""
    from pytest_moeperf.verdict.server_cost import stalled_verdicts

    raw = _latency_verdicts([25.0, 26.0, 25.5], [1400.0, 1450.0, 1500.0])
    assert [v.outcome for v in raw] == ["regressed", "regressed"]
    ttft, tpot = stalled_verdicts(raw, [_lag_run_tokens(5.0)] * 3, [_lag_run_tokens(1119.0)] * 3)
    assert tpot.outcome == "inconclusive" and ttft.outcome == "inconclusive"
    assert tpot.reason.endswith(
        "but the machine stalled the client at the boundary (p99 send lag this run 1,119 ms): "
        "a stall that long adds up to 36.1 ms to one request's TPOT, no less than this change"
    )
    assert "adds up to 1,119.0 ms to one request's TTFT" in ttft.reason
    assert "machine_stalls.py" in tpot.advice


def test_a_latency_change_larger_than_any_stall_keeps_its_verdict() -> None:
    """The e2e test's server, slowed by 50 ms a step: TPOT +50 ms is beyond 36 ms a token."""
    from pytest_moeperf.verdict.server_cost import stalled_verdicts

    raw = _latency_verdicts([61.0, 62.0, 60.0], [2900.0, 3000.0, 3100.0])
    out = stalled_verdicts(raw, [_lag_run_tokens(5.0)] * 3, [_lag_run_tokens(1119.0)] * 3)
    assert [v.outcome for v in out] == ["regressed", "regressed"] and out == raw
    quiet = stalled_verdicts(_latency_verdicts([25.0, 26.0, 25.5], [1400.0, 1450.0, 1500.0]),
                             [_lag_run_tokens(5.0)] * 3, [_lag_run_tokens(150.0)] * 3)  # fmt: skip
    assert [v.outcome for v in quiet] == ["regressed", "regressed"]  # 150 ms: no stall


def test_a_stalled_refresh_never_replaces_a_compared_baseline() -> None:
    """A stalled run may become a *first* baseline (with a warning); it never replaces one it
    was compared with: there a slowed server reads inconclusive, passes, and would be written."""
    from types import SimpleNamespace

    from pytest_moeperf.run.refresh import stalled_replacement

    def runs(lag: float) -> list[Any]:
        return [SimpleNamespace(to_dict=lambda: _lag_run(lag))] * 3

    why = stalled_replacement("compared", "baselines/x/cpu.json", runs(828.0))
    assert why == (
        "this run was recorded while the machine stalled the client at the boundary (p99 send "
        "lag 828 ms, over 10 % of the 2,000 ms TTFT SLO), so it does not replace the baseline "
        "it was compared with (baselines/x/cpu.json); to accept it anyway, remove that file and "
        "refresh again")  # fmt: skip
    assert stalled_replacement("missing", None, runs(828.0)) is None
    assert stalled_replacement("compared", "b.json", runs(5.0)) is None


# -- a boundary met at search.rate_max is a floor ----------------------------------------------
def _cap_run(lo: float, hi: float | None, converged: bool = True) -> dict[str, Any]:
    return {"bracket": [lo, hi], "converged": converged, "probes": []}


def _capped(base_runs: list[dict[str, Any]], cand_runs: list[dict[str, Any]],
            base_rate: list[float], cand_rate: list[float]) -> dict[str, Any]:  # fmt: skip
    from pytest_moeperf.verdict import judge_all
    from pytest_moeperf.verdict.server_cost import capped_verdicts

    base = {"slo_rate_rps": base_rate, "slo_goodput_tok_s": [r * 32 for r in base_rate],
            "ttft_p99_ms": [400.0, 410.0, 420.0]}  # fmt: skip
    cand = {"slo_rate_rps": cand_rate, "slo_goodput_tok_s": [r * 32 for r in cand_rate],
            "ttft_p99_ms": [400.0, 405.0, 415.0]}  # fmt: skip
    raw = judge_all(base, cand, source="test")
    return {v.metric: v for v in capped_verdicts(raw, base_runs, cand_runs)}


def test_both_sides_met_at_rate_max_is_inconclusive_not_unchanged() -> None:
    """A build twice as slow that still meets the cap reads the same: no verdict, and why."""
    runs = [_cap_run(40.0, None)] * 3
    got = _capped(runs, runs, [40.0] * 3, [40.0] * 3)
    for name in ("slo_rate_rps", "slo_goodput_tok_s"):
        v = got[name]
        assert v.outcome == "inconclusive" and not v.fails, v
        assert "every run of both sides met the SLO at search.rate_max (40 req/s)" in v.reason
        assert v.advice == "raise search.rate_max in the spec to find the boundary"
    assert got["ttft_p99_ms"].outcome == "unchanged"  # read at one rate on both sides: judged


def test_a_side_that_found_its_boundary_below_the_cap_is_judged() -> None:
    """Falling below the other side's floor is a real regression."""
    base = [_cap_run(40.0, None)] * 3
    cand = [_cap_run(20.0, 22.0), _cap_run(20.5, 22.5), _cap_run(19.5, 21.5)]
    got = _capped(base, cand, [40.0] * 3, [20.0, 20.5, 19.5])
    assert got["slo_rate_rps"].outcome == "regressed"
    assert "rate_max" not in got["slo_rate_rps"].reason


def test_an_unconverged_run_without_a_miss_is_not_a_cap() -> None:
    from pytest_moeperf.verdict.server_cost import capped

    assert capped(_cap_run(40.0, None))
    assert not capped(_cap_run(40.0, None, converged=False))
    assert not capped(_cap_run(40.0, 44.0))
    assert not capped({"bracket": [None, None], "converged": False})
    assert not capped({})


def _ttft_verdicts(base_ttft: list[float], cand_ttft: list[float]) -> list[Any]:
    from pytest_moeperf.verdict import judge_all

    tpot = [40.0, 41.0, 39.5]
    return judge_all({"ttft_p99_ms": base_ttft, "tpot_p99_ms": tpot},
                     {"ttft_p99_ms": cand_ttft, "tpot_p99_ms": tpot}, source="test")  # fmt: skip


def test_a_wide_ttft_band_at_a_searched_boundary_says_more_runs_will_not_help() -> None:
    """The H100 bf16 baseline of 2026-12-07: five runs, p99 TTFT 568-1,986 ms under a 2,000 ms
    SLO. "Record again with more runs" had been tried; the advice names the SLO instead."""
    from pytest_moeperf.verdict.server_cost import slo_bounded

    runs = [_lag_run(5.0) for _ in range(5)]
    verdicts = _ttft_verdicts([568.0, 1895.0, 1257.0, 1986.0, 913.0], [274.0, 725.0, 1421.0])
    ttft = next(v for v in verdicts if v.metric == "ttft_p99_ms")
    assert ttft.outcome == "inconclusive" and "more runs" in ttft.advice
    got = {v.metric: v for v in slo_bounded(verdicts, runs)}
    assert got["ttft_p99_ms"].outcome == "inconclusive"
    assert got["ttft_p99_ms"].reason == ttft.reason
    assert got["ttft_p99_ms"].advice.startswith(
        "at a searched boundary p99 TTFT lies anywhere below its SLO (2,000 ms)"
    )
    assert got["tpot_p99_ms"] == next(v for v in verdicts if v.metric == "tpot_p99_ms")


def test_a_narrow_band_or_a_fixed_load_keeps_its_advice() -> None:
    from pytest_moeperf.verdict.server_cost import slo_bounded

    narrow = _ttft_verdicts([480.0, 490.0, 495.0], [485.0, 488.0, 492.0])
    assert slo_bounded(narrow, [_lag_run(5.0)]) == narrow
    wide = _ttft_verdicts([568.0, 1895.0, 1257.0, 1986.0, 913.0], [274.0, 725.0, 1421.0])
    fixed_load = [{"fixed": {"slo_met": True}}]  # no searched boundary: no SLO bound
    assert slo_bounded(wide, fixed_load) == wide
