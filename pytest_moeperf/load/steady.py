"""Is a probe a steady state? Only then may its p99s say "met" and its throughput be goodput.

An open-loop probe at a rate the server cannot sustain still "meets" a p99 SLO when it ends
before the queue has grown enough to push p99 TTFT past the limit (on an H200, 20 s probes at
15 req/s completed only 81-88 % of the offered requests and were reported met). So a probe is
met only when, over its measured window, all of these hold:

* **long enough to judge**: the window spans at least ``MIN_WINDOW_E2EL`` median request
  latencies and holds at least ``MIN_WINDOW_SENDS`` sends, and it starts no earlier than one
  median latency after the first send (before that the server is still filling up, and every
  rate read there is low); a shorter probe is *too short*: neither met nor missed, it is rerun
  longer;
* **keeping up**: requests finished inside the window at no less than ``1 - COMPLETION_MARGIN``
  of the rate they were sent inside it. A shortfall larger than counting noise (three standard
  deviations of the change in requests in the system, about sqrt(2 x mean in the system)) is
  falling behind; one within it cannot be told from noise, and the probe is *too short*:
  rerun with more sends, never met on that window;
* **no growing queue**: requests in the system (sent, not finished; from the client's records)
  and, where the server exports it, ``vllm:num_requests_waiting`` show no upward trend whose
  growth over the window exceeds ``queue_limit`` (counting noise, or a quarter of the mean in
  the system, plus ``QUEUE_GROWTH_MIN``); TTFT of successive requests rises by no more than
  ``TTFT_RISE_FRACTION`` of the TTFT SLO over the window.

Trends are Theil-Sen slopes (robust to the odd slow request) with their 95 % interval; a trend
counts only when the interval excludes zero *and* the growth is large enough to matter, since
samples of a queue are autocorrelated and the interval alone is too narrow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_moeperf.load.records import RequestRecord

MIN_WINDOW_E2EL = 3.0
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
    in_system: Trend | None = None
    waiting: Trend | None = None
    ttft: Trend | None = None
    server_metrics: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def completion_ratio(self) -> float:
        return self.completed_rps / self.offered_rps if self.offered_rps > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["notes"] = list(self.notes)
        d["completion_ratio"] = self.completion_ratio
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


def judge(records: Sequence[RequestRecord], start: float, end: float, *, ttft_slo_ms: float,
          median_e2el_s: float, waiting: Sequence[tuple[float, float]] | None = None,
          first_send_s: float | None = None) -> SteadyCheck:  # fmt: skip
    """Judge the window [start, end] (run clock, seconds) of one probe's records."""
    length = end - start
    sends = [r for r in records if start <= r.send_s <= end]
    done = [r for r in records if r.ok and r.end_s is not None and start <= r.end_s <= end]
    offered = len(sends) / length if length > 0 else 0.0
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
    if first_send_s is not None and start - first_send_s < e2el * (1 - 1e-9):
        short.append(f"window starts {start - first_send_s:.1f} s after the first send, "
                     f"before one median request latency ({e2el:.1f} s): the server was "
                     "still filling up")  # fmt: skip
    if short:  # nothing below can be judged on so little: rerun longer
        return SteadyCheck(False, True, tuple(short), length, len(sends), len(done), offered,
                           completed, notes=tuple(notes))  # fmt: skip
    sys_trend = trend(in_system_series(records, start, end), length) if length > 0 else None
    # At a steady state sends and completions in the window differ by the change in the
    # number of requests in the system, whose spread is about sqrt(mean in the system).
    mean_n = sys_trend.mean if sys_trend is not None else 0.0
    noise = 3.0 * math.sqrt(2.0 * mean_n + 1.0)
    shortfall = len(sends) - len(done)
    unsure: str | None = None
    if offered > 0 and completed < (1 - COMPLETION_MARGIN) * offered:
        kept = (f"{completed:.3g} req/s finished against {offered:.3g} req/s sent in the "
                f"window ({100 * completed / offered:.0f} % < "
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
                           f"{sys_trend.growth:.0f} over the window (mean {sys_trend.mean:.0f}, "
                           f"limit {limit:.0f})")  # fmt: skip
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
    too_short = unsure is not None and not reasons  # rerun longer, as for a short window
    if unsure is not None and too_short:
        reasons.append(unsure)
    return SteadyCheck(
        steady=not reasons, too_short=too_short, reasons=tuple(reasons), window_s=length,
        sends=len(sends),
        completions=len(done), offered_rps=offered, completed_rps=completed,
        in_system=sys_trend, waiting=wait_trend, ttft=ttft_trend,
        server_metrics=bool(waiting), notes=tuple(notes),
    )  # fmt: skip
