"""Summarize one load run over its steady-state window, with vLLM's metric definitions.

Definitions follow ``vllm/benchmarks/serve.py`` (``calculate_metrics``): TTFT, TPOT =
(E2EL - TTFT) / (output - 1) for outputs of 2+ tokens, ITL = gaps between successive streamed
chunks, E2EL; percentiles are numpy's linear ones. Two deliberate differences:

* Only requests *sent* inside the window [first send + warmup, last send - cooldown] count, so
  ramp-up and drain do not dilute a steady-state number; throughputs divide what happened inside
  the window (tokens arriving, requests finishing) by the window length.
* Failed requests are never dropped: they count as SLO misses, are reported by status, and enter
  the TTFT / TPOT / E2EL percentiles as +inf, so a run that loses its slowest requests cannot
  look faster than one that serves them. Means are over successful requests only. Tokens of
  failed or cancelled requests never count in a throughput: the server produced them, but
  nobody received an answer.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.records import RequestRecord, RunRecord
from pytest_moeperf.spec.model import Slo

PERCENTILES = (50.0, 90.0, 99.0)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile of ascending values, but +inf-safe.

    ``np.percentile`` returns nan when it interpolates towards +inf with weight 0 (inf * 0);
    here a weight of 0 returns the lower value and any weight towards +inf returns +inf.
    """
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a, b = sorted_values[lo], sorted_values[hi]
    if frac == 0.0 or a == b:
        return a
    if math.isinf(b) or math.isinf(a):
        return math.inf
    return a + (b - a) * frac


@dataclass(frozen=True)
class LatencyStats:
    """One latency metric in ms; ``n`` values entered the percentiles, ``n_inf`` were failures."""

    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    n: int
    n_inf: int = 0

    @classmethod
    def of(cls, values_s: Sequence[float]) -> LatencyStats:
        vals = sorted(values_s)
        finite = [v for v in vals if math.isfinite(v)]
        mean = sum(finite) / len(finite) * 1000.0 if finite else math.nan
        p50, p90, p99 = (percentile(vals, q) * 1000.0 for q in PERCENTILES)
        return cls(mean, p50, p90, p99, len(vals), len(vals) - len(finite))


@dataclass(frozen=True)
class Window:
    """The steady-state window on the run clock and what fell inside it."""

    start_s: float
    end_s: float
    n_requests: int
    n_ok: int
    n_failed: int

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class LoadSummary:
    mode: str
    target: float
    n_requests: int
    n_ok: int
    failed_by_status: dict[str, int]
    window: Window
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    output_tok_s: float
    request_throughput: float
    request_goodput: float
    token_goodput_tok_s: float
    slo_attainment: float
    slo: dict[str, float | None]
    slo_met: bool
    slo_violations: tuple[str, ...]
    mean_input_tokens: float
    mean_output_tokens: float
    aborted_early: bool = False
    abort_reason: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the first failed request's status and error text: what a user needs when all failed
    first_error: str | None = None
    #: output tokens of the ok requests *sent* in the window, per second of window. Unlike
    #: ``output_tok_s`` (tokens *produced* in the window, whoever sent them) it has no term for
    #: the queue at the window's edges: at one rate on the H200 the produced figure moved
    #: 95-107 % of rate x tokens between runs. NaN in summaries recorded before it existed.
    sent_tok_s: float = math.nan
    #: streamed tokens per SSE chunk of the window's ok requests (1.0: one token an event).
    #: Above 1 the stream merged tokens: the server's API process or this client read late, so
    #: TTFT and ITL include that lag. On the H200 it reached 5-10 near the boundary (FP8: 2 at
    #: 8 req/s); where it is high, the client or the API server, not the GPU, sets the p99s.
    tokens_per_chunk: float = math.nan
    #: p99 of (actual send - scheduled send), ms, over the window: the client's own lag
    send_lag_p99_ms: float = math.nan

    @property
    def n_failed(self) -> int:
        return sum(self.failed_by_status.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON; +inf stays a float (``json.dumps`` writes ``Infinity``)."""
        d = asdict(self)
        d["slo_violations"] = list(self.slo_violations)
        d["notes"] = list(self.notes)
        d["window"]["length_s"] = self.window.length_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoadSummary:
        d = dict(d)
        win = dict(d["window"])
        win.pop("length_s", None)
        d["window"] = Window(**win)
        for key in ("ttft", "tpot", "itl", "e2el"):
            d[key] = LatencyStats(**d[key])
        d["slo_violations"] = tuple(d.get("slo_violations", ()))
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)


def request_meets_slo(r: RequestRecord, slo: Slo) -> bool:
    """vLLM goodput rule: ok, TTFT and TPOT (0 for 1-token outputs) and E2EL within the SLO."""
    e2el = r.projected_e2el_s
    if not (r.ok or r.cut) or r.ttft_s is None or e2el is None:
        return False
    tpot = r.tpot_s or 0.0
    if r.ttft_s * 1000.0 > slo.ttft_p99_ms or tpot * 1000.0 > slo.tpot_p99_ms:
        return False
    return slo.e2el_p99_ms is None or e2el * 1000.0 <= slo.e2el_p99_ms


def _sent_tokens(records: Sequence[RequestRecord]) -> int:
    """Output tokens of the requests; a cut one counts what it asked for (``ignore_eos`` pins
    the length: it would have produced that many)."""
    return sum(r.max_tokens if r.cut else r.output_tokens for r in records)


def _tokens_per_chunk(ok: Sequence[RequestRecord]) -> float:
    """Tokens over distinct arrival times (a chunk of k tokens repeats its time k times)."""
    tokens = sum(len(r.token_times_s) for r in ok)
    chunks = sum(1 + sum(1 for a, b in itertools.pairwise(r.token_times_s) if b != a)
                 for r in ok if r.token_times_s)  # fmt: skip
    return tokens / chunks if chunks else math.nan


def _chunk_gaps(times: Sequence[float]) -> list[float]:
    """Gaps between successive chunks: repeated times (k tokens in one chunk) form one chunk."""
    gaps = []
    for a, b in itertools.pairwise(times):
        if b != a:
            gaps.append(b - a)
    return gaps


def steady_window(
    requests: Sequence[RequestRecord], warmup_s: float, cooldown_s: float
) -> tuple[float, float]:
    """[first send + warmup, last send - cooldown]; raises if that leaves nothing to measure."""
    if not requests:
        raise UsageError("summarize()", "run.requests", [], "the run has no requests",
                         "run at least a few requests before summarizing")  # fmt: skip
    if warmup_s < 0 or cooldown_s < 0:
        raise UsageError("summarize()", "warmup_s/cooldown_s", (warmup_s, cooldown_s),
                         "must be >= 0", "pass non-negative seconds")  # fmt: skip
    sends = [r.send_s for r in requests]
    start, end = min(sends) + warmup_s, max(sends) - cooldown_s
    if end <= start:
        raise UsageError(
            "summarize()", "window", (round(start, 3), round(end, 3)),
            f"warmup {warmup_s:.3g} s + cooldown {cooldown_s:.3g} s leave no steady-state window "
            f"in {max(sends) - min(sends):.3g} s of sends",
            "lower window.warmup_* / window.cooldown_fraction or send more requests",
        )  # fmt: skip
    return start, end


def summarize(run: RunRecord, slo: Slo, *, warmup_s: float, cooldown_s: float) -> LoadSummary:
    """Steady-state metrics of one run, judged against ``slo`` (p99 TTFT/TPOT/E2EL targets)."""
    start, end = steady_window(run.requests, warmup_s, cooldown_s)
    length = end - start
    inside = [r for r in run.requests if start <= r.send_s <= end]
    if not inside:
        raise UsageError("summarize()", "window", (start, end), "contains no request sends",
                         "widen the window or send more requests")  # fmt: skip
    ok = [r for r in inside if r.ok]
    counted = [r for r in inside if r.ok or r.cut]  # a cut request streamed, it did not fail
    notes: list[str] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    e2els: list[float] = []
    itls: list[float] = []
    cut = [r for r in inside if r.cut]
    if cut:
        notes.append(
            f"{len(cut)} requests of the window were still streaming at the drain's end "
            "and were cut: TPOT over the tokens they received, E2EL projected from it"
        )
    for r in inside:
        if r.cut and r.ttft_s is not None:
            ttfts.append(r.ttft_s)
            if (tp := r.tpot_s) is not None:
                tpots.append(tp)
            e2els.append(r.projected_e2el_s or math.inf)
            itls.extend(_chunk_gaps(r.token_times_s))
            continue
        if not r.ok or r.ttft_s is None or r.e2el_s is None:
            if r.ok:
                notes.append(f"request {r.index}: status ok but no token arrived; counted inf")
            ttfts.append(math.inf)
            tpots.append(math.inf)
            e2els.append(math.inf)
            continue
        ttfts.append(r.ttft_s)
        e2els.append(r.e2el_s)
        if (tp := r.tpot_s) is not None:
            tpots.append(tp)
        itls.extend(_chunk_gaps(r.token_times_s))
    good = [r for r in inside if request_meets_slo(r, slo)]

    def tokens_in_window(rs: Sequence[RequestRecord]) -> int:
        return sum(1 for r in rs if r.ok or r.cut for t in r.token_times_s if start <= t <= end)

    finished = [r for r in run.requests if r.ok and r.end_s is not None and start <= r.end_s <= end]
    good_ids = {id(r) for r in run.requests if request_meets_slo(r, slo)}
    ttft, tpot, e2el = LatencyStats.of(ttfts), LatencyStats.of(tpots), LatencyStats.of(e2els)
    violations = []
    for label, stats, limit in (
        ("ttft", ttft, slo.ttft_p99_ms), ("tpot", tpot, slo.tpot_p99_ms),
        ("e2el", e2el, slo.e2el_p99_ms),
    ):  # fmt: skip
        if limit is not None and stats.n and not stats.p99_ms <= limit:
            violations.append(f"p99 {label} {stats.p99_ms:.1f} ms > {limit:g} ms")
    if run.aborted_early:
        violations.append(f"aborted early: {run.abort_reason or 'no reason given'}")
    failed = Counter(r.status for r in run.requests if not (r.ok or r.cut))
    first_bad = next((r for r in run.requests
                      if not (r.ok or r.cut) and r.status != "cancelled"), None)  # fmt: skip
    first_error = None
    if first_bad is not None:
        code = f" HTTP {first_bad.http_status}" if first_bad.http_status else ""
        first_error = f"{first_bad.status}{code}: {(first_bad.error or 'no message')[:300]}"
    return LoadSummary(
        mode=run.mode,
        target=run.target,
        n_requests=len(run.requests),
        n_ok=len(run.requests) - sum(failed.values()),
        failed_by_status=dict(sorted(failed.items())),
        window=Window(start, end, len(inside), len(counted), len(inside) - len(counted)),
        ttft=ttft,
        tpot=tpot,
        itl=LatencyStats.of(itls),
        e2el=e2el,
        output_tok_s=tokens_in_window(run.requests) / length,
        request_throughput=len(finished) / length,
        request_goodput=sum(1 for r in finished if id(r) in good_ids) / length,
        token_goodput_tok_s=tokens_in_window([r for r in run.requests if id(r) in good_ids])
        / length,
        slo_attainment=len(good) / len(inside),
        slo=asdict(slo),
        slo_met=not violations,
        slo_violations=tuple(violations),
        mean_input_tokens=sum(r.input_tokens for r in inside) / len(inside),
        mean_output_tokens=_sent_tokens(counted) / len(counted) if counted else 0.0,
        aborted_early=run.aborted_early,
        abort_reason=run.abort_reason,
        notes=tuple(notes),
        first_error=first_error,
        sent_tok_s=_sent_tokens(counted) / length,
        tokens_per_chunk=_tokens_per_chunk(ok),
        send_lag_p99_ms=LatencyStats.of(
            [max(r.send_s - r.scheduled_s, 0.0) for r in inside]
        ).p99_ms,
    )


def failed_text(summary: dict[str, Any]) -> str:
    """``", 3 failed (http_error 2, timeout 1)"`` for a progress line; "" when none failed."""
    failed = summary.get("failed_by_status") or {}
    if not failed:
        return ""
    parts = ", ".join(f"{k} {v}" for k, v in sorted(failed.items()))
    return f", {sum(failed.values())} failed ({parts})"
