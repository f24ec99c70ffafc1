"""Charts for the report, drawn with matplotlib's object API (no pyplot state, Agg canvas).

Why SVG and PNG of each chart: the HTML embeds the SVG as a data URI (vector, self-contained,
and an <img> keeps matplotlib's element ids from clashing between charts), the Markdown file
links PNGs written next to it because Markdown viewers do not all render SVG data URIs.
A metric that was not measured gets a labelled gap, never a zero-height bar.
"""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pytest_moeperf.report.content import METRIC_TITLES, NOT_MEASURED, missing_text
from pytest_moeperf.report.model import Result, bar_labels

_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
_RC: dict[str, Any] = {
    "svg.hashsalt": "moeperf",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "path",
}


@dataclass(frozen=True)
class Chart:
    name: str  # file stem of the PNG, unique within one report
    title: str
    alt: str  # what the chart shows, for <img alt> and Markdown
    svg: bytes
    png: bytes
    missing: tuple[str, ...] = field(default_factory=tuple)  # "config: not measured (why)"


@dataclass(frozen=True)
class Missing:
    """A metric no result measured: the report prints the reasons instead of a chart."""

    title: str
    lines: tuple[str, ...]


def _render(fig: Any) -> tuple[bytes, bytes]:
    svg, png = io.BytesIO(), io.BytesIO()
    fig.savefig(svg, format="svg", metadata={"Date": None}, bbox_inches="tight")
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return svg.getvalue(), png.getvalue()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "chart"


def colors(results: Sequence[Result]) -> dict[str, str]:
    """One color per config name, stable across every chart of the report."""
    out: dict[str, str] = {}
    for r in results:
        out.setdefault(r.config, _PALETTE[len(out) % len(_PALETTE)])
    return out


def _missing_text(r: Result, name: str) -> str:
    m = r.metric(name)
    return missing_text(m.note if m is not None else None)


def bar_chart(
    results: Sequence[Result], name: str, rated_tb_s: float | None, *, test: str = "", key: str = ""
) -> Chart | Missing:
    """Bars of one metric's center per config of one test, min-max error bars, baseline band.

    ``test`` goes into the title when the report holds several tests (their bars must not stand
    side by side: different workloads), ``key`` keeps the PNG names unique.
    """
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import blended_transform_factory

    title = METRIC_TITLES.get(name, name) + (f": {test}" if test else "")
    labels = bar_labels(results)
    missing = tuple(
        f"{label}: {_missing_text(r, name)}"
        for label, r in zip(labels, results, strict=True)
        if r.center(name) is None
    )
    if len(missing) == len(results):
        return Missing(title, missing)
    mbu = name == "mbu"
    scale = 100.0 if mbu else 1.0
    unit = next((m.unit for r in results if (m := r.metric(name)) and m.unit), "")
    palette = colors(results)
    with rc_context(cast(Any, _RC)):
        fig = Figure(figsize=(max(4.0, 1.3 * len(results) + 1.6), 3.0))
        ax = fig.add_subplot()
        text_tf = blended_transform_factory(ax.transData, ax.transAxes)
        band_drawn = False
        for i, r in enumerate(results):
            m = r.metric(name)
            if m is None or m.center is None or not m.measured:
                wrapped = textwrap.fill(_missing_text(r, name), 16)
                ax.text(
                    i,
                    0.04,
                    wrapped,
                    transform=text_tf,
                    ha="center",
                    va="bottom",
                    fontsize=7.5,
                    color="#a00",
                    style="italic",
                )
                continue
            c = m.center * scale
            ax.bar(i, c, width=0.6, color=palette[r.config], zorder=2)
            spread = m.spread
            if spread is not None:
                lo, hi = spread[0] * scale, spread[1] * scale
                ax.errorbar(
                    i,
                    c,
                    yerr=[[max(c - lo, 0.0)], [max(hi - c, 0.0)]],
                    fmt="none",
                    ecolor="#222",
                    capsize=5,
                    zorder=3,
                )
            v = r.verdict(name)
            if v is not None and v.band is not None:
                lo, hi = v.band[0] * scale, v.band[1] * scale
                ax.add_patch(
                    Rectangle(
                        (i - 0.42, lo),
                        0.84,
                        hi - lo,
                        facecolor="#999",
                        alpha=0.35,
                        hatch="//",
                        edgecolor="#555",
                        zorder=4,
                        label=None if band_drawn else "baseline band",
                    )
                )
                band_drawn = True
            ax.annotate(
                _value_text(m.center, name),
                (i, c),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
                zorder=5,
            )
        ax.set_xticks(range(len(results)), [textwrap.fill(x, 18) for x in labels])
        ax.set_xlim(-0.6, len(results) - 0.4)
        if mbu:
            ax.set_ylim(0, 100)
            rated = f"{rated_tb_s:g} TB/s" if rated_tb_s else "rated"
            ax.set_ylabel(f"% of {rated} bandwidth")
        else:
            ax.set_ylim(bottom=0)
            ax.margins(y=0.15)
            ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(axis="y", color="#ddd", zorder=0)
        if band_drawn:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7.5, frameon=False)
        svg, png = _render(fig)
    alt = (
        f"{title} per config ("
        + ", ".join(
            f"{label}: {_value_text(r.center(name), name)}"
            for label, r in zip(labels, results, strict=True)
        )
        + ")"
    )
    return Chart(_slug(name + key), title, alt, svg, png, missing)


def _value_text(x: float | None, name: str) -> str:
    from pytest_moeperf.report.table import format_number

    if x is None:
        return NOT_MEASURED
    return f"{x * 100:.1f} %" if name == "mbu" else format_number(x)
