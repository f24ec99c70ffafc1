"""What a perf test's result records from its runs: metrics per run, the SLO gate, the spec.

Shared by the plain perf test and the A/B gate, so both write the same result record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_moeperf.run.probe import RunMeasurement

if TYPE_CHECKING:
    import pytest

    from pytest_moeperf.baseline import BaselineKey
    from pytest_moeperf.report.schema import BaselineEntry, MetricEntry, ResultRecord
    from pytest_moeperf.run.measure import Plan
    from pytest_moeperf.verdict import Verdict

METRIC_UNITS = {"slo_goodput_tok_s": "tok/s", "slo_rate_rps": "req/s", "output_tok_s": "tok/s",
                "ttft_p99_ms": "ms", "tpot_p99_ms": "ms", "e2el_p99_ms": "ms",
                "tok_per_j": "tok/J", "power_w": "W", "mbu": "fraction"}  # fmt: skip


def collect_metrics(runs: list[RunMeasurement]) -> dict[str, list[float]]:
    """Per metric, the values of the runs that measured it (a missing value is no value)."""
    names = [n for n in METRIC_UNITS if any(n in r.metrics for r in runs)]
    return {n: [v for r in runs if (v := r.metrics.get(n)) is not None] for n in names}


def slo_failures(plan: Plan, runs: list[RunMeasurement]) -> list[str]:
    """The SLO gate: a search must find a rate meeting it; a fixed load must meet it."""
    slo = (f"p99 TTFT <= {plan.slo.ttft_p99_ms:g} ms and p99 TPOT <= "
           f"{plan.slo.tpot_p99_ms:g} ms")  # fmt: skip
    out: list[str] = []
    # A run with no boundary is the strongest regression signal there is, not a missing value:
    # one such run fails the gate (it would otherwise drop out of the verdict's statistics).
    missing = [r for r in runs if r.search is not None and r.search.boundary_rate is None]
    if missing:
        which = ", ".join(f"{r.index + 1}/{plan.runs}" for r in missing)
        note = missing[0].search.note if missing[0].search is not None else ""
        out.append(f"SLO gate ({plan.slo_source}): in run {which} no probed rate met {slo}; "
                   f"{note}")  # fmt: skip
    missed = [r.index + 1 for r in runs if r.fixed is not None and not r.fixed.get("slo_met")]
    if missed:
        c = plan.spec.arrival.concurrency
        out.append(f"SLO gate ({plan.slo_source}): runs {missed} at concurrency {c} missed "
                   f"{slo}")  # fmt: skip
    return out


#: The words by which a run's note speaks of a metric ("energy not measured: ..."); a metric
#: not listed is named by its first word ("tpot" for tpot_p99_ms).
NOTE_WORDS = {"tok_per_j": ("energy",), "power_w": ("energy", "power"), "mbu": ("mbu",)}
#: Why a metric no note speaks of has no value.
UNMEASURED = {"tpot_p99_ms": "not measured: no request streamed two tokens or more (TPOT is "
                             "the time between them)"}  # fmt: skip


def metric_entry(name: str, values: list[float], runs: list[RunMeasurement]) -> MetricEntry:
    """A metric's runs, unit and median; without values, why (the notes that speak of it: an
    energy note is not the reason a TPOT is missing)."""
    import statistics

    from pytest_moeperf.report.schema import MetricEntry

    entry = MetricEntry(runs=values, unit=METRIC_UNITS[name],
                        center=statistics.median(values) if values else None)  # fmt: skip
    if not values:
        words = NOTE_WORDS.get(name, (name.split("_")[0],))
        notes = sorted({n for r in runs for n in r.notes if any(w in n.lower() for w in words)})
        entry.note = "; ".join(notes) or UNMEASURED.get(name, "not measured")
    return entry


def spec_summary(plan: Plan) -> dict[str, Any]:
    s = plan.spec
    w = s.workload
    trace = f"{w.trace} {w.input_tokens}/{w.output_tokens}" if w.trace == "fixed" else w.trace
    return {"name": s.name, "path": s.source, "hash": s.hash()[:16], "trace": trace,
            "arrival": f"{s.arrival.process}, burstiness {s.arrival.burstiness:g}",
            "slo": {"ttft_p99_ms": plan.slo.ttft_p99_ms, "tpot_p99_ms": plan.slo.tpot_p99_ms,
                    "e2el_p99_ms": plan.slo.e2el_p99_ms}, "slo_source": plan.slo_source,
            "runs": plan.runs, "probe_requests": plan.probe_requests}  # fmt: skip


def vocab_size(model_dir: Path | None) -> int:
    """Token ids in prompts must be valid for both the model and its tokenizer."""
    if model_dir is None:
        return 1000
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    tok = model_dir / "tokenizer.json"
    if tok.exists():
        t = json.loads(tok.read_text())
        size = len(t.get("model", {}).get("vocab", {})) + len(t.get("added_tokens", []))
        vocab = min(vocab, max(size, 1))
    return vocab


def result_table(data: ResultRecord, verdicts: Sequence[Verdict]) -> str:
    """The terminal table of one perf test; drawn again once a deferred refresh is settled."""
    from pytest_moeperf.report.table import format_verdict_table

    lines = [f"{'metric':<20} {'median':>12} {'runs':>5}  unit"]
    for name, e in (data.metrics or {}).items():
        c = e.center
        text = "not measured" if c is None else f"{c:.4g}"
        lines.append(f"{name:<20} {text:>12} {len(e.runs or []):>5}  {e.unit}")
    lines.append(f"moe config: {data.moe_config.check if data.moe_config else None}")
    if data.accuracy:
        lines.extend(_accuracy_lines(data.accuracy))
    if verdicts:
        lines.append(format_verdict_table(
            verdicts,
            title="vs baseline (baseline, candidate: geometric means of the runs)"))  # fmt: skip
    if data.baseline is not None:
        lines.extend(_baseline_lines(data.baseline, bool(verdicts)))
    return "\n".join(lines)


def _accuracy_lines(a: dict[str, Any]) -> list[str]:
    from pytest_moeperf.accuracy.health import request_errors

    failed = request_errors(a.get("per_question") or [])
    errors = failed or f"{a['errors']} request errors"
    scope = a.get("scope", "")
    lines = [f"gsm8k {a['shots']}-shot: strict {a['strict_match']:.3f} flexible "
             f"{a['flexible_extract']:.3f} (n={a['n']}, {scope}, {errors})"]  # fmt: skip
    v = a.get("verdict")
    if v:
        lines.append(f"accuracy gate {'passed' if v['passed'] else 'FAILED'} ({v['metric']}): "
                     f"{v['reason']}")  # fmt: skip
    return lines


def _baseline_lines(b: BaselineEntry, compared: bool) -> list[str]:
    """What became of the baseline: a refresh always says whether its file was written."""
    if b.refresh is None:
        return [] if compared else [f"baseline: {b.status} ({b.path})"]
    state, _, detail = b.refresh.partition(": ")
    if state == "written":
        line = f"baseline: written ({detail})"
    elif state == "not-written":
        line = f"baseline: NOT written ({detail})"
    else:
        line = f"baseline: {state} ({detail})"
    return [line] + ([f"baseline: {b.concurrent}"] if b.concurrent else [])


def setup_key(config: pytest.Config, plan: Plan, env: Any, model_dir: Path | None,
              folder: Path | None) -> BaselineKey:  # fmt: skip
    """The setup a run is stored and compared under (``baseline.key``); ``folder``: the MoE
    config folder the server was given, if any."""
    from pytest_moeperf.baseline import BaselineKey, calibration
    from pytest_moeperf.environment import usable_cpus
    from pytest_moeperf.moeconfig.folder import config_hash
    from pytest_moeperf.run.probe import keyed_spec_hash
    from pytest_moeperf.server.embedded import model_fingerprint

    model = plan.spec.model.path
    if model_dir is not None:
        model = f"{model}@{model_fingerprint(model_dir)}"
    p = plan.spec.parallelism
    return BaselineKey(
        backend=env.backend,
        # on the CPU backend the "accelerator" is the CPU model and its usable cores
        gpu_name=env.cpu if env.backend == "cpu" else env.accelerator,
        gpu_count=usable_cpus() if env.backend == "cpu" else env.gpu_count,
        driver=env.driver,
        cuda=env.cuda,
        vllm_version=env.vllm_version,
        model=model,
        dtype=plan.spec.model.dtype,
        tp=p.tensor,
        dp=p.data,
        spec_hash=keyed_spec_hash(plan.spec, plan.slo),
        moe_config_hash=config_hash(folder) if folder else "declared",
        calibration=calibration.for_key(config, env.gpus),
    )


def stored_bracket(root: Path, test_id: str, key: BaselineKey) -> tuple[float, float, str] | None:
    """(met, missed, file) of the stored baseline's median converged run for exactly this
    setup: where a run compared against it starts its first search, as a refresh's runs 2
    and 3 start from run 1's bracket. None without a readable baseline, and where the gate
    will call it another machine's (its calibration differs, or it has none): a fresh clone
    whose VM was 1.5x off the baseline's said "starts from the baseline's bracket", then "no
    baseline for this machine" (2026-12-06). Nor where the calibration drifted (x1.5 to x2):
    on an H100 host whose copy figure was 48 % below the baseline's, the seeded first search
    began at 25.6 req/s and cut two probes (351 requests cancelled) on its way down to 16.7
    (2026-12-07); the warm-up's rate is the better start on a machine in another state."""
    from pytest_moeperf.baseline import BaselineStore
    from pytest_moeperf.errors import UsageError
    from pytest_moeperf.gates import calibration_speed, other_machine

    store = BaselineStore(root)
    try:
        found, baseline = store.find(test_id, key)
    except UsageError:
        return None  # the comparison after the run says what is wrong with the file
    path = str(found)
    if baseline is None or other_machine(test_id, key, baseline, path, "") is not None:
        return None
    if calibration_speed(key, baseline.key) is not None:
        return None
    got = median_bracket(baseline.runs)
    return None if got is None else (*got, path)


def median_bracket(runs: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(met, missed) of the converged stored run with the median met rate, or None."""
    got = []
    for r in runs:
        b = r.get("bracket")
        if r.get("converged") and isinstance(b, list | tuple) and len(b) == 2:
            lo, hi = b
            if isinstance(lo, int | float) and isinstance(hi, int | float) and 0 < lo < hi:
                got.append((float(lo), float(hi)))
    return sorted(got)[(len(got) - 1) // 2] if got else None
