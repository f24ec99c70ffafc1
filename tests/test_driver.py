"""RunDriver: the warm start between runs on one server, and its fallback when it misses."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_moeperf.metrics.energy import NotMeasuredMeter
from pytest_moeperf.run import probe
from pytest_moeperf.run.driver import SWITCH_SETTLE_S, RunDriver
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


def _fake_search(
    monkeypatch: pytest.MonkeyPatch, brackets: list[tuple[float | None, float | None]],
    converged: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """measure_run stand-in: returns the next bracket; records each search's warm-start args."""
    calls: list[dict[str, Any]] = []

    def fake(endpoint: Any, spec: Any, slo: Any, **kw: Any) -> Any:
        calls.append({k: kw[k] for k in ("start_rate", "hint_hi", "min_span_s", "rate_min")})
        lo, hi = brackets.pop(0)
        search = SimpleNamespace(boundary_rate=lo, estimate=lo, bracket=(lo, hi),
                                 converged=converged, note="not converged within 5 probes",
                                 tolerance=0.05)  # fmt: skip
        return probe.RunMeasurement(0, search, [], {"slo_goodput_tok_s": lo},  # type: ignore[arg-type]
                                    probe_span_s=12.0 + len(calls))  # fmt: skip

    monkeypatch.setattr(probe, "measure_run", fake)
    return calls


def test_second_run_starts_at_the_first_boundary_and_aims_at_its_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[str] = []
    d = _driver(lines)
    calls = _fake_search(monkeypatch, [(40.0, 41.6), (40.0, 41.6)])
    ep = probe.Endpoint("http://127.0.0.1:1", "m")
    d.run(ep, 0, "t run 1/2")
    d.run(ep, 1, "t run 2/2")
    assert [c["start_rate"] for c in calls] == [d.spec_rate_min, 40.0]
    assert [c["hint_hi"] for c in calls] == [None, 41.6]
    assert [c["min_span_s"] for c in calls] == [None, 13.0]  # the probe length run 1 needed
    assert all(c["rate_min"] == d.spec_rate_min for c in calls)  # a miss may step down to it
    assert not any("does not count" in line for line in lines)
    said = [x for x in lines if "SLO boundary" in x]
    assert said == ["t run 1/2: SLO boundary 40 req/s (met 40, missed 41.6), SLO goodput "
                    "40 tok/s", "t run 2/2: SLO boundary 40 req/s (met 40, missed 41.6), "
                    "SLO goodput 40 tok/s"]  # fmt: skip


def test_an_unconverged_run_is_said_not_to_count(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    d = _driver(lines)
    _fake_search(monkeypatch, [(15.44, 18.17)], converged=False)
    run = d.run(probe.Endpoint("http://127.0.0.1:1", "m"), 0, "t run 1/1")
    assert not run.complete
    (line,) = [x for x in lines if "does not count" in x]
    assert "search did not converge" in line and "15.4..18.2 req/s" in line, line


def test_warm_starts_are_per_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A/B runs alternate two servers: each starts from its own last boundary."""
    d = _driver([])
    calls = _fake_search(monkeypatch, [(40.0, 41.0), (20.0, 21.0), (41.0, 42.0), (19.0, 20.0)])
    a, b = probe.Endpoint("http://127.0.0.1:1", "m"), probe.Endpoint("http://127.0.0.1:2", "m")
    for i, ep in enumerate([a, b, a, b]):
        d.run(ep, i, "t")
    lo = d.spec_rate_min
    assert [c["start_rate"] for c in calls] == [lo, lo, 40.0, 20.0]
    assert [c["hint_hi"] for c in calls] == [None, None, 41.0, 21.0]


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
    _fake_search(monkeypatch, [(40.0, 41.0)] * 4)
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
    _fake_search(monkeypatch, [(40.0, 41.0)])
    ok = SimpleNamespace(fixed={"n_ok": 4})
    monkeypatch.setattr(probe, "measure_fixed", lambda *a, **kw: ok)
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
    _fake_search(monkeypatch, [(40.0, 41.0)])
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
    from pytest_moeperf.run.driver import warm_levels

    poisson = _spec("arrival: {process: poisson, rate: 2}\n")
    fixed = _spec("arrival: {process: concurrency, concurrency: 24}\n")
    assert warm_levels(poisson, gpu=False) == (8,)
    assert warm_levels(fixed, gpu=False) == (24,)


def test_gpu_warm_up_climbs_powers_of_two_to_the_cap_and_the_spec_level() -> None:
    from pytest_moeperf.run.driver import WARM_MAX_BATCH, warm_levels

    poisson = _spec("arrival: {process: poisson, rate: 2}\n")
    assert warm_levels(poisson, gpu=True) == (1, 2, 4, 8, 16, 32, 64)
    assert WARM_MAX_BATCH == 64
    fixed = _spec("arrival: {process: concurrency, concurrency: 24}\n")
    assert warm_levels(fixed, gpu=True) == (1, 2, 4, 8, 16, 24, 32, 64)
    small = _spec(
        "engine_args: {max-num-seqs: 12}\narrival: {process: concurrency, concurrency: 16}\n"
    )
    assert warm_levels(small, gpu=True) == (1, 2, 4, 8, 12)  # never above max-num-seqs


def test_warm_up_runs_each_level_unmeasured_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                        serve: Any) -> None:  # fmt: skip
    """On a GPU the ladder ends with real Poisson load at the first rate (its own requests)."""
    from pytest_moeperf.run import driver

    monkeypatch.setattr(driver, "WARM_OPEN_LOOP_S", 1.5)
    url, srv = serve(delay_s=0.001)
    calls: list[tuple[int, int, str]] = []
    clips: list[int | None] = []

    def fake_fixed(endpoint: Any, spec: Any, slo: Any, **kw: Any) -> None:
        calls.append((kw["concurrency"], kw["num_requests"], kw["meter"].name))
        clips.append(spec.workload.max_output_tokens)
        return SimpleNamespace(fixed={"n_ok": kw["num_requests"]})

    monkeypatch.setattr(probe, "measure_fixed", fake_fixed)
    lines: list[str] = []
    d = _driver(lines)
    d.warm = (1, 2, 4)
    d.warm_up(probe.Endpoint(url, "m"), "t")
    assert [(c, n) for c, n, _ in calls] == [(1, 4), (2, 4), (4, 8)]
    assert {m for _, _, m in calls} == {NotMeasuredMeter("x").name}
    # the compile levels decode a few tokens; the last keeps the workload's lengths (its
    # throughput sets the first rate)
    assert clips == [driver.WARM_COMPILE_TOKENS, driver.WARM_COMPILE_TOKENS, None]
    assert srv.stats.requests == 2  # ceil(1 req/s (cpu-smoke's rate_min) x 1.5 s), sent for real
    assert lines == ["t: warmed up (18 requests at concurrency 1, 2, 4 in turn, 16 output tokens "
                     "below 4, then Poisson at 1 req/s for 1.5 s, not measured)"]  # fmt: skip


def test_cpu_warm_up_has_no_open_loop_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    def ok(*a: Any, **kw: Any) -> Any:
        return SimpleNamespace(fixed={"n_ok": kw["num_requests"]})

    monkeypatch.setattr(probe, "measure_fixed", ok)
    lines: list[str] = []
    d = _driver(lines)
    d.warm_up(probe.Endpoint("http://127.0.0.1:1", "m"), "t")  # nothing listens: none sent
    assert lines == ["t: warmed up (16 requests at concurrency 8, not measured)"]


def test_a_warm_up_where_every_request_failed_stops_with_the_servers_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server answering HTTP 500 must not read as "warmed up" then "SLO not met"."""
    from pytest_moeperf.run.driver import WarmUpFailed

    fixed = {"n_ok": 0, "failed_by_status": {"http_error": 4},
             "first_error": "http_error HTTP 500: boom"}  # fmt: skip
    monkeypatch.setattr(probe, "measure_fixed", lambda *a, **kw: SimpleNamespace(fixed=fixed))
    lines: list[str] = []
    d = _driver(lines)
    with pytest.raises(WarmUpFailed) as err:
        d.warm_up(probe.Endpoint("http://127.0.0.1:1", "m"), "t")
    assert "every warm-up request to http://127.0.0.1:1 failed (http_error 4)" in str(err.value)
    assert "HTTP 500: boom" in str(err.value)
    assert not any("warmed up" in line for line in lines)


@pytest.mark.parametrize(
    ("finished", "start", "said"),
    [
        (
            30.0,
            15.0,
            "; the first search starts at 15 req/s (0.5 x the 30 req/s finished at concurrency 8)",
        ),
        (1.5, 1.0, "; the first search starts at 1 req/s (search.rate_min)"),  # cpu-smoke: 1
        (
            400.0,
            160.0,
            "; the first search starts at 160 req/s (0.5 x the 400 req/s finished "
            "at concurrency 8, capped at search.rate_max)",
        ),
    ],
)
def test_the_first_search_starts_at_half_the_warm_ups_throughput(
    monkeypatch: pytest.MonkeyPatch, finished: float, start: float, said: str
) -> None:
    """Not below search.rate_min; later runs still start from the previous bracket."""

    def ok(*a: Any, **kw: Any) -> Any:
        return SimpleNamespace(fixed={"n_ok": kw["num_requests"], "request_throughput": finished})

    monkeypatch.setattr(probe, "measure_fixed", ok)
    lines: list[str] = []
    d = _driver(lines)
    ep = probe.Endpoint("http://127.0.0.1:1", "m")
    d.warm_up(ep, "t")
    assert lines == [f"t: warmed up (16 requests at concurrency 8, not measured){said}"]
    calls = _fake_search(monkeypatch, [(20.0, 21.0), (20.0, 21.0)])
    d.run(ep, 0, "t run 1/2")
    d.run(ep, 1, "t run 2/2")
    assert [c["start_rate"] for c in calls] == [start, 20.0]
    assert all(c["rate_min"] == 1.0 for c in calls)  # the floor stays the spec's
    other = probe.Endpoint("http://127.0.0.1:2", "m")  # another server: not warmed here
    _fake_search(monkeypatch, [(20.0, 21.0)])
    assert d._warm.get(other.base_url) is None


def _simulated_load(url: str, model: str, requests: Any, **kw: Any) -> Any:
    """Each request answered 50 ms after its send, 8 tokens 5 ms apart: exact probe sizes."""
    from pytest_moeperf.load.records import RequestRecord, RunRecord

    recs = []
    for r in requests:
        times = [r.arrival_s + 0.05 + 0.005 * k for k in range(r.max_tokens)]
        recs.append(RequestRecord(index=r.index, scheduled_s=r.arrival_s, send_s=r.arrival_s,
                                  input_tokens=r.input_tokens, max_tokens=r.max_tokens,
                                  first_token_s=times[0], end_s=times[-1],
                                  output_tokens=len(times), token_times_s=times))  # fmt: skip
    return RunRecord("poisson", kw["target"], 1.0, 0, recs[-1].end_s or 0.0, recs, 0.0)


def test_a_probe_rerun_for_too_few_sends_does_not_lengthen_the_probes_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first probe at rate_min holds too few sends and is rerun longer; the next probe, at a
    higher rate, has enough sends in the spec's span and stays that short. Before, the rerun's
    span was kept for every later probe: on 2 CPU cores 30 sends at 4 req/s made every probe of
    the session 16 s long, 240 requests at 15 req/s. The load is simulated (each request
    answered 50 ms after its send, 8 tokens 5 ms apart), so the sizes are exact."""
    from pytest_moeperf.load import runner

    monkeypatch.setattr(runner, "run_load", _simulated_load)
    spec = _spec("search: {rate_min: 4, rate_max: 16, tolerance: 0.1, max_probes: 3, "
                 "probe_requests: 10, probe_duration_s: 3}\n")  # fmt: skip
    lines: list[str] = []
    run = probe.measure_run(probe.Endpoint("http://127.0.0.1:1", "m"), spec, spec.slo, index=0,
                            meter=NotMeasuredMeter("test"), vocab_size=1024, rate_min=4.0,
                            probe_requests=10, max_probes=3, mbu_inputs=None,
                            say=lines.append)  # fmt: skip
    assert run.search is not None
    first, second = run.search.probes  # 4 (rerun longer), then 16 = rate_max
    assert first.rate == 4.0 and second.rate == 16.0 and second.met
    (retry,) = first.summary["too_short_attempts"]
    assert "fewer than 30" in retry["reason"]
    assert first.summary["n_requests"] > 40  # 30 sends in the window at 4 req/s, with room
    assert second.summary["n_requests"] == 48  # 16 req/s x 3 s, what 30 sends need there
    assert not second.summary.get("too_short_attempts")
    assert lines == [lines[0]] and "too short to judge" in lines[0]


def test_a_later_probe_near_a_rate_that_was_rerun_starts_with_the_longer_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every probe replays one schedule, so a probe at a rate that was too short before comes
    out too short again: a 2-core e2e run reran 8 probes, 4 of them at rates already rerun
    (~15 s each). The runs of one server share ``longer_at``: the next run's probe at (or
    within 10 % of) such a rate starts with the span the rerun needed and is not rerun."""
    from pytest_moeperf.load import runner

    sizes: list[int] = []

    def fake_load(url: str, model: str, requests: Any, **kw: Any) -> Any:
        sizes.append(len(requests))
        return _simulated_load(url, model, requests, **kw)

    monkeypatch.setattr(runner, "run_load", fake_load)
    spec = _spec("search: {rate_min: 4, rate_max: 16, tolerance: 0.1, max_probes: 3, "
                 "probe_requests: 10, probe_duration_s: 3}\n")  # fmt: skip
    shared: dict[float, float] = {}

    def one_run(start: float) -> list[Any]:
        run = probe.measure_run(probe.Endpoint("http://127.0.0.1:1", "m"), spec, spec.slo,
                                index=0, meter=NotMeasuredMeter("test"), vocab_size=1024,
                                rate_min=4.0, probe_requests=10, max_probes=3, mbu_inputs=None,
                                start_rate=start, longer_at=shared)  # fmt: skip
        assert run.search is not None
        return list(run.search.probes)

    first = one_run(4.0)
    assert first[0].summary["too_short_attempts"] and set(shared) == {4.0}
    rerun_size = first[0].summary["n_requests"]
    sizes.clear()
    again = one_run(4.2)  # 5 % away from the rate that was rerun
    assert again[0].rate == 4.2 and not again[0].summary.get("too_short_attempts")
    assert sizes[0] >= round(rerun_size * 4.2 / 4.0) - 1  # the remembered span, not 3 s
    assert probe.remembered_span(shared, 4.5) is None  # 12.5 % away: the spec's span
    assert probe.remembered_span(None, 4.0) is None


def test_a_warm_started_probe_says_so_on_its_line() -> None:
    from pytest_moeperf.run.driver import _warm_text

    assert _warm_text(None) == "" and _warm_text({"requests": 0}) == ""
    assert _warm_text({"requests": 97, "fill_s": 7.43}) == (
        ", warm start 97 requests, window from 7.4 s")  # fmt: skip
    assert _warm_text({"requests": 5, "fill_s": float("inf")}) == ", warm start 5 requests"
