"""Is a probe a steady state? Only then may its p99s say "met" and its throughput be goodput.

An open-loop probe at a rate the server cannot sustain still "meets" a p99 SLO when it ends
before the queue has grown enough to push p99 TTFT past the limit (on an H200, 20 s probes at
15 req/s completed only 81-88 % of the offered requests and were reported met). So a probe is
met only when, over its measured window, all of these hold:

* **long enough to judge**: the window spans at least ``MIN_WINDOW_E2EL`` median request
  latencies and holds at least ``MIN_WINDOW_SENDS`` sends, and it starts only once the server
  has *filled up* (``fill_up_s``): holds ``FILL_FRACTION`` of the requests that a steady state
  at this rate holds, and no earlier than one median latency after the first send. Before that
  the batch is smaller than the rate's, so every latency read there is low: on an H100 chat-mix
  probes opened their window 6-8 s after the first send, where requests that last up to a
  minute had filled the server to about half, and the window produced 62 % of the tokens that
  the rate asks for. A shorter probe is *too short*: neither met nor missed, it is rerun
  longer (one whose window fails a rule below is missed all the same: an unfilled server is the
  better case);
* **keeping up**: requests finished inside the window at no less than ``1 - COMPLETION_MARGIN``
  of the rate that were *due* in it. A request is due when it would finish at the window's own
  pace: its send time plus the window's median TTFT plus its length times the median TPOT
  (``due_times``). With one output length this is the send rate, shifted by one latency; with
  mixed lengths it is not: chat-mix's tail (p90 1,024 tokens, ~25 s on an H100) has not begun
  to finish when a 40 s probe's window opens, and an H100 probe at 2.7 req/s whose p99 TTFT was
  227 ms finished 67 % of what it *sent* in the window while keeping up. A shortfall larger than
  counting noise (three standard deviations of the change in requests in the system, about
  sqrt(2 x mean in the system)) is falling behind; one within it cannot be told from noise, and
  the probe is *too short*: rerun with more sends, never met on that window;
* **no growing queue**: requests in the system (sent, not finished; from the client's records)
  beyond those the same pace keeps there, and, where the server exports it,
  ``vllm:num_requests_waiting`` show no upward trend whose growth over the window exceeds
  ``queue_limit`` (counting noise, or a quarter of the mean in the system, plus
  ``QUEUE_GROWTH_MIN``); TTFT of successive requests rises by no more than
  ``TTFT_RISE_FRACTION`` of the TTFT SLO over the window.

Trends are Theil-Sen slopes (robust to the odd slow request) with their 95 % interval; a trend
counts only when the interval excludes zero *and* the growth is large enough to matter, since
samples of a queue are autocorrelated and the interval alone is too narrow.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pytest_moeperf.load.records import RequestRecord

MIN_WINDOW_E2EL = 3.0
FILL_FRACTION = 0.9
MIN_WINDOW_SENDS = 30
COMPLETION_MARGIN = 0.10
QUEUE_GROWTH_MIN = 4.0
QUEUE_GROWTH_FRACTION = 0.25
TTFT_RISE_FRACTION = 0.25
GRID_POINTS = 40


@dataclass(frozen=True)
class Trend:
    """Theil-Sen slope (per second) with its 95 % interval, and growth over the window."""

    slope: float
    low: float
    high: float
    growth: float
    mean: float

    def rising(self, threshold: float) -> bool:
        return self.low > 0 and self.growth > threshold


@dataclass(frozen=True)
class SteadyCheck:
    """The verdict and the figures behind it, recorded per probe."""

    steady: bool
    too_short: bool
    reasons: tuple[str, ...]
    window_s: float
    sends: int
    completions: int
    offered_rps: float
    completed_rps: float
    #: requests that would have finished in the window at its own pace (see ``due_times``)
    due: int = 0
    in_system: Trend | None = None
    waiting: Trend | None = None
    ttft: Trend | None = None
    server_metrics: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def due_rps(self) -> float:
        return self.due / self.window_s if self.window_s > 0 else 0.0

    @property
    def completion_ratio(self) -> float:
        """Finished over due: 1.0 for a server that keeps its pace, whatever the lengths."""
        return self.completed_rps / self.due_rps if self.due_rps > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["notes"] = list(self.notes)
        d["completion_ratio"] = self.completion_ratio
        d["due_rps"] = self.due_rps
        return d


def trend(points: Sequence[tuple[float, float]], window_s: float) -> Trend | None:
    """Theil-Sen fit of (t, y); None with fewer than 8 points or no spread in t."""
    if len(points) < 8:
        return None
    from scipy.stats import theilslopes

    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if max(xs) - min(xs) <= 0:
        return None
    slope, _, low, high = theilslopes(ys, xs, alpha=0.95)
    return Trend(float(slope), float(low), float(high), float(slope) * window_s,
                 sum(ys) / len(ys))  # fmt: skip


def queue_limit(mean_in_system: float) -> float:
    """Growth over the window that counts as a growing queue: ``QUEUE_GROWTH_MIN`` plus the
    larger of ``QUEUE_GROWTH_FRACTION`` of the mean and the counting noise of a steady queue
    (3 x sqrt(2 x mean + 1), as for falling behind). On the H200 the fraction alone (11-12 at a
    mean of 30) rejected probes whose completions kept up; the noise term keeps the two rules of
    one quantity (sends - completions = growth of the queue) consistent."""
    noise = 3.0 * math.sqrt(2.0 * max(mean_in_system, 0.0) + 1.0)
    return QUEUE_GROWTH_MIN + max(QUEUE_GROWTH_FRACTION * mean_in_system, noise)


def in_system_series(records: Sequence[RequestRecord], start: float, end: float,
                     points: int = GRID_POINTS) -> list[tuple[float, float]]:  # fmt: skip
    """Requests sent and not yet finished at evenly spaced times of the window."""
    out = []
    for i in range(points):
        t = start + (end - start) * i / (points - 1)
        n = sum(1 for r in records if r.send_s <= t and (r.end_s is None or r.end_s > t))
        out.append((t, float(n)))
    return out


def fill_time(durations: Sequence[float], fraction: float = FILL_FRACTION) -> float:
    """Seconds of sends after which the server holds ``fraction`` of its steady-state requests.

    Requests arriving at a steady rate from t = 0, each staying D seconds, number rate x
    E[min(D, t)] at t, against rate x E[D] for good: the fill depends on the durations alone,
    not on the rate or the arrival process. One length fills in ``fraction`` x D; chat-mix's
    lognormal outputs (p99 ~12 x the median) take ~3.6 x their mean (57 s at 35 ms a token)."""
    ds = sorted(d for d in durations if math.isfinite(d) and d >= 0)
    total = sum(ds)
    if not ds or total <= 0:
        return 0.0
    goal, below = fraction * total, 0.0  # sum(min(D, t)) = below + (n - k) t on [ds[k-1], ds[k]]
    for k, d in enumerate(ds):
        if below + (len(ds) - k) * d >= goal:
            return (goal - below) / (len(ds) - k)
        below += d
    return ds[-1]


def fill_up_s(records: Sequence[RequestRecord], lengths: Sequence[int] = ()) -> float:
    """When a probe's window may open, from its first send: the later of ``fill_time`` and the
    median latency (nan when no request finished). With ``lengths`` (the workload's planned
    output lengths, many of them) the durations are modelled as the probe's median TTFT plus
    (length - 1) x its median TPOT: a probe's own ~100 chat-mix latencies put the fill anywhere
    from 21 to 134 s (one 3,000-token request moves it), the workload's 2,000 lengths do not."""
    e2els = [e for r in records if r.ok and (e := r.e2el_s) is not None]
    if not e2els:
        return math.nan
    tpots = [t for r in records if r.ok and (t := r.tpot_s) is not None]
    ttfts = [t for r in records if r.ok and (t := r.ttft_s) is not None]
    durations: Sequence[float] = e2els
    if lengths and tpots and ttfts:
        ttft, tpot = statistics.median(ttfts), statistics.median(tpots)
        durations = [ttft + max(n - 1, 0) * tpot for n in lengths]
    return max(fill_time(durations), statistics.median(e2els))


def due_times(records: Sequence[RequestRecord], start: float, end: float,
              median_e2el_s: float) -> list[float]:  # fmt: skip
    """When each request would finish at the window's own pace: send + median TTFT + (length - 1)
    x median TPOT, over the ok requests sent in the window (length: tokens received by a finished
    request, else the tokens asked for). Only lengths vary, so a server that keeps up finishes
    what is due, while one that falls behind finishes later and later. Without a TPOT (one-token
    outputs, nothing finished) every request is due one median latency after its send."""
    ok = [r for r in records if r.ok and start <= r.send_s <= end]
    ttfts = [t for r in ok if (t := r.ttft_s) is not None]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    if not ttfts or not tpots:
        e2el = median_e2el_s if math.isfinite(median_e2el_s) else 0.0
        return [r.send_s + e2el for r in records]
    ttft, tpot = statistics.median(ttfts), statistics.median(tpots)

    def length(r: RequestRecord) -> int:
        return r.output_tokens if r.ok and r.output_tokens > 0 else r.max_tokens

    return [r.send_s + ttft + max(length(r) - 1, 0) * tpot for r in records]


def excess_series(records: Sequence[RequestRecord], due: Sequence[float],
                  series: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:  # fmt: skip
    """``series`` (``in_system_series``) less the requests the window's pace keeps there (sent,
    not yet due): flat for a steady server whatever its lengths; rising for one that falls
    behind."""
    return [(t, n - sum(1 for r, d in zip(records, due, strict=True) if r.send_s <= t < d))
            for t, n in series]  # fmt: skip


def _fill_words(records: Sequence[RequestRecord]) -> str:
    """Why filling up takes as long as it does, in the probe's own figures."""
    e2els = sorted(e for r in records if r.ok and (e := r.e2el_s) is not None)
    if not e2els:
        return "no request finished"
    p99 = e2els[min(len(e2els) - 1, math.ceil(0.99 * len(e2els)) - 1)]
    return (
        f"requests lasted {statistics.median(e2els):.1f} s median, {p99:.1f} s p99; a "
        f"steady state holds {100 * FILL_FRACTION:.0f} % of its requests only then"
    )


def judge(records: Sequence[RequestRecord], start: float, end: float, *, ttft_slo_ms: float,
          median_e2el_s: float, waiting: Sequence[tuple[float, float]] | None = None,
          first_send_s: float | None = None,
          fill_s: float | None = None) -> SteadyCheck:  # fmt: skip
    """Judge the window [start, end] (run clock, seconds) of one probe's records; ``fill_s`` is
    ``fill_up_s`` with the workload's lengths (from the records alone when None)."""
    length = end - start
    sends = [r for r in records if start <= r.send_s <= end]
    done = [r for r in records if r.ok and r.end_s is not None and start <= r.end_s <= end]
    due_at = due_times(records, start, end, median_e2el_s)
    due = sum(1 for d in due_at if start <= d <= end)
    offered = len(sends) / length if length > 0 else 0.0
    due_rps = due / length if length > 0 else 0.0
    completed = len(done) / length if length > 0 else 0.0
    reasons: list[str] = []
    notes: list[str] = []
    short: list[str] = []
    e2el = median_e2el_s if math.isfinite(median_e2el_s) else 0.0
    if length <= 0:  # no rate can be read over no time (sends at one instant, no latency)
        short.append(f"window [{start:.1f}, {end:.1f}] s has no length")
    elif length < MIN_WINDOW_E2EL * e2el:
        short.append(f"window {length:.1f} s is shorter than {MIN_WINDOW_E2EL:g} median "
                     f"request latencies ({MIN_WINDOW_E2EL * e2el:.1f} s)")  # fmt: skip
    if len(sends) < MIN_WINDOW_SENDS:
        short.append(f"window holds {len(sends)} sends, fewer than {MIN_WINDOW_SENDS}")
    # ``fill_up_s`` is at least one median latency; a warm start's (``load.warmstart``) is not
    fill = fill_up_s(records) if fill_s is None else fill_s
    fill = fill if math.isfinite(fill) else e2el
    unfilled = None
    if first_send_s is not None and start - first_send_s < fill * (1 - 1e-9):
        unfilled = (
            f"window starts {start - first_send_s:.1f} s after the first send, before "
            f"the server filled up ({fill:.1f} s: {_fill_words(records)})"
        )
        if start - first_send_s < e2el * (1 - 1e-9):  # not even one latency: judge nothing
            short.append(unfilled)
    if short:  # nothing below can be judged on so little: rerun longer
        return SteadyCheck(False, True, tuple(short), length, len(sends), len(done), offered,
                           completed, due, notes=tuple(notes))  # fmt: skip
    sys_trend = None
    if length > 0:
        series = in_system_series(records, start, end)
        actual = trend(series, length)
        excess = trend(excess_series(records, due_at, series), length)
        if actual is not None and excess is not None:  # the limit scales with the real queue
            sys_trend = replace(excess, mean=actual.mean)
    # At a steady state what was due and what finished in the window differ by the change in
    # the number of requests in the system, whose spread is about sqrt(mean in the system).
    mean_n = sys_trend.mean if sys_trend is not None else 0.0
    noise = 3.0 * math.sqrt(2.0 * mean_n + 1.0)
    shortfall = due - len(done)
    unsure: str | None = None
    if due_rps > 0 and completed < (1 - COMPLETION_MARGIN) * due_rps:
        kept = (f"{completed:.3g} req/s finished against {due_rps:.3g} req/s due in the "
                f"window ({100 * completed / due_rps:.0f} % < "
                f"{100 * (1 - COMPLETION_MARGIN):.0f} %)")  # fmt: skip
        if shortfall > noise:
            reasons.append(f"falling behind: {kept}")
        else:  # neither keeping up nor surely behind: on the H200 an 87 % probe passed as
            # counting noise and set half the boundary of the other runs. More sends decide.
            unsure = (f"{kept}, a shortfall of {shortfall} within the window's counting noise "
                      f"({noise:.0f}): cannot tell falling behind from noise")  # fmt: skip
    if sys_trend is not None:
        limit = queue_limit(sys_trend.mean)
        if sys_trend.rising(limit):
            reasons.append(f"queue growing: requests in the system rose by "
                           f"{sys_trend.growth:.0f} over the window beyond what their lengths "
                           f"explain (mean {sys_trend.mean:.0f}, limit {limit:.0f})")  # fmt: skip
    wait_trend = None
    if waiting:
        pts = [(t, v) for t, v in waiting if start <= t <= end]
        wait_trend = trend(pts, length) if length > 0 else None
        mean_sys = sys_trend.mean if sys_trend is not None else 0.0
        limit = queue_limit(mean_sys)
        if wait_trend is not None and wait_trend.rising(limit):
            reasons.append(
                f"server queue growing: vllm:num_requests_waiting rose by "
                f"{wait_trend.growth:.0f} over the window (limit {limit:.0f})"
            )
    else:
        notes.append("no server queue samples (no vLLM /metrics): judged on client records")
    pts = sorted((r.send_s, t) for r in sends if r.ok and (t := r.ttft_s) is not None)
    ttft_trend = trend(pts, length) if length > 0 else None
    rise_limit = TTFT_RISE_FRACTION * ttft_slo_ms / 1e3
    if ttft_trend is not None and ttft_trend.rising(rise_limit):
        reasons.append(f"TTFT rising: +{ttft_trend.growth * 1e3:.0f} ms over the window "
                       f"(limit {rise_limit * 1e3:.0f} ms)")  # fmt: skip
    # An unfilled server holds fewer requests than the rate's steady state, so what it shows is
    # the better case: a failure there stands; a pass waits for a longer probe (an overloaded
    # queue's growing latencies push the fill-up out, and must not hide its failure).
    too_short = (unsure is not None or unfilled is not None) and not reasons
    if too_short:
        reasons.extend(x for x in (unfilled, unsure) if x is not None)
    return SteadyCheck(
        steady=not reasons, too_short=too_short, reasons=tuple(reasons), window_s=length,
        sends=len(sends),
        completions=len(done), offered_rps=offered, completed_rps=completed, due=due,
        in_system=sys_trend, waiting=wait_trend, ttft=ttft_trend,
        server_metrics=bool(waiting), notes=tuple(notes),
    )  # fmt: skip
