"""The verdict table printed in the pytest terminal summary and by ``moeperf compare``.

Plain text, aligned columns, one mark per outcome so a CI log can be grepped for "✗".
Explanations (reason, advice) go under the table only for rows that are not "unchanged",
because those are the rows a reader has to act on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pytest_moeperf.verdict.stats import Verdict

MARKS = {
    "unchanged": "✓ unchanged",
    "improved": "▲ improved",
    "regressed": "✗ regressed",
    "inconclusive": "? inconclusive",
}
HEADERS = ("metric", "baseline", "band", "candidate", "delta", "p", "runs", "verdict")
_RIGHT = {1, 2, 3, 4, 5, 6}  # numeric columns are right-aligned


def format_number(x: float) -> str:
    """Four significant digits without exponent for the magnitudes metrics have."""
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    ax = abs(x)
    # thresholds sit just below the powers of ten so that 999.97 prints as 1,000, not 1000.0
    if ax >= 999.95:
        return f"{x:,.0f}"
    if ax >= 99.995:
        return f"{x:.1f}"
    if ax >= 9.9995:
        return f"{x:.2f}"
    if ax >= 0.99995:
        return f"{x:.3f}"
    if x == 0:
        return "0"
    return f"{x:.4f}" if ax >= 0.001 else f"{x:.3g}"


def _delta(v: Verdict) -> str:
    if math.isnan(v.delta_rel):
        return "n/a"
    if math.isinf(v.delta_rel):
        return "+inf %" if v.delta_rel > 0 else "-inf %"
    return f"{v.delta_rel * 100:+.2f} %"


def _row(v: Verdict) -> tuple[str, ...]:
    unit = f" {v.unit}" if v.unit else ""
    lo, hi = v.band
    band = "n/a" if math.isnan(lo) else f"{format_number(lo)}..{format_number(hi)}"
    mark = MARKS[v.outcome]
    if not v.gating:
        mark += " (info)"
    return (
        v.metric,
        format_number(v.baseline_center) + unit,
        band,
        format_number(v.candidate_center) + unit,
        _delta(v),
        "n/a" if v.p_value is None else f"{v.p_value:.2g}",
        f"{v.n_baseline}/{v.n_candidate}",
        mark,
    )


def format_verdict_table(rows: Sequence[Verdict], *, title: str) -> str:
    """The table plus one explanation line per row that needs attention; no trailing newline."""
    cells = [HEADERS, *(_row(v) for v in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(HEADERS))]

    def line(r: tuple[str, ...]) -> str:
        parts = [
            c.rjust(w) if i in _RIGHT else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [title, line(HEADERS), "  ".join("-" * w for w in widths)]
    if not rows:
        out.append("(no metrics to compare)")
    out.extend(line(r) for r in cells[1:])
    notes = [v for v in rows if v.outcome != "unchanged"]
    if notes:
        out.append("")
        for v in notes:
            text = f"{MARKS[v.outcome].split()[0]} {v.metric}: {v.reason}"
            if v.advice:
                text += f"; {v.advice}"
            out.append(text)
    return "\n".join(out)
