"""RunDriver: the warm start between runs on one server, and its fallback when it misses."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_moeperf.load import probe
from pytest_moeperf.load.driver import WARM_START_FACTOR, RunDriver
from pytest_moeperf.metrics.energy import NotMeasuredMeter
from pytest_moeperf.spec.loader import load_spec

SPEC = Path(__file__).parents[1] / "perf_tests" / "specs" / "cpu-smoke.yaml"


def _driver(lines: list[str]) -> RunDriver:
    spec = load_spec(SPEC)
    assert spec.search is not None
    return RunDriver(spec=spec, slo=spec.slo, meter=NotMeasuredMeter("test"), vocab_size=1024,
                     mbu_inputs=None, probe_requests=8, max_probes=7,
                     say=lines.append)  # fmt: skip


def _fake_search(monkeypatch: pytest.MonkeyPatch, boundaries: list[float | None]) -> list[float]:
    """measure_run stand-in: returns the next boundary; records each search's starting rate."""
    starts: list[float] = []

    def fake(endpoint: Any, spec: Any, slo: Any, **kw: Any) -> Any:
        starts.append(kw["rate_min"])
        return SimpleNamespace(search=SimpleNamespace(boundary_rate=boundaries.pop(0)))

    monkeypatch.setattr(probe, "measure_run", fake)
    return starts


def test_second_run_starts_just_under_the_first_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    d = _driver(lines)
    starts = _fake_search(monkeypatch, [40.0, 38.0])
    ep = probe.Endpoint("http://127.0.0.1:1", "m")
    d.run(ep, 0, "t run 1/2")
    d.run(ep, 1, "t run 2/2")
    assert starts == [d.spec_rate_min, pytest.approx(40.0 * WARM_START_FACTOR)]
    assert not any("searching again" in line for line in lines)


def test_a_missed_warm_start_searches_again_from_rate_min_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[str] = []
    d = _driver(lines)
    starts = _fake_search(monkeypatch, [40.0, None, 30.0])
    ep = probe.Endpoint("http://127.0.0.1:1", "m")
    d.run(ep, 0, "t run 1/2")
    run = d.run(ep, 1, "t run 2/2")
    assert run.search is not None and run.search.boundary_rate == 30.0
    assert starts == [d.spec_rate_min, pytest.approx(36.0), d.spec_rate_min]
    (line,) = [x for x in lines if "searching again" in x]
    assert line.startswith("t run 2/2: started at 36 req/s")
    assert f"rate_min {d.spec_rate_min:.3g} req/s" in line


def test_warm_starts_are_per_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A/B runs alternate two servers: each starts from its own last boundary."""
    d = _driver([])
    starts = _fake_search(monkeypatch, [40.0, 20.0, 41.0, 19.0])
    a, b = probe.Endpoint("http://127.0.0.1:1", "m"), probe.Endpoint("http://127.0.0.1:2", "m")
    for i, ep in enumerate([a, b, a, b]):
        d.run(ep, i, "t")
    lo = d.spec_rate_min
    assert starts == [lo, lo, pytest.approx(36.0), pytest.approx(18.0)]
