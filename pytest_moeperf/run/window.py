"""A probe's window: when it may open (the fill-up, or a warm start's), how long the probe
must send for it, how its drain ends, and the steady-state check over it.

``run.probe`` drives the load; what is read off it, and when, lives here (docs/steady-state.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.records import RequestSpec, RunRecord
from pytest_moeperf.load.warmstart import is_warm
from pytest_moeperf.spec.model import Slo, Spec

if TYPE_CHECKING:
    from pytest_moeperf.load.warmstart import Pace, WarmPlan
    from pytest_moeperf.metrics.summary import LoadSummary

#: The abort reason that ends a probe's drain (``search.drain_s``): not an abort (``mark_cut``).
DRAIN_CUT = "drain ended"


def drain_end(spec: Spec, requests: Sequence[RequestSpec]) -> float | None:
    """When a probe stops waiting for its requests (run clock), or None to wait for all."""
    drain = spec.search.drain_s if spec.search else None
    if drain is None or not requests:
        return None
    return max(r.arrival_s for r in requests) + drain


def mark_cut(run: RunRecord) -> RunRecord:
    """A run ended by its drain (``DRAIN_CUT``) is complete: the requests it stopped after
    their first token are ``cut`` (their TPOT is read on the tokens they received), those
    without one stay ``cancelled`` (drain_s is at least the TTFT SLO: they missed it)."""
    if run.abort_reason != DRAIN_CUT:
        return run
    recs = [replace(r, status="cut", end_s=None, error=None)
            if r.status == "cancelled" and r.first_token_s is not None else r
            for r in run.requests]  # fmt: skip
    return replace(run, requests=recs, aborted_early=False, abort_reason=None)


def median_e2el_s(run: RunRecord) -> float:
    """Median latency of the run's own successful requests (nan if none; a warm start's
    part-done requests left out): the shortest fill-up and a third of the shortest window."""
    import statistics

    vals = [
        e
        for r in run.requests
        if (r.ok or r.cut) and not is_warm(r) and (e := r.projected_e2el_s) is not None
    ]
    return statistics.median(vals) if vals else math.nan


def needed_span(summary: LoadSummary, spec: Spec, rate: float,
                fill_s: float = math.nan) -> tuple[float, float]:  # fmt: skip
    """Send span whose window, after the fill-up (``fill_s``, ``load.steady.fill_up_s``; one
    median latency when unknown), spans ``MIN_WINDOW_E2EL`` latencies and holds
    ``MIN_WINDOW_SENDS`` sends at ``rate`` (with room for Poisson spread): (the span at this
    rate, the part of it that latency asks for, which later probes keep)."""
    from pytest_moeperf.load.steady import MIN_WINDOW_E2EL, MIN_WINDOW_SENDS

    e2el = summary.e2el.p50_ms / 1e3 if math.isfinite(summary.e2el.p50_ms) else 1.0
    fill = fill_s if math.isfinite(fill_s) else e2el  # a warm start's may be below one latency
    keep = max(1.0 - spec.window.cooldown_fraction - (spec.window.warmup_fraction or 0.0), 0.5)
    by_time = (fill + MIN_WINDOW_E2EL * e2el) / keep
    by_count = fill + 1.5 * MIN_WINDOW_SENDS / rate / keep if rate > 0 else 0.0  # Poisson spread
    return 1.15 * max(by_time, by_count), 1.15 * by_time


def fill_up(run: RunRecord, spec: Spec) -> float:
    """``load.steady.fill_up_s`` over the workload's planned lengths (see there why), or
    ``load.warmstart.warm_fill_up_s`` for a warm-started probe."""
    return fill_up_info(run, spec)[0]


def fill_up_info(run: RunRecord, spec: Spec) -> tuple[float, dict[str, Any]]:
    """``fill_up`` and, for a warm start, the figures behind it."""
    from pytest_moeperf.load.requests import planned_output_lengths
    from pytest_moeperf.load.steady import fill_up_s
    from pytest_moeperf.load.warmstart import warm_fill_up_s

    lengths = planned_output_lengths(spec.workload, spec.model.max_model_len)
    if any(is_warm(r) for r in run.requests):
        return warm_fill_up_s(run.requests, lengths, run.target)
    return fill_up_s(run.requests, lengths), {}


def warm_plan(spec: Spec, paces: Sequence[Pace], rate: float, vocab_size: int,
              seed: tuple[int, ...]) -> WarmPlan | None:  # fmt: skip
    """The probe's warm start (``load.warmstart``): None when the spec asks for none or no
    pace has been seen yet (that probe starts cold and waits for its fill-up)."""
    from pytest_moeperf.load.requests import planned_lengths
    from pytest_moeperf.load.warmstart import pick_pace, warm_population

    if spec.search is None or not spec.search.warm_start:
        return None
    pace = pick_pace(paces, rate)
    if pace is None:
        return None
    plan = warm_population(planned_lengths(spec.workload, spec.model.max_model_len), rate=rate,
                           pace=pace, vocab_size=vocab_size, max_seqs=spec.max_num_seqs,
                           seed=(spec.workload.seed, *seed, 77))  # fmt: skip
    return plan if plan.requests else None


def window_pace(run: RunRecord, summary: LoadSummary, rate: float) -> Pace | None:
    """The pace of the requests sent in the probe's window: what sizes the next warm start."""
    from pytest_moeperf.load.warmstart import Pace

    w = summary.window
    inside = [r for r in run.requests if w.start_s <= r.send_s <= w.end_s]
    return Pace.of(inside, rate, f"probe at {rate:.3g} req/s")


def steady_check(run: RunRecord, summary: LoadSummary, slo: Slo, stats: Any,
                 fill_s: float | None = None) -> Any:  # fmt: skip
    """``load.steady.judge`` over the summary's window, with the server's queue samples."""
    from pytest_moeperf.load.steady import judge

    waiting = stats.series("vllm:num_requests_waiting", run.t0_wall) if stats.samples else None
    first = min(r.send_s for r in run.requests) if run.requests else 0.0
    return judge(run.requests, summary.window.start_s, summary.window.end_s,
                 ttft_slo_ms=slo.ttft_p99_ms, median_e2el_s=median_e2el_s(run),
                 waiting=waiting, first_send_s=first, fill_s=fill_s)  # fmt: skip


def summarize_steady(run: RunRecord, slo: Slo, spec: Spec,
                     fill_s: float | None = None) -> LoadSummary:  # fmt: skip
    """The spec's steady-state window, starting no earlier than the server has filled up
    (``load.steady.fill_up_s``: before that its batch is smaller than the rate's, and every
    latency read there is low; ``fill_s`` when known, else computed here); a run stopped so
    early that the window holds no send (an overload abort after a few requests) is judged on
    everything it sent."""
    from pytest_moeperf.metrics.summary import summarize

    warmup, cooldown = spec.window.resolve(send_span(run))
    if run.mode == "poisson":
        fill = fill_up(run, spec) if fill_s is None else fill_s
        if math.isfinite(fill):
            warmup = max(warmup, fill)
    try:
        return summarize(run, slo, warmup_s=warmup, cooldown_s=cooldown)
    except UsageError:
        own = replace(run, requests=[r for r in run.requests if not is_warm(r)])
        if len(own.requests) < 2:
            raise
        return summarize(own, slo, warmup_s=0.0, cooldown_s=0.0)


def send_span(run: RunRecord) -> float:
    sends = [r.send_s for r in run.requests]
    return (max(sends) - min(sends)) if len(sends) > 1 else 0.0
