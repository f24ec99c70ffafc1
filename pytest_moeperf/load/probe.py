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
from typing import Any

from pytest_moeperf.errors import MoePerfError
from pytest_moeperf.load.records import RequestRecord, RunRecord
from pytest_moeperf.load.search import AbortCheck, ProbeResult, SearchResult
from pytest_moeperf.metrics.energy import EnergyMeter, EnergyReading
from pytest_moeperf.spec.model import Slo, Spec


class ServerDied(MoePerfError):
    """The server process exited while a probe was running.

    ``probe_number`` counts from 1 within the run, as the progress lines do; ``partial`` holds
    the run's finished probes and a last entry for the probe the server died in.
    """

    def __init__(self, probe_number: int, rate: float, partial: list[dict[str, Any]]) -> None:
        self.probe_number = probe_number
        self.rate = rate
        self.partial = partial
        super().__init__(f"server died during probe {probe_number} at rate {rate:g} req/s")


@dataclass
class Endpoint:
    """Where the load goes, and how to tell whether the server behind it is still alive."""

    base_url: str
    model: str
    alive: Callable[[], bool] = lambda: True


@dataclass
class RunMeasurement:
    index: int
    search: SearchResult
    energy: list[dict[str, Any]]  # one reading per probe, in probe order
    metrics: dict[str, float | None]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = self.search.to_dict()
        d.update(index=self.index, energy=self.energy, metrics=self.metrics, notes=self.notes)
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
    from pytest_moeperf.metrics.summary import summarize
    from pytest_moeperf.spec.traces import build_requests

    energy: list[dict[str, Any]] = []
    readings: dict[float, tuple[EnergyReading, RunRecord]] = {}
    done: list[dict[str, Any]] = []
    rate_max = spec.search.rate_max if spec.search else None

    def probe(rate: float, abort: AbortCheck) -> ProbeResult:
        i = len(done)
        requests = build_requests(
            spec.workload, vocab_size=vocab_size, max_model_len=spec.model.max_model_len,
            rate=rate, burstiness=spec.arrival.burstiness, n=probe_requests,
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
        span = _send_span(run)
        warmup, cooldown = spec.window.resolve(span)
        summary = summarize(run, slo, warmup_s=warmup, cooldown_s=cooldown)
        result = ProbeResult.from_summary(rate, summary)
        if run.aborted_early and result.reason is None:
            result = replace(result, met=False, aborted=True, reason=run.abort_reason)
        readings[rate] = (reading, run)
        done.append(result.to_dict())
        return result

    search = search_slo_boundary(probe, slo=slo, rate_min=rate_min, rate_max=rate_max,
                                 tolerance=spec.search.tolerance if spec.search else 0.02,
                                 max_probes=max_probes, on_probe=on_probe)  # fmt: skip
    metrics, notes = boundary_metrics(search, readings, mbu_inputs)
    return RunMeasurement(index, search, energy, metrics, notes)


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
        m["mbu"] = decode_mbu(s, mbu_inputs)
    return m, notes


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
