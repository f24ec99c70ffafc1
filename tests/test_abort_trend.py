"""The overload trend rule on seeded queue probes (``benchmarks/abort_trend_study.py``): it must
not stop probes that go on to meet the SLO, and must still stop plain overloads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_moeperf.run.abort import AbortPolicy, block_medians

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from abort_trend_study import VARIANTS, probe, stops, would_meet  # type: ignore[import-not-found]

OLD = VARIANTS["old: all requests, 95 %"]


@pytest.mark.parametrize("seed", [16, 29, 39, 57])
def test_a_probe_that_meets_its_slo_is_not_stopped_by_a_transient_rise(seed: int) -> None:
    """At 0.8 of capacity these probes meet p99 TTFT in full; a line through every request's
    TTFT stopped each of them part-way (its standard error treats a queue's successive TTFTs as
    independent), as it stopped H100 probes at 15.3 and 16.7 req/s that another run met."""
    recs = probe(0.8 * 4.0, seed, 40.0)
    assert would_meet(recs)
    assert stops(recs, OLD, 40.0)
    assert not stops(recs, AbortPolicy(), 40.0)


def test_a_plain_overload_is_still_stopped() -> None:
    stopped = [stops(probe(1.5 * 4.0, seed, 40.0), AbortPolicy(), 40.0) for seed in range(10)]
    assert sum(stopped) >= 8, stopped
    assert not any(would_meet(probe(1.5 * 4.0, seed, 40.0)) for seed in range(10))


def test_block_medians_are_medians_of_successive_equal_runs() -> None:
    pts = [(float(i), float(i % 3)) for i in range(12)]
    assert block_medians(pts, 4) == [(1.0, 1.0), (4.0, 1.0), (7.0, 1.0), (10.0, 1.0)]
    assert block_medians(pts[:2], 8) == [(0.0, 0.0), (1.0, 1.0)]  # fewer points than blocks
    assert block_medians([], 8) == []
