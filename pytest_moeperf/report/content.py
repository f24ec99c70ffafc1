"""What the report says, as plain strings: the conclusion and the numbers and verdict tables.

The HTML and Markdown writers only format and escape these, so the two files cannot disagree.
Every number that is missing reads "n/a" or "not measured (reason)", never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_moeperf.report.model import Metric, Result, Run, bar_labels
from pytest_moeperf.report.table import format_number

NOT_MEASURED = "not measured"
CHART_METRICS = ("slo_goodput_tok_s", "tok_per_j", "mbu", "power_w")
METRIC_TITLES = {
    "slo_goodput_tok_s": "SLO goodput",
    "output_tok_s": "Output throughput at fixed concurrency",
    "slo_rate_rps": "SLO rate",
    "tok_per_j": "Energy efficiency",
    "mbu": "Memory bandwidth utilisation (MBU)",
    "power_w": "Board power",
    "ttft_p99_ms": "TTFT p99",
    "tpot_p99_ms": "TPOT p99",
}


def chart_metrics(results: Sequence[Result]) -> tuple[str, ...]:
    """Bar-chart metrics; fixed-concurrency results (A/B gates) chart output tok/s instead of
    the SLO goodput they never measure."""
    fixed = results and all(
        "slo_goodput_tok_s" not in r.metrics and "output_tok_s" in r.metrics for r in results
    )
    return tuple("output_tok_s" if fixed and m == "slo_goodput_tok_s" else m for m in CHART_METRICS)


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    return format_number(x) + (f" {unit}" if unit else "")


def missing_text(note: str | None) -> str:
    """ "not measured (why)"; a note that already starts with "not measured" is not repeated."""
    if not note:
        return NOT_MEASURED
    why = note.removeprefix(NOT_MEASURED).lstrip(" :-—").strip()
    return f"{NOT_MEASURED} ({why})" if why else NOT_MEASURED


def fmt_metric(m: Metric | None, name: str = "") -> str:
    """The center with its unit; MBU as a percentage; "not measured (why)" when missing."""
    if m is None:
        return NOT_MEASURED
    if not m.measured or m.center is None:
        return missing_text(m.note)
    if name == "mbu" or m.unit == "fraction":
        return f"{m.center * 100:.1f} %"
    return fmt(m.center, m.unit)


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.0f} %"


def slo_text(spec: Mapping[str, Any]) -> str:
    slo = spec.get("slo")
    if not isinstance(slo, Mapping):
        return "SLO n/a"
    parts = [
        f"{label} ≤ {format_number(float(v))} ms"
        for key, label in (
            ("ttft_p99_ms", "TTFT p99"),
            ("tpot_p99_ms", "TPOT p99"),
            ("e2el_p99_ms", "E2EL p99"),
        )
        if isinstance((v := slo.get(key)), (int, float)) and not isinstance(v, bool)
    ]
    return ", ".join(parts) if parts else "no latency limit"


def slo_met(r: Result) -> str:
    """yes/no from the p99 centers against the spec's SLO; n/a when either side is missing."""
    slo = r.spec.get("slo")
    if not isinstance(slo, Mapping):
        return "n/a"
    checked = []
    for key in ("ttft_p99_ms", "tpot_p99_ms", "e2el_p99_ms"):
        limit, value = slo.get(key), r.center(key)
        if isinstance(limit, (int, float)) and not isinstance(limit, bool) and value is not None:
            checked.append(value <= limit)
    if not checked:
        return "n/a"
    return "yes" if all(checked) else "no"


def _fleet_sentence(r: Result, label: str) -> str | None:
    f = r.fleet
    if not f or f.get("cards") is None or f.get("n_reference") is None:
        return None
    ref = str(f.get("reference") or "the reference")
    if ref == r.config:
        return None
    what = "SLO goodput"
    if f.get("goodput_metric") == "output_tok_s":
        c = _concurrency(r)
        what = "output throughput" + (f" at concurrency {c}" if c else " at a fixed concurrency")
    text = (
        f"Serving the same {what} as {f['n_reference']} cards of {ref} takes "
        f"{f['cards']} cards with {label}"
    )
    rel = f.get("energy_per_token_rel", f.get("energy_per_token_relative"))
    if isinstance(rel, (int, float)) and not isinstance(rel, bool):
        more = "more" if rel > 0 else "less"
        text += f", and {_pct(rel)} {more} energy per token"
    else:
        m = r.metric("tok_per_j")
        text += "; energy per token " + missing_text(m.note if m is not None else None)
    return text + "."


def _concurrency(r: Result) -> int | None:
    for run in r.search_runs:
        fixed = run.get("fixed")
        if isinstance(fixed, Mapping) and isinstance(t := fixed.get("target"), (int, float)):
            return int(t)
    return None


def _verdict_phrase(r: Result) -> str:
    v = r.verdict("slo_goodput_tok_s")
    if v is not None:
        delta = "" if v.delta_rel is None else f" ({v.delta_rel * 100:+.1f} %"
        if delta and v.p_value is not None:
            delta += f", p = {v.p_value:.2g}"
        return f"{v.outcome} against the baseline{delta + ')' if delta else ''}"
    status = r.baseline.get("status")
    if status == "written":
        return "not compared with a baseline (this run wrote it)"
    return f"not compared with a baseline (baseline {status or 'n/a'})"


def _comparable(a: Result, b: Result) -> bool:
    """Same trace, arrivals, SLO and accelerator: their figures may be set side by side."""
    return all(a.spec.get(k) == b.spec.get(k) for k in ("trace", "arrival", "slo")) and (
        a.setup.get("accelerator") == b.setup.get("accelerator")
    )


def _overlap(a: Metric, b: Metric) -> bool | None:
    if a.spread is None or b.spread is None:
        return None
    return not (b.spread[0] > a.spread[1] or b.spread[1] < a.spread[0])


def comparison(results: Sequence[Result]) -> list[str]:
    """Each result against the first comparable one: relative difference of SLO goodput and
    tok/J, and whether it lies inside the run-to-run (min-max) bands, i.e. is not shown."""
    labels = bar_labels(results)
    out = []
    for i, r in enumerate(results[1:], 1):
        ref = next((j for j in range(i) if _comparable(results[j], r)), None)
        if ref is None:
            continue
        parts = []
        for name, title in (("slo_goodput_tok_s", "SLO goodput"), ("tok_per_j", "tok/J")):
            a, b = results[ref].metric(name), r.metric(name)
            if a is None or b is None or not a.measured or not b.measured or not a.center:
                continue
            assert b.center is not None
            text = f"{title} {(b.center / a.center - 1) * 100:+.1f} %"
            inside = _overlap(a, b)
            if inside is not None:
                text += (
                    " (inside the run-to-run bands: not a shown difference)"
                    if inside
                    else " (the run-to-run bands do not overlap)"
                )
            parts.append(text)
        if parts:
            out.append(f"{labels[i]} against {labels[ref]}: " + ", ".join(parts) + ".")
    return out


def conclusion(runs: Sequence[Run]) -> str:
    """The first sentence(s) of the report: the fleet answer when there is one, else goodput."""
    results = [r for run in runs for r in run.results]
    if not results:
        return "No perf test recorded a result in these runs."
    labels = dict(zip(map(id, results), bar_labels(results), strict=True))
    sentences = [s for r in results if (s := _fleet_sentence(r, labels[id(r)])) is not None]
    if not sentences:
        for r in results:
            g = r.metric("slo_goodput_tok_s")
            where = r.setup.get("accelerator") or "unknown hardware"
            if g is not None and g.measured:
                e = r.metric("tok_per_j")
                energy = f" at {fmt_metric(e)}" if e is not None and e.measured else ""
                sentences.append(
                    f"{labels[id(r)]} sustains {fmt_metric(g)} of SLO goodput "
                    f"({slo_text(r.spec)}){energy} on {where}, {_verdict_phrase(r)}."
                )
            else:
                why = missing_text(g.note if g is not None else None)
                sentences.append(f"SLO goodput of {labels[id(r)]} was {why}.")
        sentences += comparison(results)
    unmeasured = [r for r in results if r.center("tok_per_j") is None]
    if unmeasured and len(unmeasured) == len(results):
        m = unmeasured[0].metric("tok_per_j")
        why = missing_text(m.note if m is not None else None)
        sentences.append(f"Energy per token was {why}.")
    failed = [r for r in results if r.outcome not in ("passed",)]
    if failed:
        names = ", ".join(f"{labels[id(r)]} {r.outcome}" for r in failed)
        sentences.append(f"{len(failed)} of {len(results)} results did not pass: {names}.")
    return " ".join(sentences)


def numbers_table(results: Sequence[Result]) -> Table:
    headers = (
        "config",
        "test",
        "outcome",
        "engine",
        "MBU",
        "power",
        "SLO goodput",
        "tok/J",
        "TTFT p99",
        "TPOT p99",
        "SLO met",
        "accuracy",
        "accuracy Δ",
        "cards for equal goodput",
    )
    rows = []
    for label, r in zip(bar_labels(results), results, strict=True):
        acc, acc_delta = "n/a", "n/a"
        if r.accuracy:
            score = r.accuracy.get("flexible_extract", r.accuracy.get("strict_match"))
            if isinstance(score, (int, float)):
                acc = f"{r.accuracy.get('task', '?')} {score * 100:.1f} %"
            verdict = r.accuracy.get("verdict")
            if isinstance(verdict, Mapping) and isinstance(
                verdict.get("delta_points"), (int, float)
            ):
                acc_delta = f"{verdict['delta_points']:+.1f} pt"
                acc_delta += "" if verdict.get("passed", True) else " (failed)"
        cards = "n/a"
        if r.fleet and r.fleet.get("cards") is not None:
            cards = f"{r.fleet['cards']} (vs {r.fleet.get('n_reference', '?')} "
            cards += f"{r.fleet.get('reference', 'reference')})"
        rows.append(
            (
                label,
                r.nodeid,
                r.outcome,
                str(r.setup.get("engine") or "n/a"),
                *(fmt_metric(r.metric(n), n) for n in ("mbu", "power_w", "slo_goodput_tok_s")),
                *(fmt_metric(r.metric(n), n) for n in ("tok_per_j", "ttft_p99_ms", "tpot_p99_ms")),
                slo_met(r),
                acc,
                acc_delta,
                cards,
            )
        )
    return Table(headers, tuple(rows))


def verdict_table(results: Sequence[Result]) -> Table:
    headers = (
        "config",
        "metric",
        "baseline",
        "band",
        "candidate",
        "delta",
        "p",
        "verdict",
        "reason / advice",
    )
    rows = []
    for label, r in zip(bar_labels(results), results, strict=True):
        if not r.verdicts:
            status = str(r.baseline.get("status") or "n/a")
            rows.append(
                (
                    label,
                    "(all)",
                    "n/a",
                    "n/a",
                    "n/a",
                    "n/a",
                    "n/a",
                    "not compared",
                    f"baseline {status}",
                )
            )
        for v in r.verdicts:
            band = "n/a" if v.band is None else f"{fmt(v.band[0])}..{fmt(v.band[1])}"
            delta = "n/a" if v.delta_rel is None else f"{v.delta_rel * 100:+.2f} %"
            outcome = v.outcome + ("" if v.gating else " (info)")
            why = "; ".join(x for x in (v.reason, v.advice) if x)
            rows.append(
                (
                    label,
                    v.metric,
                    fmt(v.baseline_center, v.unit),
                    band,
                    fmt(v.candidate_center, v.unit),
                    delta,
                    "n/a" if v.p_value is None else f"{v.p_value:.2g}",
                    outcome,
                    why,
                )
            )
    return Table(headers, tuple(rows))
