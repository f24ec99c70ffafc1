"""Warm start (``load.warmstart``): the population it sends, and what a warm probe's window sees.

The simulations are chat-mix-v1 at the H100's measured pace (TTFT 150 ms, TPOT 24 ms, as in
``test_steady.py``), with a prefill burst: every warm request gets its first token ``burst``
seconds late. Their figures were measured when written and are stated in each docstring.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.load.records import RequestRecord, RequestSpec
from pytest_moeperf.load.steady import fill_up_s, in_system_series, judge
from pytest_moeperf.load.warmstart import (
    WARM_INDEX_BASE,
    Pace,
    durations,
    is_warm,
    past_burst,
    pick_pace,
    warm_fill_up_s,
    warm_population,
)

TTFT, TPOT, RATE = 0.15, 0.024, 2.7
PACE = Pace(TTFT, TPOT, RATE, "test")


def chat_pairs() -> tuple[tuple[int, int], ...]:
    from pytest_moeperf.load.requests import planned_lengths
    from pytest_moeperf.spec.model import WorkloadSpec

    return planned_lengths(WorkloadSpec(trace="chat-mix-v1", num_requests=1000, seed=0), 8192)


def outputs() -> list[int]:
    return [o for _, o in chat_pairs()]


def plan(rate: float = RATE, seed: int = 0, max_seqs: int = 256, pace: Pace = PACE):  # type: ignore[no-untyped-def]
    return warm_population(chat_pairs(), rate=rate, pace=pace, vocab_size=1000,
                           max_seqs=max_seqs, seed=(seed,))  # fmt: skip


def test_the_population_is_the_steady_states_size_and_length_biased() -> None:
    """rate x E[D] requests (2.7 req/s x ~11 s: ~30), picked in proportion to their duration:
    the lengths they were drawn from average ~3 x the workload's mean; each keeps its input +
    output total and has at least one token left to generate."""
    pairs = chat_pairs()
    mean_d = statistics.fmean(durations(outputs(), PACE))
    means, remaining = [], []
    for seed in range(40):
        p = plan(seed=seed)
        assert len(p.requests) == round(RATE * mean_d) and not p.capped
        assert p.steady_requests == pytest.approx(RATE * mean_d)
        assert all(r.index >= WARM_INDEX_BASE and r.arrival_s == 0.0 for r in p.requests)
        assert all(r.max_tokens >= 1 and r.input_tokens + r.max_tokens <= 8192
                   for r in p.requests)  # fmt: skip
        remaining += [r.max_tokens for r in p.requests]
        means.append(statistics.fmean(r.input_tokens + r.max_tokens for r in p.requests))
    workload_total = statistics.fmean(i + o for i, o in pairs)
    assert statistics.fmean(means) > 1.3 * workload_total  # long requests are over-represented
    # the residual of a length-biased draw has the mean E[D^2] / (2 E[D]) (in tokens here)
    outs = outputs()
    expected = statistics.fmean(o * o for o in outs) / (2 * statistics.fmean(outs))
    assert statistics.fmean(remaining) == pytest.approx(expected, rel=0.15)


def test_the_population_is_seeded_capped_and_fresh() -> None:
    a, b, c = plan(seed=1), plan(seed=1), plan(seed=2)
    assert a.requests == b.requests and a.requests != c.requests
    capped = plan(rate=100.0, max_seqs=64)
    assert len(capped.requests) == 64 and capped.capped
    assert capped.to_dict()["requests"] == 64
    prompts = {r.prompt_token_ids[:16] for r in plan(rate=10.0).requests}
    assert len(prompts) == len(plan(rate=10.0).requests)  # no two share a prefix
    assert not plan(rate=1e-6).requests  # less than half a request: none


def test_pick_pace_prefers_the_nearest_rate_seen() -> None:
    closed = Pace(0.2, 0.03, None, "warm-up at concurrency 64")
    assert pick_pace([], 5.0) is None
    assert pick_pace([closed], 5.0) is closed
    near = [closed, Pace(0.1, 0.02, 2.0, "a"), Pace(0.3, 0.04, 8.0, "b")]
    assert pick_pace(near, 3.0) is near[1] and pick_pace(near, 7.9) is near[1]
    assert pick_pace(near, 8.0) is near[2] and pick_pace(near, 1.0) is near[1]


def simulate(seed: int, rate: float = RATE, span: float = 45.0, burst: float = 1.0,
             slots: int | None = None, warm: bool = True,
             pace_tpot: float = TPOT) -> list[RequestRecord]:  # fmt: skip
    """Warm population (sized at ``pace_tpot``) at t = 0 plus Poisson sends for ``span`` s.
    Without ``slots`` no request waits (M/G/inf) and the warm ones get their first token
    ``burst`` s late; with ``slots`` requests queue FIFO for that many (M/G/c)."""
    from pytest_moeperf.spec.traces import CHAT_MIX_V1, lognormal_params

    rng = random.Random(seed)
    mu, sigma = lognormal_params(*CHAT_MIX_V1["output"])
    sends: list[tuple[float, int, int]] = []
    if warm:
        pace = Pace(TTFT, pace_tpot, rate, "sim")
        sends += [(0.0, r.max_tokens, r.index) for r in plan(rate, seed, pace=pace).requests]
    t, i = 0.0, 0
    while (t := t + rng.expovariate(rate)) <= span:
        sends.append((t, min(8192, max(2, round(rng.lognormvariate(mu, sigma)))), i))
        i += 1
    free = [0.0] * (slots or 1)
    out = []
    for send, n, idx in sends:
        late = burst if idx >= WARM_INDEX_BASE and not slots else 0.0
        begin = max(send, heapq.heappop(free)) if slots else send
        end = begin + late + TTFT + (n - 1) * TPOT
        if slots:
            heapq.heappush(free, end)
        out.append(RequestRecord(index=idx, scheduled_s=send, send_s=send, input_tokens=1024,
                                 max_tokens=n, first_token_s=begin + late + TTFT, end_s=end,
                                 output_tokens=n))  # fmt: skip
    return out


def window(recs: list[RequestRecord], fill: float) -> tuple[float, float]:
    """The probe's window: the later of 10 % of the span and the fill-up, 10 % cut at the end."""
    first, last = min(r.send_s for r in recs), max(r.send_s for r in recs)
    span = last - first
    return first + max(0.1 * span, fill), last - 0.1 * span


def test_a_warm_45_s_probe_opens_at_the_burst_and_holds_the_steady_population() -> None:
    """Cold, a chat-mix probe fills to 90 % only ~37.5 s after its first send (a 45 s probe is
    too short); warm, its window opens at the burst (1 s) + one TTFT: 4.5 s (10 % of the span)
    and holds ~100 % of rate x E[D] from there on (mean over 100 seeds 0.99 when written)."""
    outs = outputs()
    steady = RATE * statistics.fmean(durations(outs, PACE))
    ratios, fills = [], []
    for seed in range(100):
        recs = simulate(seed)
        fill, info = warm_fill_up_s(recs, outs, RATE)
        fills.append(fill)
        assert info["burst_s"] == pytest.approx(1.0 + TTFT)
        start, end = window(recs, fill)
        ratios.append(statistics.fmean(n for _, n in in_system_series(recs, start, end))
                      / steady)  # fmt: skip
    assert max(fills) < 2.0
    assert statistics.fmean(ratios) == pytest.approx(1.0, abs=0.05)
    cold = simulate(0, warm=False)
    assert fill_up_s(cold, outs) > 30.0


def test_warm_45_s_probes_are_judged_steady_where_cold_ones_are_too_short() -> None:
    """100 seeds of 45 s at 2.7 req/s with ample capacity: warm, 100/100 judged and steady when
    written; cold, 100/100 too short (the window opens before the fill-up)."""
    outs = outputs()
    warm_ok = cold_short = 0
    for seed in range(100):
        for warm in (True, False):
            recs = simulate(seed, warm=warm)
            own = [r for r in recs if not is_warm(r)]
            fill = warm_fill_up_s(recs, outs, RATE)[0] if warm else fill_up_s(recs, outs)
            start, end = window(recs, fill)
            c = judge(recs, start, end, ttft_slo_ms=2000.0,
                      median_e2el_s=statistics.median(r.e2el_s or 0.0 for r in own),
                      first_send_s=recs[0].send_s if not warm else 0.0, fill_s=fill)  # fmt: skip
            warm_ok += warm and c.steady
            cold_short += (not warm) and c.too_short
    assert warm_ok >= 97 and cold_short == 100


def p99(values: list[float]) -> float:
    v = sorted(values)
    return v[max(0, math.ceil(0.99 * len(v)) - 1)]


@pytest.mark.parametrize("load", [1.2, 1.3, 1.5])
def test_an_overloaded_warm_probe_does_not_meet(load: float) -> None:
    """Over what 40 slots serve (M/G/40), 60 s warm probes, 50 seeds: "steady and p99 TTFT <=
    2 s" held 0 times at 1.2, 1.3 and 1.5 x when written. Starting full does not hide an
    overload: warm 60 s and cold 120 s probes agreed at every load (100 seeds; steady alone
    7 vs 3 at 1.2 x, 1 vs 1 at 1.3 x; met 4 vs 2 at 1.1 x, 7 vs 5 at 1.04 x)."""
    outs = outputs()
    rate = load * 40 / statistics.fmean(durations(outs, PACE))
    met = 0
    for seed in range(50):
        recs = simulate(seed, rate=rate, span=60.0, slots=40)
        fill = warm_fill_up_s(recs, outs, rate)[0]
        start, end = window(recs, fill)
        own = [r for r in recs if not is_warm(r)]
        c = judge(recs, start, end, ttft_slo_ms=2000.0,
                  median_e2el_s=statistics.median(r.e2el_s or 0.0 for r in own),
                  first_send_s=0.0, fill_s=fill)  # fmt: skip
        inside = [r.ttft_s or math.inf for r in own if start <= r.send_s <= end]
        met += c.steady and p99(inside) <= 2.0
    assert met == 0


def test_a_population_sized_at_twice_the_pace_waits_to_settle() -> None:
    """Sized at TPOT 48 ms where the server runs at 24 ms, the warm start is twice too large:
    the window may open only once the excess has left (~8-15 s when written), not at the
    burst; sized right it opens at the burst."""
    outs = outputs()
    over = [warm_fill_up_s(simulate(s, pace_tpot=2 * TPOT), outs, RATE)[0] for s in range(20)]
    right = [warm_fill_up_s(simulate(s), outs, RATE)[0] for s in range(20)]
    assert min(over) > 3 * max(right)
    assert all(math.isfinite(f) for f in over)


def test_warm_fill_up_is_nan_before_any_own_request_finished() -> None:
    only_warm = [RequestRecord(index=WARM_INDEX_BASE, scheduled_s=0.0, send_s=0.0,
                               input_tokens=8, max_tokens=4)]  # fmt: skip
    assert math.isnan(warm_fill_up_s(only_warm, [4], 1.0)[0])
    assert not is_warm(RequestRecord(index=3, scheduled_s=0.0, send_s=0.0, input_tokens=8,
                                     max_tokens=4))  # fmt: skip
    assert isinstance(plan().requests[0], RequestSpec)


WARM_SPEC = """\
name: warm-probe
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
workload: {trace: chat-mix-v1, num_requests: 200, seed: 0, scale: 0.1, max_output_tokens: 200,
           max_input_tokens: 64}
arrival: {process: poisson}
slo: {ttft_p99_ms: 2000, tpot_p99_ms: 200}
search: {rate_min: 60, rate_max: 61, tolerance: 0.2, max_probes: 2, probe_requests: 20,
         probe_duration_s: 3, warm_start: true}
runs: 1
"""


def test_a_warm_started_probe_on_a_streaming_server(tmp_path: Path, serve: Any) -> None:
    """measure_run against the synthetic SSE server (10 ms decode steps): with a pace known,
    each probe begins with the population of its rate, records what it sent, and its window
    opens after the burst but no request of the burst enters it; the probe's pace is kept
    for the next one."""
    from pytest_moeperf.metrics.energy import NotMeasuredMeter
    from pytest_moeperf.run.probe import Endpoint, measure_run
    from pytest_moeperf.spec.loader import load_spec

    url, _ = serve(delay_s=0.01, metrics=True)
    path = tmp_path / "spec.yaml"
    path.write_text(WARM_SPEC)
    spec = load_spec(path)
    assert spec.search is not None and spec.search.warm_start
    paces = [Pace(0.01, 0.011, None, "warm-up at concurrency 8")]
    run = measure_run(Endpoint(url, "m"), spec, spec.slo, index=0,
                      meter=NotMeasuredMeter("test"), vocab_size=500, rate_min=60.0,
                      probe_requests=20, max_probes=2, mbu_inputs=None,
                      paces=paces)  # fmt: skip
    assert run.search is not None
    first = run.search.probes[0].summary
    warm = first["warm_start"]
    assert warm["requests"] == round(warm["steady_requests"]) > 5
    assert warm["pace"]["source"] == "warm-up at concurrency 8"
    assert math.isfinite(warm["fill_s"]) and warm["fill_s"] >= warm["burst_s"]
    window = first["window"]
    own_sends = first["n_requests"] - warm["requests"]
    assert window["n_requests"] <= own_sends  # the burst is outside the window
    assert window["start_s"] >= warm["fill_s"]
    assert len(paces) >= 2 and paces[1].rate == 60.0  # the probe's own pace, for the next


def test_a_missed_probes_pace_never_sizes_a_warm_start(tmp_path: Path, serve: Any) -> None:
    """Every probe misses (TPOT SLO 1 ms at 10 ms decode steps): no pace is kept from them, so
    each later probe is sized at the warm-up's pace, never at an overloaded probe's (on an H100
    that began a 6.48 req/s probe with 240 requests where ~90 belong)."""
    from pytest_moeperf.metrics.energy import NotMeasuredMeter
    from pytest_moeperf.run.probe import Endpoint, measure_run
    from pytest_moeperf.spec.loader import load_spec

    url, _ = serve(delay_s=0.01, metrics=True)
    path = tmp_path / "spec.yaml"
    path.write_text(WARM_SPEC.replace("tpot_p99_ms: 200", "tpot_p99_ms: 1"))
    spec = load_spec(path)
    paces = [Pace(0.01, 0.011, None, "warm-up at concurrency 8")]
    run = measure_run(Endpoint(url, "m"), spec, spec.slo, index=0,
                      meter=NotMeasuredMeter("test"), vocab_size=500, rate_min=60.0,
                      probe_requests=20, max_probes=2, mbu_inputs=None,
                      paces=paces)  # fmt: skip
    assert run.search is not None and not any(p.met for p in run.search.probes)
    assert len(paces) == 1
    sources = {p.summary["warm_start"]["pace"]["source"] for p in run.search.probes}
    assert sources == {"warm-up at concurrency 8"}


def _req(index: int, send: float, ttft: float | None, out: int = 50) -> RequestRecord:
    first = None if ttft is None else send + ttft
    end = None if first is None else first + TPOT * (out - 1)
    return RequestRecord(index=index, scheduled_s=send, send_s=send, input_tokens=1024,
                         max_tokens=out, first_token_s=first, end_s=end,
                         output_tokens=out if end is not None else 0)  # fmt: skip


def test_the_abort_check_does_not_judge_requests_queued_behind_the_warm_burst() -> None:
    """H100, 2026-12-06: a warm 3.8 req/s chat-mix probe stopped on "3 requests already missed
    the ttft SLO; p99 cannot be met with 171 planned requests", finishing 100 % of what was due;
    another run met 3.8 at p99 1,058 ms. Requests sent while 46 warm prompts were prefilled at
    once wait behind them; the window never reads them, and neither may the abort check."""
    from pytest_moeperf.run.abort import AbortPolicy
    from pytest_moeperf.spec.model import Slo

    check = AbortPolicy(planned_requests=171).make(Slo(ttft_p99_ms=2000, tpot_p99_ms=50), 3.8)
    warm = [_req(WARM_INDEX_BASE + j, 0.0, 0.1 * (j + 1)) for j in range(46)]  # served by 4.6 s
    own = [_req(i, i / 3.8, 2.5 if i / 3.8 < 2.0 else 0.3) for i in range(60)]  # 8 queued
    assert check(own, 16.0) is not None  # judged on everything: stopped
    kept = past_burst([*warm, *own])
    assert kept and min(r.send_s for r in kept) >= 4.6 + 0.3  # burst + one median TTFT
    assert check(kept, 16.0) is None
    late = [_req(i, 10.0 + i / 3.8, 2.5) for i in range(60, 64)]  # misses after it still count
    assert check(past_burst([*warm, *own, *late]), 16.0) is not None


def test_while_the_burst_waits_for_a_first_token_no_request_is_judged() -> None:
    warm = [_req(WARM_INDEX_BASE, 0.0, None), _req(WARM_INDEX_BASE + 1, 0.0, 0.2)]
    own = [_req(i, i / 3.8, 2.5) for i in range(10)]
    assert past_burst([*warm, *own]) == []
    assert past_burst([*warm, *own], now_s=10.0, patience_s=22.5) == []
    # half the sends gone and the burst still unserved: no window can hold a steady state any
    # more, and an overloaded probe must still stop (else it ran to its drain)
    assert past_burst([*warm, *own], now_s=22.5, patience_s=22.5) == own
    assert past_burst(own) == own  # a cold probe: every request
