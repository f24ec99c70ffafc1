"""One measured run: the SLO boundary search over real load, with energy and MBU at the boundary.

A *run* (the unit the variance band is measured over) is one full search: every probe is a fresh
seeded open-loop Poisson load against the server, bracketed by the energy meter. The metrics of
the run are those of the probe at the boundary rate: SLO goodput is its output tok/s.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pytest_moeperf.errors import MoePerfError, UsageError
from pytest_moeperf.load.records import RequestRecord, RunRecord
from pytest_moeperf.load.search import AbortCheck, AbortPolicy, ProbeResult, SearchResult
from pytest_moeperf.metrics.energy import EnergyMeter, EnergyReading
from pytest_moeperf.spec.model import Slo, Spec

if TYPE_CHECKING:
    from pytest_moeperf.metrics.summary import LoadSummary

#: Default shortest send span of a search probe: enough for a queue to build at that rate.
MIN_PROBE_SPAN_S = 5.0


class ServerDied(MoePerfError):
    """The server process exited while a probe was running.

    ``probe_number`` counts from 1 within the run, as the progress lines do; ``partial`` holds
    the run's finished probes and a last entry for the probe the server died in; ``load``
    names a fixed operating point ("concurrency 8") instead of the rate.
    """

    def __init__(self, probe_number: int, rate: float, partial: list[dict[str, Any]],
                 load: str | None = None) -> None:  # fmt: skip
        self.probe_number = probe_number
        self.rate = rate
        self.partial = partial
        where = load or f"rate {rate:g} req/s"
        super().__init__(f"server died during probe {probe_number} at {where}")


@dataclass
class Endpoint:
    """Where the load goes, and how to tell whether the server behind it is still alive."""

    base_url: str
    model: str
    alive: Callable[[], bool] = lambda: True
    server_pid: int | None = None  # leads the server's process group; None when external


@dataclass
class RunMeasurement:
    """One run: an SLO search (``search``) or one fixed-concurrency load (``fixed``)."""

    index: int
    search: SearchResult | None
    energy: list[dict[str, Any]]  # one reading per probe, in probe order
    metrics: dict[str, float | None]
    notes: list[str] = field(default_factory=list)
    fixed: dict[str, Any] | None = None  # the load summary of a fixed-concurrency run

    @property
    def complete(self) -> bool:
        """A run counts for a baseline only when its headline metric was measured."""
        key = "slo_goodput_tok_s" if self.search is not None else "output_tok_s"
        return self.metrics.get(key) is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = self.search.to_dict() if self.search is not None else {}
        d.update(index=self.index, energy=self.energy, metrics=self.metrics, notes=self.notes)
        if self.fixed is not None:
            d["fixed"] = self.fixed
        return d


@dataclass(frozen=True)
class MbuInputs:
    """What MBU needs beyond the run: the model's shape, dtype, GPUs and rated bandwidth."""

    shape: Any  # metrics.mbu.ModelShape
    dtype: str
    gpus: int
    bandwidth_bytes_s: float | None
    bandwidth_source: str


def measure_run(
    endpoint: Endpoint, spec: Spec, slo: Slo, *, index: int, meter: EnergyMeter,
    vocab_size: int, rate_min: float, probe_requests: int, max_probes: int,
    mbu_inputs: MbuInputs | None,
    on_probe: Callable[[int, float, ProbeResult], None] | None = None,
    on_probe_start: Callable[[int, float], None] | None = None,
) -> RunMeasurement:  # fmt: skip
    """One search; ``on_probe_start(probe_number, rate)`` is called before each probe's load."""
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.load.search import search_slo_boundary
    from pytest_moeperf.spec.traces import build_requests

    energy: list[dict[str, Any]] = []
    readings: dict[float, tuple[EnergyReading, RunRecord]] = {}
    done: list[dict[str, Any]] = []
    rate_max = spec.search.rate_max if spec.search else None
    span_s = spec.search.probe_duration_s if spec.search else None

    def size(rate: float) -> int:
        return probe_size(rate, probe_requests, span_s)

    def probe(rate: float, abort: AbortCheck) -> ProbeResult:
        i = len(done)
        requests = build_requests(
            spec.workload, vocab_size=vocab_size, max_model_len=spec.model.max_model_len,
            rate=rate, burstiness=spec.arrival.burstiness, n=size(rate),
            seed_offset=1000 * index + i,
        )  # fmt: skip

        def should_abort(records: Sequence[RequestRecord], now_s: float) -> str | None:
            if not endpoint.alive():
                return "server process exited"
            return abort(records, now_s)

        if on_probe_start is not None:
            on_probe_start(i + 1, rate)
        meter.start()
        run = run_load(endpoint.base_url, endpoint.model, requests, mode="poisson",
                       burstiness=spec.arrival.burstiness, seed=spec.workload.seed,
                       target=rate, should_abort=should_abort)  # fmt: skip
        reading = meter.stop()
        energy.append({"rate": rate, **reading.to_dict()})
        if not endpoint.alive():
            statuses = Counter(r.status for r in run.requests)
            done.append({"rate": rate, "aborted": True, "reason": "server died",
                         "partial": True, "planned_requests": len(requests),
                         "recorded_requests": len(run.requests),
                         "by_status": dict(sorted(statuses.items()))})  # fmt: skip
            raise ServerDied(i + 1, rate, done)
        summary = summarize_steady(run, slo, spec)
        result = ProbeResult.from_summary(rate, summary)
        if run.aborted_early and result.reason is None:
            result = replace(result, met=False, aborted=True, reason=run.abort_reason)
        short = too_short(_send_span(run), summary.e2el.p50_ms / 1e3)
        if result.met and short:
            result = replace(result, met=False, reason=short)
        readings[rate] = (reading, run)
        done.append(result.to_dict())
        return result

    search = search_slo_boundary(probe, slo=slo, rate_min=rate_min, rate_max=rate_max,
                                 tolerance=spec.search.tolerance if spec.search else 0.02,
                                 max_probes=max_probes, on_probe=on_probe,
                                 abort_policy=AbortPolicy(planned_requests=size))  # fmt: skip
    metrics, notes = boundary_metrics(search, readings, mbu_inputs)
    return RunMeasurement(index, search, energy, metrics, notes)


def summarize_steady(run: RunRecord, slo: Slo, spec: Spec) -> LoadSummary:
    """The spec's steady-state window; a run stopped so early that the window holds no send
    (an overload abort after a few requests) is judged on everything it sent."""
    from pytest_moeperf.metrics.summary import summarize

    warmup, cooldown = spec.window.resolve(_send_span(run))
    try:
        return summarize(run, slo, warmup_s=warmup, cooldown_s=cooldown)
    except UsageError:
        if len(run.requests) < 2:
            raise
        return summarize(run, slo, warmup_s=0.0, cooldown_s=0.0)


def probe_size(rate: float, probe_requests: int, span_s: float | None) -> int:
    """Requests of a probe at ``rate``: ``probe_requests``, or more if needed to keep sending
    for ``span_s`` seconds (default ``MIN_PROBE_SPAN_S``).

    A fixed count at a high rate is a burst that ends before a queue can form, so it "meets"
    any SLO (40 requests at 1,000 req/s were all sent in 40 ms and looked fine).
    """
    span = span_s if span_s is not None else MIN_PROBE_SPAN_S
    return max(probe_requests, math.ceil(rate * span))


def too_short(send_span_s: float, median_e2el_s: float) -> str | None:
    """A probe whose sends end before a typical request does never reached a steady state."""
    if math.isfinite(median_e2el_s) and send_span_s < median_e2el_s:
        return (f"probe too short to reach a steady state: sends spanned {send_span_s:.2f} s, "
                f"less than the median request latency {median_e2el_s:.2f} s; raise "
                "search.probe_duration_s")  # fmt: skip
    return None


def _send_span(run: RunRecord) -> float:
    sends = [r.send_s for r in run.requests]
    return (max(sends) - min(sends)) if len(sends) > 1 else 0.0


def boundary_metrics(
    search: SearchResult, readings: dict[float, tuple[EnergyReading, RunRecord]],
    mbu_inputs: MbuInputs | None,
) -> tuple[dict[str, float | None], list[str]]:  # fmt: skip
    """The run's metrics, read off the probe at the boundary rate (None = not measured)."""
    notes: list[str] = []
    rate = search.boundary_rate
    best = next((p for p in search.probes if p.met and p.rate == rate), None)
    m: dict[str, float | None] = dict.fromkeys(
        ("slo_goodput_tok_s", "slo_rate_rps", "ttft_p99_ms", "tpot_p99_ms", "e2el_p99_ms",
         "tok_per_j", "power_w", "mbu"))  # fmt: skip
    if best is None or rate is None:
        notes.append("no rate met the SLO: " + (search.note or "see probes"))
        return m, notes
    s = best.summary
    m["slo_goodput_tok_s"] = float(s["output_tok_s"])
    m["slo_rate_rps"] = float(rate)
    m["ttft_p99_ms"] = _finite(s["ttft"]["p99_ms"])
    m["tpot_p99_ms"] = _finite(s["tpot"]["p99_ms"])
    m["e2el_p99_ms"] = _finite(s["e2el"]["p99_ms"])
    reading, run = readings[rate]
    _energy_and_mbu(m, notes, reading, run, s, mbu_inputs)
    return m, notes


def _energy_and_mbu(m: dict[str, float | None], notes: list[str], reading: EnergyReading,
                    run: RunRecord, summary: dict[str, Any],
                    mbu_inputs: MbuInputs | None) -> None:  # fmt: skip
    """tok/J, board power and MBU of one load run, or the reason each is not measured."""
    if reading.joules is not None and reading.joules > 0:
        tokens = sum(r.output_tokens for r in run.requests if r.ok)
        m["tok_per_j"] = tokens / reading.joules
        m["power_w"] = reading.avg_power_w
    else:
        notes.append(f"energy not measured: {reading.reason}")
    if mbu_inputs is None or mbu_inputs.bandwidth_bytes_s is None:
        why = mbu_inputs.bandwidth_source if mbu_inputs else "no model shape"
        notes.append(f"MBU not measured: {why}")
    else:
        m["mbu"] = decode_mbu(summary, mbu_inputs)


def measure_fixed(
    endpoint: Endpoint, spec: Spec, slo: Slo, *, index: int, meter: EnergyMeter,
    vocab_size: int, concurrency: int, num_requests: int, mbu_inputs: MbuInputs | None,
) -> RunMeasurement:  # fmt: skip
    """One closed-loop run at a fixed concurrency: the case study's measurement, no search.

    Cheaper than a search (one load instead of several probes), so it suits A/B pairs and
    sweeps. The run's metrics are its steady-window output tok/s and p99 latencies; whether the
    SLO held is recorded, not searched for.
    """
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.spec.traces import build_requests

    requests = build_requests(
        spec.workload, vocab_size=vocab_size, max_model_len=spec.model.max_model_len,
        rate=1.0, burstiness=1.0, n=num_requests, seed_offset=1000 * index,
    )  # fmt: skip

    def should_abort(records: Sequence[RequestRecord], now_s: float) -> str | None:
        return None if endpoint.alive() else "server process exited"

    meter.start()
    run = run_load(endpoint.base_url, endpoint.model, requests, mode="concurrency",
                   concurrency=concurrency, seed=spec.workload.seed,
                   should_abort=should_abort)  # fmt: skip
    reading = meter.stop()
    energy = [{"concurrency": concurrency, **reading.to_dict()}]
    if not endpoint.alive():
        partial = [{"concurrency": concurrency, "aborted": True, "reason": "server died"}]
        raise ServerDied(1, float(concurrency), partial, load=f"concurrency {concurrency}")
    summary = summarize_steady(run, slo, spec)
    s = summary.to_dict()
    m: dict[str, float | None] = {
        "output_tok_s": float(summary.output_tok_s),
        "ttft_p99_ms": _finite(summary.ttft.p99_ms),
        "tpot_p99_ms": _finite(summary.tpot.p99_ms),
        "e2el_p99_ms": _finite(summary.e2el.p99_ms),
        "tok_per_j": None, "power_w": None, "mbu": None,
    }  # fmt: skip
    notes: list[str] = []
    if summary.n_failed:
        notes.append(f"{summary.n_failed} of {summary.n_requests} requests failed: "
                     f"{summary.failed_by_status}")  # fmt: skip
    _energy_and_mbu(m, notes, reading, run, s, mbu_inputs)
    return RunMeasurement(index, None, energy, m, notes, fixed=s)


def decode_mbu(summary: dict[str, Any], inp: MbuInputs) -> float | None:
    """MBU at the boundary: Little's law gives the mean decode batch, TPOT the step time."""
    from pytest_moeperf.metrics.mbu import decode_step_bytes, mbu

    tpot_s = summary["tpot"]["mean_ms"] / 1000.0
    tok_s = summary["output_tok_s"]
    if not tpot_s or not math.isfinite(tpot_s) or tpot_s <= 0 or not tok_s:
        return None
    assert inp.bandwidth_bytes_s is not None
    batch = max(1, round(tok_s * tpot_s))
    context = summary["mean_input_tokens"] + summary["mean_output_tokens"] / 2
    step = decode_step_bytes(inp.shape, batch, context, inp.dtype)
    return mbu(step, tpot_s, inp.bandwidth_bytes_s, gpus=inp.gpus)


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)
