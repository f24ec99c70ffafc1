"""What a reviewer pastes into the PR: one Markdown block per changed MoE config file.

It answers, in order: what the gate concluded, on which numbers (base, head, delta, p, verdict
per metric), whether each server provably read the file it was meant to, whether the machine was
quiet enough (the A/A control), how the gain depends on load (the sweep), which batch sizes the
change re-tiles, and how to reproduce.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_moeperf.report.table import format_number

if TYPE_CHECKING:
    from pytest_moeperf.ab.gate import AbOutcome

MARK = {"regressed": "❌", "improved": "🚀", "inconclusive": "❔", "unchanged": "✅"}
MAX_TILING_LINES = 8


def overall(verdicts: Sequence[Any]) -> str:
    """The case's word: any gating regression wins, then inconclusive, then improved."""
    gating = [v.outcome for v in verdicts if v.gating]
    for word in ("regressed", "inconclusive", "improved"):
        if word in gating:
            return word
    return "unchanged" if gating else "inconclusive"


def fleet_of(
    base: Mapping[str, Sequence[float]],
    cand: Mapping[str, Sequence[float]],
    *,
    reference: str,
    gpus: int,
    n_reference: int = 64,
) -> dict[str, Any] | None:
    """Cards for equal goodput and energy per token of the candidate vs the base (medians)."""
    from pytest_moeperf.metrics.fleet import fleet_row

    key = next(
        (k for k in ("slo_goodput_tok_s", "output_tok_s") if base.get(k) and cand.get(k)), None
    )
    if key is None:
        return None

    def med(m: Mapping[str, Sequence[float]], name: str) -> float | None:
        xs = m.get(name) or []
        return float(statistics.median(xs)) if xs else None

    ref, cfg = med(base, key), med(cand, key)
    assert ref is not None and cfg is not None
    if ref <= 0:
        return None
    row = fleet_row(
        "head",
        ref,
        cfg,
        med(base, "tok_per_j"),
        med(cand, "tok_per_j"),
        n_reference=n_reference,
        gpus_per_server=gpus,
        mbu=med(cand, "mbu"),
    )
    return {**row.to_dict(), "reference": reference, "goodput_metric": key}


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "fraction":
        return f"{v * 100:.1f} %"
    return format_number(v) + (f" {unit}" if unit else "")


def verdict_rows(verdicts: Sequence[Any]) -> list[str]:
    rows = ["| metric | base | head | Δ | p | verdict |", "|---|---:|---:|---:|---:|---|"]
    for v in verdicts:
        p = "n/a" if v.p_value is None else f"{v.p_value:.2g}"
        word = v.outcome if v.gating else f"{v.outcome} (info)"
        if v.outcome in ("regressed", "improved") and v.gating:
            word = f"**{word}**"
        rows.append(
            f"| {v.metric} | {_num(v.baseline_center, v.unit)} | "
            f"{_num(v.candidate_center, v.unit)} | {v.delta_rel * 100:+.1f} % | {p} | "
            f"{MARK.get(v.outcome, '')} {word} |"
        )
    return rows


def _load_text(out: AbOutcome) -> str:
    spec = out.plan.spec
    w = spec.workload
    trace = f"fixed {w.input_tokens}/{w.output_tokens} tokens" if w.trace == "fixed" else w.trace
    if spec.arrival.process == "concurrency":
        return f"{trace}, closed loop at concurrency {spec.arrival.concurrency}"
    return (
        f"{trace}, SLO search (p99 TTFT <= {out.plan.slo.ttft_p99_ms:g} ms, p99 TPOT <= "
        f"{out.plan.slo.tpot_p99_ms:g} ms)"
    )


def _sweep_rows(out: AbOutcome) -> list[str]:
    base = {e["concurrency"]: e for e in out.sides["base"].sweep}
    head = {e["concurrency"]: e for e in out.sides["head"].sweep}
    levels = sorted(set(base) & set(head))
    if not levels:
        return []
    rows = [
        "",
        "Concurrency sweep (one run per side per level, closed loop):",
        "",
        "| concurrency | base tok/s | head tok/s | head vs base |",
        "|---:|---:|---:|---:|",
    ]
    for c in levels:
        a, b = base[c].get("output_tok_s"), head[c].get("output_tok_s")
        gain = f"{(b / a - 1) * 100:+.1f} %" if a and b else "n/a"
        rows.append(f"| {c} | {_num(a, '')} | {_num(b, '')} | {gain} |")
    return rows


def _cross_check(out: AbOutcome, perm: Any) -> list[str]:
    """The per-M verdicts against the sweep (``perm_gate.cross_check``), when both exist."""
    from pytest_moeperf.ab.perm_gate import cross_check

    if perm is None or not perm.per_m:
        return []
    base = {e["concurrency"]: e.get("output_tok_s") or 0.0 for e in out.sides["base"].sweep}
    head = {e["concurrency"]: e.get("output_tok_s") or 0.0 for e in out.sides["head"].sweep}
    both = {int(c): (float(base[c]), float(head[c])) for c in set(base) & set(head)}
    got = cross_check(perm.per_m, both)
    return ["", *got] if got else []


def tiling_lines(out: AbOutcome) -> list[str]:
    """Which batch sizes M the change moves to another tiling (vLLM uses the nearest key)."""
    from pytest_moeperf.moeconfig.coverage import diff_coverage
    from pytest_moeperf.moeconfig.folder import in_tree_config_dir
    from pytest_moeperf.moeconfig.validate import load_config

    def tiles(files: Mapping[str, Any]) -> Any:
        if files:
            return files[out.case.file_name]
        folder = in_tree_config_dir()
        path = folder / out.case.file_name if folder else None
        return load_config(path) if path is not None and path.is_file() else None

    ms = set(range(1, out.plan.spec.max_num_seqs + 1)) | {2**i for i in range(0, 15)}
    diff = diff_coverage(
        tiles(out.case.base.files),
        tiles(out.case.head.files),
        sorted(ms),
        label_a="base",
        label_b="head",
    )
    lines = diff.lines()
    if len(lines) > MAX_TILING_LINES + 1:
        lines = [*lines[: MAX_TILING_LINES + 1], f"  ... {len(lines) - 1 - MAX_TILING_LINES} more"]
    return lines


def markdown_summary(out: AbOutcome, command: str) -> str:
    case, env = out.case, out.env
    word = "partial" if out.partial else overall(out.verdicts)
    lines = [f"### {MARK.get(word, '⚠️')} MoE config gate: `{case.file_name}` — {word}", ""]
    lines.append(
        f"Compared **base** ({_side(case.base)}) with **head** ({_side(case.head)}) from "
        f"{case.origin} ({case.status}), serving spec `{out.plan.spec.name}` "
        f"({_load_text(out)}) on {_machine(env)} with vLLM "
        f"{env.vllm_version}; {out.pairs} counterbalanced pairs "
        f"({_order_text(out.order)})."
    )
    if out.partial:
        lines += ["", f"**Not judged:** {out.partial}. Partial runs are in the results file."]
    else:
        lines += ["", *verdict_rows(out.verdicts)]
    lines += ["", "Config proof (from each server's log):", ""]
    lines += [f"- {name}: {state.check}" for name, state in out.sides.items()]
    if env.backend == "cpu":
        lines += [
            "",
            "_The vLLM CPU backend reads no fused-MoE config files, so both sides "
            "ran the same kernels: this result says nothing about GPUs._",
        ]
    if out.control_verdicts is not None:
        gated = [v for v in out.control_verdicts if v.gating]
        big = max((abs(v.delta_rel) for v in gated), default=0.0)
        word_c = overall(out.control_verdicts)
        lines += [
            "",
            f"A/A control (base vs a fresh server with a copy of base): {word_c} "
            f"(largest |Δ| {big * 100:.1f} % over {len(gated)} gated metrics).",
        ]
    lines += _sweep_rows(out)
    lines += [
        "",
        "Tiling changes (vLLM uses the nearest tuned M):",
        "",
        "```",
        *tiling_lines(out),
        "```",
    ]
    perm = getattr(out, "perm", None)
    lines += ["", *(perm.summary_lines() if perm is not None else [kernel_line(out.env.backend)])]
    lines += _cross_check(out, perm)
    if out.equivalence is not None:
        lines += ["", out.equivalence.line()]
    if out.warnings:
        lines += ["", *(f"- note: {w}" for w in out.warnings)]
    lines += ["", f"Reproduce: `{command}`", ""]
    return "\n".join(lines)


def kernel_line(backend: str, reason: str | None = None) -> str:
    """The per-M kernel A/B's line where the gate saw no GPU: why it was skipped. (With a GPU
    the gate runs it, ``perm_gate``, and prints its table instead.) ``reason`` defaults to
    ``kernel_bench.skip_reason()``."""
    if backend == "cpu":
        reason = reason or "the vLLM CPU backend has no fused-MoE Triton kernels to time"
    elif reason is None:
        from pytest_moeperf.ab.kernel_bench import skip_reason

        reason = skip_reason()
    if reason:
        return f"Per-M kernel A/B: skipped: {reason}."
    return (
        "Per-M kernel A/B: skipped: the gate saw no GPU through NVML, though the kernels could "
        "run here (`python -m pytest_moeperf.ab.perm_cli`, docs/ab-gate.md)."
    )


def _order_text(order: Sequence[tuple[str, int]], limit: int = 8) -> str:
    text = " ".join(f"{s}{k + 1}" for s, k in order[:limit])
    return text + (" ..." if len(order) > limit else "")


def _machine(env: Any) -> str:
    return f"{env.accelerator} x{env.gpu_count}" if env.gpu_count else str(env.accelerator)


def _side(side: Any) -> str:
    return "in-tree" if side.in_tree else f"`{side.where}`"
