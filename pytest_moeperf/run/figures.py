"""A run's figures from its load: SLO goodput and p99s at the boundary, tok/J, power, MBU.

Apart from ``probe`` (which drives the load) because these are pure arithmetic over what a
load recorded: the search run and the fixed-concurrency run read their figures the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_moeperf.load.records import RunRecord
from pytest_moeperf.metrics.energy import EnergyReading
from pytest_moeperf.run.search import SearchResult


@dataclass(frozen=True)
class MbuInputs:
    """What MBU needs beyond the run: the model's shape, dtype, GPUs and rated bandwidth."""

    shape: Any  # metrics.model_shape.ModelShape
    dtype: str
    gpus: int
    bandwidth_bytes_s: float | None
    bandwidth_source: str
    #: KV-cache and LM-head element types when they differ from ``dtype`` (quantized weights)
    kv_dtype: str | None = None
    lm_head_dtype: str | None = None


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
    # The boundary is a steady state, where requests finish as fast as they arrive: its output
    # rate is the rate times the tokens a request produces. The window's own count of tokens
    # (``output_tok_s`` in the probe's summary, kept there) is that figure plus counting noise
    # (+-5 % at 400 requests), which would widen the band for nothing.
    estimate = search.estimate if search.estimate is not None else rate
    m["slo_goodput_tok_s"] = float(estimate * s["mean_output_tokens"])
    m["slo_rate_rps"] = float(estimate)
    m["ttft_p99_ms"] = finite(s["ttft"]["p99_ms"])
    m["tpot_p99_ms"] = finite(s["tpot"]["p99_ms"])
    m["e2el_p99_ms"] = finite(s["e2el"]["p99_ms"])
    reading, run = readings[rate]
    energy_and_mbu(m, notes, reading, run, s, mbu_inputs)
    return m, notes


def energy_and_mbu(m: dict[str, float | None], notes: list[str], reading: EnergyReading,
                    run: RunRecord, summary: dict[str, Any],
                    mbu_inputs: MbuInputs | None) -> None:  # fmt: skip
    """tok/J, board power and MBU of one load run, or the reason each is not measured."""
    if reading.joules is not None and reading.joules > 0:
        tokens = sum(r.output_tokens for r in run.requests if r.ok or r.cut)
        m["tok_per_j"] = tokens / reading.joules
        m["power_w"] = reading.avg_power_w
    else:
        notes.append(f"energy not measured: {reading.reason}")
    if mbu_inputs is None or mbu_inputs.bandwidth_bytes_s is None:
        why = mbu_inputs.bandwidth_source if mbu_inputs else "no model shape"
        notes.append(f"MBU not measured: {why}")
    else:
        m["mbu"] = decode_mbu(summary, mbu_inputs)


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
    step = decode_step_bytes(inp.shape, batch, context, inp.dtype, kv_dtype=inp.kv_dtype,
                             lm_head_dtype=inp.lm_head_dtype)  # fmt: skip
    return mbu(step, tpot_s, inp.bandwidth_bytes_s, gpus=inp.gpus)


def finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)
