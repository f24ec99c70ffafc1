"""RunDriver: the warm start between runs on one server, and its fallback when it misses."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_moeperf.load import probe
from pytest_moeperf.load.driver import SWITCH_SETTLE_S, WARM_START_FACTOR, RunDriver
from pytest_moeperf.metrics.energy import NotMeasuredMeter
from pytest_moeperf.spec.loader import load_spec

SPEC = Path(__file__).parents[1] / "perf_tests" / "specs" / "cpu-smoke.yaml"


def _driver(lines: list[str]) -> RunDriver:
    """A driver on cpu-smoke.yaml whose settle pauses advance a fake clock (never real time)."""
    spec = load_spec(SPEC)
    assert spec.search is not None
    clock = _Clock()
    return RunDriver(spec=spec, slo=spec.slo, meter=NotMeasuredMeter("test"), vocab_size=1024,
                     mbu_inputs=None, probe_requests=8, max_probes=7, say=lines.append,
                     clock=clock, sleep=clock.sleep)  # fmt: skip


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


class _Clock:
    """A fake monotonic clock; ``sleep`` advances it and records the pause."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _timed_driver(clock: _Clock) -> RunDriver:
    d = _driver([])
    d.clock, d.sleep = clock, clock.sleep
    return d


def test_switching_servers_waits_out_the_previous_servers_idle_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    d = _timed_driver(clock)
    _fake_search(monkeypatch, [40.0, 40.0, 40.0, 40.0])
    a, b = probe.Endpoint("http://127.0.0.1:1", "m"), probe.Endpoint("http://127.0.0.1:2", "m")
    d.run(a, 0, "t")
    assert clock.slept == []  # nothing ran before
    d.run(a, 1, "t")
    assert clock.slept == []  # same server: its own spin is no neighbour
    clock.now += 0.5
    d.run(b, 0, "t")
    assert clock.slept == [pytest.approx(SWITCH_SETTLE_S - 0.5)]
    clock.now += 10.0
    d.run(a, 2, "t")  # the other server has long gone idle
    assert len(clock.slept) == 1


def test_a_warm_up_counts_as_load_on_its_server(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    d = _timed_driver(clock)
    _fake_search(monkeypatch, [40.0])
    monkeypatch.setattr(probe, "measure_fixed", lambda *a, **kw: None)
    a, b = probe.Endpoint("http://127.0.0.1:1", "m"), probe.Endpoint("http://127.0.0.1:2", "m")
    d.warm_up(a, "t")
    d.run(b, 0, "t")
    assert clock.slept == [pytest.approx(SWITCH_SETTLE_S)]


def test_a_failed_run_still_counts_as_load(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    d = _timed_driver(clock)

    def boom(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("server died")

    monkeypatch.setattr(probe, "measure_run", boom)
    a, b = probe.Endpoint("http://127.0.0.1:1", "m"), probe.Endpoint("http://127.0.0.1:2", "m")
    with pytest.raises(RuntimeError):
        d.run(a, 0, "t")
    _fake_search(monkeypatch, [40.0])
    d.run(b, 0, "t")
    assert clock.slept == [pytest.approx(SWITCH_SETTLE_S)]


# -- warm-up levels
def _spec(text: str) -> Any:
    from pytest_moeperf.spec.loader import load_spec_text

    base = """
name: w
model: {path: embedded, dtype: bfloat16, max_model_len: 2048}
workload: {trace: fixed, num_requests: 8, seed: 0, input_tokens: 16, output_tokens: 8}
slo: {ttft_p99_ms: 1000, tpot_p99_ms: 100}
"""
    return load_spec_text(base + text)


def test_cpu_warm_up_is_one_level_the_spec_own_or_eight() -> None:
    from pytest_moeperf.load.driver import warm_levels

    poisson = _spec("arrival: {process: poisson, rate: 2}\n")
    fixed = _spec("arrival: {process: concurrency, concurrency: 24}\n")
    assert warm_levels(poisson, gpu=False) == (8,)
    assert warm_levels(fixed, gpu=False) == (24,)


def test_gpu_warm_up_climbs_powers_of_two_to_the_cap_and_the_spec_level() -> None:
    from pytest_moeperf.load.driver import WARM_MAX_BATCH, warm_levels

    poisson = _spec("arrival: {process: poisson, rate: 2}\n")
    assert warm_levels(poisson, gpu=True) == (1, 2, 4, 8, 16, 32, 64)
    assert WARM_MAX_BATCH == 64
    fixed = _spec("arrival: {process: concurrency, concurrency: 24}\n")
    assert warm_levels(fixed, gpu=True) == (1, 2, 4, 8, 16, 24, 32, 64)
    small = _spec(
        "engine_args: {max-num-seqs: 12}\narrival: {process: concurrency, concurrency: 16}\n"
    )
    assert warm_levels(small, gpu=True) == (1, 2, 4, 8, 12)  # never above max-num-seqs


def test_warm_up_runs_each_level_unmeasured_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, str]] = []

    def fake_fixed(endpoint: Any, spec: Any, slo: Any, **kw: Any) -> None:
        calls.append((kw["concurrency"], kw["num_requests"], kw["meter"].name))

    monkeypatch.setattr(probe, "measure_fixed", fake_fixed)
    lines: list[str] = []
    d = _driver(lines)
    d.warm = (1, 2, 4)
    d.warm_up(probe.Endpoint("http://127.0.0.1:1", "m"), "t")
    assert [(c, n) for c, n, _ in calls] == [(1, 4), (2, 4), (4, 8)]
    assert {m for _, _, m in calls} == {NotMeasuredMeter("x").name}
    assert lines == ["t: warmed up (16 requests at concurrency 1, 2, 4 in turn, not measured)"]
