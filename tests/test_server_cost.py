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
