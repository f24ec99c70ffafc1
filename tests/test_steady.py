"""load.steady: is a probe's window a steady state? Synthetic request records, exact reason texts,
degenerate inputs, and seeded M/M/c streams (steady ones pass, overloaded ones are rejected)."""

from __future__ import annotations

import heapq
import math
import random
import re
import statistics
from collections.abc import Callable
from dataclasses import replace

import pytest

from pytest_moeperf.load.records import RequestRecord, RequestStatus
from pytest_moeperf.load.steady import (
    SteadyCheck,
    Trend,
    due_times,
    excess_series,
    fill_time,
    fill_up_s,
    in_system_series,
    judge,
    queue_limit,
    trend,
)


def rec(i: int, send: float, e2el: float | None, ttft: float | None = 0.1,
        status: RequestStatus = "ok") -> RequestRecord:  # fmt: skip
    return RequestRecord(index=i, scheduled_s=send, send_s=send, input_tokens=100, max_tokens=64,
                         status=status, first_token_s=None if ttft is None else send + ttft,
                         end_s=None if e2el is None else send + e2el, output_tokens=64)  # fmt: skip


def even(rate: float, span: float, latency: float = 2.0,
         ttft: Callable[[float], float] = lambda t: 0.1,
         status: Callable[[int], RequestStatus] = lambda i: "ok",
         ) -> list[RequestRecord]:  # fmt: skip
    """Sends every 1/rate s from 0.5/rate to span; failed ones leave after 10 ms."""
    out = []
    for i in range(round(rate * span)):
        t, st = (i + 0.5) / rate, status(i)
        out.append(rec(i, t, latency if st == "ok" else 0.01, ttft(t), st))
    return out


def run(records: list[RequestRecord], start: float = 5.0, end: float = 35.0, *,
        slo_ms: float = 500.0, e2el: float = 2.0,
        waiting: list[tuple[float, float]] | None = None) -> SteadyCheck:  # fmt: skip
    first = min((r.send_s for r in records), default=start)
    return judge(records, start, end, ttft_slo_ms=slo_ms, median_e2el_s=e2el, waiting=waiting,
                 first_send_s=first)  # fmt: skip


# --- steady ---------------------------------------------------------------------------------


def test_even_stream_is_steady_with_its_figures() -> None:
    c = run(even(10.0, 40.0))
    assert c.steady and not c.too_short and c.reasons == ()
    assert (c.window_s, c.sends, c.completions) == (30.0, 300, 300)
    assert c.offered_rps == pytest.approx(10.0) and c.completion_ratio == pytest.approx(1.0)
    assert c.in_system is not None and c.in_system.mean == pytest.approx(20.0, abs=0.5)
    assert c.ttft is not None and c.ttft.growth == pytest.approx(0.0, abs=1e-9)
    assert c.notes == ("no server queue samples (no vLLM /metrics): judged on client records",)
    d = c.to_dict()
    assert d["steady"] is True and d["reasons"] == [] and d["completion_ratio"] == 1.0
    assert d["in_system"]["mean"] == pytest.approx(20.0, abs=0.5)


def test_one_very_slow_first_token_does_not_make_ttft_rise() -> None:
    recs = even(10.0, 40.0, ttft=lambda t: 1.9 if 30.0 < t < 30.1 else 0.1)
    assert run(recs).steady


# --- too short ------------------------------------------------------------------------------


def test_window_shorter_than_three_latencies() -> None:
    c = run(even(10.0, 40.0), 5.0, 10.5)
    assert c.too_short and not c.steady and c.sends == 55
    assert c.reasons == ("window 5.5 s is shorter than 3 median request latencies (6.0 s)",)
    assert c.in_system is None and c.ttft is None
    assert not run(even(10.0, 40.0), 5.0, 11.0).too_short  # exactly 3 latencies is enough


def test_window_with_too_few_sends() -> None:
    recs = even(1.0, 40.0, latency=0.5)
    c = run(recs, 2.0, 31.0, e2el=0.5)
    assert c.too_short and c.reasons == ("window holds 29 sends, fewer than 30",)
    assert not run(recs, 2.0, 32.0, e2el=0.5).too_short  # 30 sends


def test_window_starting_before_the_server_filled_up() -> None:
    recs = even(10.0, 40.0)
    c = run(recs, 1.05, 35.0)
    assert c.too_short
    assert c.reasons == ("window starts 1.0 s after the first send, before the server filled "
                         "up (2.0 s: requests lasted 2.0 s median, 2.0 s p99; a steady state "
                         "holds 90 % of its requests only then)",)  # fmt: skip
    assert not run(recs, 2.05, 35.0).too_short  # one latency exactly after the first send


def test_all_short_reasons_at_once() -> None:
    c = run(even(10.0, 40.0), 1.0, 3.0)
    assert c.too_short and len(c.reasons) == 3
    assert c.reasons[0].startswith("window 2.0 s is shorter than 3 median request latencies")
    assert c.reasons[1] == "window holds 20 sends, fewer than 30"
    assert c.reasons[2].startswith("window starts 0.9 s after the first send")


# --- degenerate inputs ----------------------------------------------------------------------


def test_no_records() -> None:
    c = judge([], 0.0, 10.0, ttft_slo_ms=500.0, median_e2el_s=math.nan)
    assert c.too_short and c.reasons == ("window holds 0 sends, fewer than 30",)
    assert (c.sends, c.completions, c.offered_rps) == (0, 0, 0.0)
    assert math.isnan(c.completion_ratio) and math.isnan(c.to_dict()["completion_ratio"])


def test_one_record() -> None:
    c = judge([rec(0, 6.0, 1.0)], 5.0, 35.0, ttft_slo_ms=500.0, median_e2el_s=1.0)
    assert c.too_short and c.reasons == ("window holds 1 sends, fewer than 30",)


def test_all_failed_is_falling_behind_not_steady() -> None:
    """No request succeeded, so the median latency is nan (as the probe passes it): the length
    rules fall away and the verdict is 0 req/s finished."""
    recs = even(10.0, 40.0, status=lambda i: "http_error")
    c = run(recs, e2el=math.nan)
    assert not c.steady and not c.too_short and c.completions == 0
    assert c.reasons == ("falling behind: 0 req/s finished against 10 req/s due in the window "
                         "(0 % < 90 %)",)  # fmt: skip
    assert c.ttft is None  # no successful request to fit


@pytest.mark.parametrize("e2el", [0.0, math.nan, math.inf])
def test_identical_timestamps_zero_length_window_is_too_short(e2el: float) -> None:
    """40 sends at one instant, judged over [5, 5]: no rate can be read over no time (this was
    judged steady at 0 req/s before the length check)."""
    recs = [rec(i, 5.0, 0.0, 0.0) for i in range(40)]
    c = run(recs, 5.0, 5.0, e2el=e2el)
    assert c.too_short and not c.steady
    assert c.reasons == ("window [5.0, 5.0] s has no length",)


def test_reversed_window_is_too_short() -> None:
    c = run(even(10.0, 40.0), 35.0, 5.0)
    assert c.too_short and "window [35.0, 5.0] s has no length" in c.reasons


# --- falling behind -------------------------------------------------------------------------


def test_falling_behind_reason_has_the_rates() -> None:
    """Every 5th request fails fast: the queue does not grow, but only 80 % finish."""
    c = run(even(10.0, 40.0, status=lambda i: "http_error" if i % 5 == 0 else "ok"))
    assert (c.sends, c.completions) == (300, 240)
    assert c.reasons == ("falling behind: 8 req/s finished against 10 req/s due in the window "
                         "(80 % < 90 %)",)  # fmt: skip
    assert c.completion_ratio == pytest.approx(0.8)


def test_shortfall_within_counting_noise_is_too_short_to_judge_not_met() -> None:
    """40 sends, 80 % finished: a shortfall of 8 is within 3 sqrt(2 x mean + 1), so the window
    cannot tell falling behind from noise: too short (rerun with more sends), never steady. On
    the H200 an 87 % probe passed as noise and its run reported half the others' boundary.
    A shortfall of 16 is beyond the noise: falling behind."""

    def fails(*bad: int) -> Callable[[int], RequestStatus]:
        return lambda i: "http_error" if i % 5 in bad else "ok"

    small = run(even(2.0, 30.0, 5.0, status=fails(0)), 5.5, 25.5, e2el=5.0)
    assert (small.sends, small.completions) == (40, 32) and small.completion_ratio < 0.9
    assert small.in_system is not None
    assert 3 * math.sqrt(2 * small.in_system.mean + 1) >= 8
    assert small.too_short and not small.steady
    (why,) = small.reasons
    assert why.startswith("1.6 req/s finished against 2 req/s due in the window (80 % < 90 %), "
                          "a shortfall of 8 within the window's counting noise (")  # fmt: skip
    assert why.endswith("): cannot tell falling behind from noise")
    big = run(even(2.0, 30.0, 5.0, status=fails(0, 1)), 5.5, 25.5, e2el=5.0)
    assert (big.sends, big.completions) == (40, 24)
    assert big.reasons == ("falling behind: 1.2 req/s finished against 2 req/s due in the "
                           "window (60 % < 90 %)",)  # fmt: skip


def test_ninety_percent_finished_is_keeping_up_however_large_the_shortfall() -> None:
    c = run(even(100.0, 40.0, 0.5, status=lambda i: "http_error" if i % 10 == 0 else "ok"),
            e2el=0.5)  # fmt: skip
    assert c.sends - c.completions == 300 and c.completion_ratio == pytest.approx(0.9)
    assert c.steady, c.reasons


# --- growing queue --------------------------------------------------------------------------


def fifo(rate: float, capacity: float, span: float, ttft: float | None = None,
         servers: int = 1) -> list[RequestRecord]:  # fmt: skip
    """Even arrivals at ``rate`` into ``servers`` FIFO lines of total ``capacity`` req/s."""
    free, out = [0.0] * servers, []
    for i in range(round(rate * span)):
        t = (i + 0.5) / rate
        begin = max(t, heapq.heappop(free))
        end = begin + servers / capacity
        heapq.heappush(free, end)
        out.append(rec(i, t, end - t, (begin - t + 0.05) if ttft is None else ttft))
    return out


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+(?:\.\d+)?", text)]


def test_overload_gives_all_three_reasons_with_their_numbers() -> None:
    recs = fifo(10.0, 8.0, 40.0)
    med = statistics.median(r.e2el_s or 0.0 for r in recs)
    c = run(recs, 6.0, 34.0, e2el=med)
    assert not c.too_short and len(c.reasons) == 3
    behind, queue, ttft = c.reasons
    assert behind == ("falling behind: 8 req/s finished against 10 req/s due in the window "
                      "(80 % < 90 %)")  # fmt: skip
    assert c.in_system is not None and c.ttft is not None
    growth, mean, limit = numbers(queue)
    assert queue.startswith("queue growing: requests in the system rose by ")
    assert growth == round(c.in_system.growth) and growth == pytest.approx(2 * 28, rel=0.05)
    assert mean == round(c.in_system.mean) and limit == round(queue_limit(c.in_system.mean))
    rise, rise_limit = numbers(ttft)
    assert ttft.startswith("TTFT rising: +") and rise_limit == 125
    assert rise == round(c.ttft.growth * 1e3) and rise == pytest.approx(7000, rel=0.05)


def test_queue_growing_while_completions_keep_up() -> None:
    """46 of 50 req/s finish (92 %, keeping up) but 160 requests pile up over 40 s."""
    c = run(fifo(50.0, 46.0, 50.0, ttft=0.05, servers=64), 5.0, 45.0, e2el=2.0)
    assert c.completion_ratio > 0.9 and c.in_system is not None
    assert len(c.reasons) == 1 and c.reasons[0].startswith("queue growing:"), c.reasons
    growth = numbers(c.reasons[0])[0]
    assert growth == pytest.approx(160, rel=0.1) and growth > queue_limit(c.in_system.mean)


# --- server queue (vllm:num_requests_waiting) -----------------------------------------------


def ramp(f: Callable[[float], float], span: float = 40.0) -> list[tuple[float, float]]:
    return [(k * 0.5, f(k * 0.5)) for k in range(int(span / 0.5) + 1)]


def test_server_waiting_queue_growing() -> None:
    c = run(even(10.0, 40.0), waiting=ramp(lambda t: max(0.0, t - 5.0)))
    assert c.server_metrics and c.notes == () and c.waiting is not None
    assert c.reasons == ("server queue growing: vllm:num_requests_waiting rose by 30 over the "
                         f"window (limit {queue_limit(20.0):.0f})",)  # fmt: skip
    assert queue_limit(20.0) == pytest.approx(4 + 3 * math.sqrt(41))


def test_server_waiting_flat_noisy_or_outside_the_window() -> None:
    noisy = ramp(lambda t: float(int(t * 7) % 5))
    c = run(even(10.0, 40.0), waiting=noisy)
    assert c.steady and c.server_metrics and c.waiting is not None
    before = ramp(lambda t: 100.0 * t if t < 5.0 else 2.0)  # the fill-up, before the window
    assert run(even(10.0, 40.0), waiting=before).steady
    after = ramp(lambda t: 2.0 if t <= 35.0 else 5.0 * (t - 35.0), 100.0)  # the tail, after it
    assert run(even(10.0, 40.0), waiting=after).steady


def test_server_waiting_too_few_samples_in_the_window() -> None:
    """7 samples in [5, 35] (5 more before it): fewer than 8, no trend."""
    c = run(even(10.0, 40.0), waiting=[(float(t), 50.0 * t) for t in range(12)])
    assert c.waiting is None and c.server_metrics and c.steady


# --- rising TTFT ----------------------------------------------------------------------------


def test_ttft_rising_against_a_quarter_of_the_slo() -> None:
    recs = even(10.0, 40.0, ttft=lambda t: 0.1 + 0.3 * t / 40.0)
    c = run(recs, slo_ms=500.0)
    assert c.reasons == ("TTFT rising: +225 ms over the window (limit 125 ms)",)
    assert run(recs, slo_ms=1000.0).steady  # limit 250 ms


# --- helpers --------------------------------------------------------------------------------


def test_trend_fits_and_refuses() -> None:
    assert trend([(float(t), 1.0) for t in range(7)], 10.0) is None  # fewer than 8 points
    assert trend([(3.0, float(y)) for y in range(20)], 10.0) is None  # no spread in t
    t = trend([(float(x), 2.0 * x + 1.0) for x in range(20)], 10.0)
    assert t is not None and t.slope == pytest.approx(2.0) and t.growth == pytest.approx(20.0)
    assert t.mean == pytest.approx(20.0) and t.low == pytest.approx(2.0)
    assert t.rising(19.0) and not t.rising(20.0)
    assert not Trend(slope=1.0, low=-0.1, high=2.0, growth=100.0, mean=5.0).rising(1.0)


def test_queue_limit_values() -> None:
    assert queue_limit(0.0) == pytest.approx(7.0)
    assert queue_limit(-3.0) == pytest.approx(7.0)
    assert queue_limit(30.0) == pytest.approx(4 + 3 * math.sqrt(61))
    assert queue_limit(1000.0) == pytest.approx(254.0)  # the quarter of the mean dominates


def test_in_system_series_counts_sent_and_unfinished() -> None:
    recs = [rec(0, 0.0, 2.0), rec(1, 1.0, None), rec(2, 3.0, 0.5), rec(3, 9.0, 5.0)]
    series = in_system_series(recs, 0.0, 4.0, points=5)
    assert series == [(0.0, 1.0), (1.0, 2.0), (2.0, 1.0), (3.0, 2.0), (4.0, 1.0)]


# --- seeded M/M/c streams -------------------------------------------------------------------

SERVERS, SERVICE_S, PREFILL_S, SPAN_S, SEEDS = 8, 1.0, 0.05, 60.0, 200
CAPACITY = SERVERS / (SERVICE_S + PREFILL_S)


def mmc(seed: int, load: float) -> list[RequestRecord]:
    """Poisson arrivals at ``load`` x capacity into M/M/8 (1 s mean service, 50 ms prefill)."""
    rng = random.Random(seed)
    free, t = [0.0] * SERVERS, 0.0
    out: list[RequestRecord] = []
    while (t := t + rng.expovariate(load * CAPACITY)) <= SPAN_S:
        begin = max(t, heapq.heappop(free))
        end = begin + PREFILL_S + rng.expovariate(1 / SERVICE_S)
        heapq.heappush(free, end)
        out.append(rec(len(out), t, end - t, begin - t + PREFILL_S))
    return out


def probe_like(recs: list[RequestRecord], lengths: tuple[int, ...] = ()) -> SteadyCheck:
    """The probe's window (``run.window.summarize_steady``): 10 % cut at each end, and it opens
    no earlier than the fill-up (``fill_up_s``, with the workload's ``lengths`` if given)."""
    return judge(recs, *window_of(recs, lengths), ttft_slo_ms=500.0,
                 median_e2el_s=statistics.median(r.e2el_s or 0.0 for r in recs),
                 first_send_s=recs[0].send_s, fill_s=fill_up_s(recs, lengths))  # fmt: skip


def window_of(recs: list[RequestRecord], lengths: tuple[int, ...] = ()) -> tuple[float, float]:
    first, last = recs[0].send_s, recs[-1].send_s
    span = last - first
    return first + max(0.1 * span, fill_up_s(recs, lengths)), last - 0.1 * span


def test_steady_poisson_streams_are_rarely_rejected() -> None:
    """At 60 % of capacity, 0 of 200 seeded 60 s streams were rejected when written (at 70 %:
    5 of 200, all 'TTFT rising'; at 80 %: 23, the queue's slow fill-up); allowed: 2 %."""
    checks = [probe_like(mmc(seed, 0.6)) for seed in range(SEEDS)]
    rejected = [c.reasons for c in checks if not c.steady]
    assert len(rejected) <= 0.02 * SEEDS, f"{len(rejected)}/{SEEDS} rejected: {rejected[:3]}"


def test_overloaded_poisson_streams_are_rejected() -> None:
    """At 1.3 x capacity, 200 of 200 seeded streams were not steady when written: 179 judged and
    rejected (176 falling behind, 177 queue growing, 179 TTFT rising), 21 too short (their
    latency, grown with the queue, leaves less than 3 median latencies of window)."""
    checks = [probe_like(mmc(seed, 1.3)) for seed in range(SEEDS)]
    passed = sum(c.steady for c in checks)
    judged = [c for c in checks if not c.too_short]
    assert passed == 0, f"{passed}/{SEEDS} overloaded streams called steady"
    assert len(judged) >= 0.8 * SEEDS, f"only {len(judged)}/{SEEDS} judged"
    behind = sum(any(r.startswith("falling behind") for r in c.reasons) for c in judged)
    assert behind >= 0.95 * len(judged), f"falling behind in {behind}/{len(judged)}"


# --- mixed lengths (chat-mix) ---------------------------------------------------------------

CHAT_TTFT_S, CHAT_TPOT_S, CHAT_RATE = 0.15, 0.024, 2.7


def chat_lengths() -> tuple[int, ...]:
    """chat-mix-v1's planned output lengths at max_model_len 8,192 (2,000 of them)."""
    from pytest_moeperf.load.requests import planned_output_lengths
    from pytest_moeperf.spec.model import WorkloadSpec

    return planned_output_lengths(WorkloadSpec(trace="chat-mix-v1", num_requests=1000, seed=0),
                                  8192)  # fmt: skip


def chat_mix(seed: int, servers: int | None = None, span: float = 40.0) -> list[RequestRecord]:
    """Poisson sends at 2.7 req/s for ``span`` s with chat-mix-v1 output lengths (lognormal,
    median 256, p90 1,024 tokens) at the H100's measured pace (TTFT 150 ms, TPOT 24 ms). With
    ``servers`` the requests queue for that many slots (M/G/c); without, none waits."""
    from pytest_moeperf.spec.traces import CHAT_MIX_V1, lognormal_params

    rng = random.Random(seed)
    mu, sigma = lognormal_params(*CHAT_MIX_V1["output"])
    free = [0.0] * (servers or 1)
    out: list[RequestRecord] = []
    t = 0.0
    while (t := t + rng.expovariate(CHAT_RATE)) <= span:
        n = max(2, round(rng.lognormvariate(mu, sigma)))
        service = CHAT_TTFT_S + (n - 1) * CHAT_TPOT_S
        begin = max(t, heapq.heappop(free)) if servers else t
        if servers:
            heapq.heappush(free, begin + service)
        out.append(RequestRecord(index=len(out), scheduled_s=t, send_s=t, input_tokens=1024,
                                 max_tokens=n, first_token_s=begin + CHAT_TTFT_S,
                                 end_s=begin + service, output_tokens=n))  # fmt: skip
    return out


def test_fill_time_of_one_length_and_of_a_tail() -> None:
    """rate x E[min(D, t)] requests are in the system at t: one length D fills to 90 % at 0.9 D;
    durations 1, 1, 1, 7 (mean 2.5) at t = 4: (1 + 1 + 1 + 4) / 10 = 70 %."""
    assert fill_time([5.0] * 10) == pytest.approx(4.5)
    assert fill_time([1.0, 1.0, 1.0, 7.0], 0.7) == pytest.approx(4.0)
    assert fill_time([1.0, 1.0, 1.0, 7.0], 1.0) == pytest.approx(7.0)
    assert fill_time([]) == 0.0 and fill_time([math.nan, -1.0]) == 0.0
    assert math.isnan(fill_up_s([rec(0, 1.0, None)]))  # nothing finished: unknown


def test_fill_up_uses_the_workloads_lengths_not_the_probes_few() -> None:
    """From a 40 s chat-mix probe's own ~100 latencies the fill-up ranged 21-134 s over 50 seeds
    when written (the longest request moves it); modelled on 2,000 planned lengths with the
    probe's median TTFT and TPOT it is one figure, ~3.4 x the mean latency (37.5 s at 24 ms)."""
    lengths = chat_lengths()
    own = [fill_up_s(chat_mix(seed)) for seed in range(50)]
    modelled = [fill_up_s(chat_mix(seed), lengths) for seed in range(50)]
    assert max(own) > 2.5 * min(own)
    assert max(modelled) - min(modelled) < 0.01 * min(modelled)
    mean_latency = CHAT_TTFT_S + (statistics.mean(lengths) - 1) * CHAT_TPOT_S
    assert 3.0 * mean_latency < modelled[0] < 4.0 * mean_latency


def test_due_times_follow_each_requests_length() -> None:
    """Median TTFT 0.1 s and TPOT 0.02 s of the window's ok requests: a 64-token request is due
    0.1 + 63 x 0.02 s after its send; an unfinished one by the tokens it asked for."""
    recs = [RequestRecord(index=i, scheduled_s=t, send_s=t, input_tokens=8, max_tokens=n,
                          first_token_s=t + 0.1, end_s=t + 0.1 + (n - 1) * 0.02, output_tokens=n)
            for i, (t, n) in enumerate([(1.0, 64), (2.0, 11), (3.0, 64)])]  # fmt: skip
    recs.append(RequestRecord(index=3, scheduled_s=4.0, send_s=4.0, input_tokens=8,
                              max_tokens=501, status="cancelled"))  # fmt: skip
    due = due_times(recs, 0.0, 10.0, median_e2el_s=9.9)
    assert due == pytest.approx([2.36, 2.3, 4.36, 14.1])
    flat = [(float(t), 0.0) for t in range(5)]
    assert excess_series(recs, due, in_system_series(recs, 0.0, 4.0, points=5)) == flat
    nothing_ok = [replace(r, status="http_error") for r in recs]
    assert due_times(nothing_ok, 0.0, 10.0, median_e2el_s=2.0) == [3.0, 4.0, 5.0, 6.0]


def test_a_40_s_chat_mix_probe_never_fills_the_server() -> None:
    """On the H100 (2026-12-05) chat-mix probes of 40 s opened their window 6-8 s after the
    first send, where requests lasting up to a minute had filled the server to about a third
    (its window produced 62 % of the tokens that the rate asks for), and were called met. Now
    every such probe is too short, saying why; it is rerun longer, never met on that window."""
    lengths = chat_lengths()
    for seed in range(20):
        recs = chat_mix(seed)
        first = recs[0].send_s
        c = judge(recs, first + 6.0, recs[-1].send_s - 4.0, ttft_slo_ms=500.0,
                  median_e2el_s=statistics.median(r.e2el_s or 0.0 for r in recs),
                  first_send_s=first, fill_s=fill_up_s(recs, lengths))  # fmt: skip
        assert c.too_short and not c.steady
        assert re.fullmatch(r"window starts 6\.0 s after the first send, before the server "
                            r"filled up \(37\.\d s: requests lasted \d+\.\d s median, "
                            r"\d+\.\d s p99; a steady state holds 90 % of its requests only "
                            r"then\)", c.reasons[0]), c.reasons  # fmt: skip


def test_chat_mix_keeping_its_pace_is_steady_once_filled() -> None:
    """On the H100 (2026-12-05) a chat-mix probe at 2.69 req/s, p99 TTFT 227 ms and TPOT 24 ms,
    was called falling behind: 1.89 req/s finished against 2.81 sent (67 %), its long requests
    not yet finishing in a window that opened before the fill-up. 200 seeded 80 s probes, whose
    windows open once filled, are judged steady (allowed: 2 % rejected), with what finished
    against what was due at 1.0 (and against what was sent, 0.97 in the median when written)."""
    lengths = chat_lengths()
    checks = [probe_like(chat_mix(seed, span=80.0), lengths) for seed in range(SEEDS)]
    rejected = [c.reasons for c in checks if not c.steady]
    assert len(rejected) <= 0.02 * SEEDS, f"{len(rejected)}/{SEEDS} rejected: {rejected[:3]}"
    assert statistics.median(c.completion_ratio for c in checks) == pytest.approx(1.0, abs=0.05)


def test_chat_mix_overloaded_is_rarely_met_once_filled() -> None:
    """The same stream into fewer slots (M/G/c; the load asks for ~29). Counted as a probe
    counts it (steady *and* p99 TTFT <= 2 s), of 200 seeded 80 s probes when written: at 1.8 x
    (16 slots) and 1.46 x (20) none, at 1.21 x (24) 4, at 1.04 x (28) 52, the rest too short
    (rerun longer) or missed. Before the fill-up rule, 40 s probes were met at 1.5 x in 6 and at
    1.25 x in 47 of 200: a chat-mix boundary could read high by ~25 % in one run."""
    lengths = chat_lengths()

    def met(servers: int) -> int:
        n = 0
        for seed in range(SEEDS):
            recs = chat_mix(seed, servers, span=80.0)
            c = probe_like(recs, lengths)
            lo, hi = window_of(recs, lengths)
            ttfts = sorted(r.ttft_s or 0.0 for r in recs if lo <= r.send_s <= hi)
            n += c.steady and bool(ttfts) and ttfts[math.ceil(0.99 * len(ttfts)) - 1] <= 2.0
        return n

    assert met(16) == 0
    assert met(20) == 0
    assert met(24) <= 0.03 * SEEDS
