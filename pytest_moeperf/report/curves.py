"""The curve charts: output tok/s, TTFT p99 and TPOT p99 of every search probe (or sweep row).

Why every probe is drawn, and how: a probe that missed the SLO often has no finite p99 (requests
that never finished count as infinite latency, stored as null), and a panel that skips those
draws only its SLO line. Here a missed probe is a red x at its value, or, when its p99 is
infinite or absent, a red up-triangle at a ceiling just above the panel's finite data and SLO
line, with a text saying so. A vertical line marks the reported SLO boundary (the result's
``slo_rate_rps``): throughput right of it was not sustained within the SLO, however high.

``curve_figures`` returns the matplotlib Figures before rendering (tests read their artists by
gid); ``curve_charts`` renders them to SVG and PNG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pytest_moeperf.report.charts import _PALETTE, _RC, Chart, _render, _slug, colors
from pytest_moeperf.report.model import Result
from pytest_moeperf.report.table import format_number

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANELS = (
    ("output_tok_s", "output tok/s"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p99_ms", "TPOT p99 (ms)"),
)
MISSED_COLOR = "#a00"
CEILING_HEADROOM = 1.15  # the ceiling sits 15 % above the highest finite value or SLO limit

Point = tuple[float, Mapping[str, Any], bool]  # x, probe summary (or sweep row), SLO met


@dataclass(frozen=True)
class CurveFigure:
    name: str
    title: str
    alt: str
    fig: Figure


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def panel_value(summary: Mapping[str, Any], key: str) -> tuple[float | None, str]:
    """(finite value, "") or (None, "inf" | "n/a") for one panel of one probe.

    Probe summaries nest the p99 (``summary["ttft"]["p99_ms"]``, with ``n_inf`` counting the
    requests of infinite latency); sweep rows and older files hold it flat (``ttft_p99_ms``).
    A null p99 with infinite-latency requests is an infinite p99 (JSON has no inf).
    """
    n_inf = 0
    if key in summary:
        raw = summary[key]
    else:
        stem, _, stat = key.partition("_")
        nested = summary.get(stem)
        if not isinstance(nested, Mapping):
            return None, "n/a"
        raw = nested.get(stat)
        n = nested.get("n_inf")
        n_inf = n if isinstance(n, int) and not isinstance(n, bool) else 0
    if isinstance(raw, str):
        try:
            raw = float(raw)
        except ValueError:
            return None, "n/a"
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None, "inf" if raw is None and n_inf > 0 else "n/a"
    if math.isnan(raw):
        return None, "n/a"
    if math.isinf(raw):
        return None, "inf"
    return float(raw), ""


def search_points(r: Result) -> list[list[Point]]:
    """One list per search run of (rate, summary, met), sorted by rate; probes without a
    rate or a summary cannot be placed and are left out."""
    series = []
    for run in r.search_runs:
        pts = []
        for p in run.get("probes") or []:
            rate = _num(p, "rate") if isinstance(p, Mapping) else None
            summary = p.get("summary") if isinstance(p, Mapping) else None
            if rate is not None and isinstance(summary, Mapping):
                pts.append((rate, summary, bool(p.get("met"))))
        if pts:
            series.append(sorted(pts, key=lambda t: t[0]))
    return series


def sweep_points(r: Result) -> dict[str, list[Point]]:
    """Sweep rows by config; x is concurrency, or the rate for rate sweeps."""
    by: dict[str, list[Point]] = {}
    for row in r.sweep:
        x = _num(row, "concurrency")
        x = _num(row, "rate") if x is None else x
        if x is not None:
            by.setdefault(str(row.get("config") or r.config), []).append((x, row, True))
    return {k: sorted(v, key=lambda t: t[0]) for k, v in by.items()}


def reported_boundary(r: Result, runs: Sequence[Sequence[Point]]) -> tuple[float, str] | None:
    """(rate, legend text): the SLO rate the result reports (the median of its runs' highest met
    rates), else the highest rate any probe met; None when no probe met."""
    rate, m = r.center("slo_rate_rps"), r.metric("slo_rate_rps")
    if rate is not None:
        n = len(m.runs) if m is not None else 0
        how = f" (median of {n} runs)" if n > 1 else ""
        return rate, f"reported SLO rate, {r.config}: {format_number(rate)} req/s{how}"
    met = [x for pts in runs for x, _, ok in pts if ok]
    if not met:
        return None
    return max(met), f"highest met rate, {r.config}: {format_number(max(met))} req/s"


def curve_figures(results: Sequence[Result]) -> list[CurveFigure]:
    """One figure per test family: search probes against arrival rate, sweeps against x."""
    out = []
    families: dict[str, list[Result]] = {}
    for r in results:
        families.setdefault(r.family, []).append(r)
    for i, (family, members) in enumerate(families.items()):
        search = {r.config: s for r in members if (s := search_points(r))}
        bounds = {
            r.config: b
            for r in members
            if r.config in search and (b := reported_boundary(r, search[r.config])) is not None
        }
        sweep: dict[str, list[Point]] = {}
        for r in members:
            for cfg, pts in sweep_points(r).items():
                sweep.setdefault(cfg, []).extend(pts)
        by_conc = any(_num(row, "concurrency") is not None for r in members for row in r.sweep)
        kind_x = "concurrency" if by_conc else "request rate (req/s)"
        short = family.rsplit("::", 1)[-1]
        slo_raw = members[0].spec.get("slo")
        slo: Mapping[str, Any] = slo_raw if isinstance(slo_raw, Mapping) else {}
        if search:
            name, title = f"search-{i}-{_slug(short)}", f"Search probes: {short}"
            out.append(_figure(name, title, search, "arrival rate (req/s)", slo, results, bounds))
        if sweep:
            series = {k: [sorted(v, key=lambda t: t[0])] for k, v in sweep.items()}
            name, title = f"sweep-{i}-{_slug(short)}", f"Sweep: {short}"
            out.append(_figure(name, title, series, kind_x, slo, results, {}))
    return out


def curve_charts(results: Sequence[Result]) -> list[Chart]:
    """The curve figures rendered (SVG for the HTML, PNG for the Markdown)."""
    from matplotlib import rc_context

    charts = []
    with rc_context(cast(Any, _RC)):
        for f in curve_figures(results):
            svg, png = _render(f.fig)
            charts.append(Chart(f.name, f.title, f.alt, svg, png))
    return charts


@dataclass(frozen=True)
class _Pt:
    cfg: str
    run: int
    x: float
    value: float | None  # None: no finite value (why says "inf" or "n/a")
    why: str
    met: bool


def _clip_text(clipped: Sequence[_Pt]) -> str:
    """ "▲ 3 missed (p99 = inf)"; a met probe without a p99 reads "met (p99 n/a)"."""
    counts: dict[str, int] = {}
    for p in clipped:
        what = ("met" if p.met else "missed") + (" (p99 = inf)" if p.why == "inf" else " (p99 n/a)")
        counts[what] = counts.get(what, 0) + 1
    return "▲ " + ", ".join(f"{n} {what}" for what, n in counts.items())


def ceiling_of(finite: Sequence[float], limit: float | None) -> float:
    """Where a non-finite value is drawn: just above the finite data and the SLO line."""
    top = max([*finite, limit or 0.0, 0.0])
    return top * CEILING_HEADROOM if top > 0 else 1.0


def _panel(
    ax: Axes,
    key: str,
    series: Mapping[str, list[list[Point]]],
    palette: Mapping[str, str],
    limit: float | None,
    bounds: Mapping[str, tuple[float, str]],
) -> None:
    from matplotlib.transforms import blended_transform_factory

    pts = [
        _Pt(cfg, j, x, *panel_value(s, key), met)
        for cfg, runs in series.items()
        for j, run in enumerate(runs)
        for x, s, met in run
    ]
    finite = [p.value for p in pts if p.value is not None]
    ceiling = ceiling_of(finite, limit)
    for cfg, runs in series.items():
        color = palette.get(cfg, _PALETTE[len(palette) % len(_PALETTE)])
        for j in range(len(runs)):
            met = sorted(
                (p.x, p.value)
                for p in pts
                if p.cfg == cfg and p.run == j and p.met and p.value is not None
            )
            if met:
                ax.plot(
                    [x for x, _ in met],
                    [y for _, y in met],
                    color=color,
                    alpha=0.9,
                    marker="o",
                    markersize=3.5,
                    label=f"{cfg}: SLO met",
                    gid=f"met:{cfg}:{j}",
                )
    missed = [(p.x, p.value) for p in pts if not p.met and p.value is not None]
    if missed:
        ax.scatter(
            [x for x, _ in missed],
            [y for _, y in missed],
            marker="x",
            color=MISSED_COLOR,
            zorder=4,
            s=25,
            label="SLO missed",
            gid="missed",
        )
    clipped = [p for p in pts if p.value is None]
    if clipped:
        all_inf = all(p.why == "inf" and not p.met for p in clipped)
        ax.axhline(ceiling, color=MISSED_COLOR, linestyle=":", linewidth=0.7, gid="ceiling")
        ax.scatter(
            [p.x for p in clipped],
            [ceiling] * len(clipped),
            marker="^",
            color=[("#777" if p.met else MISSED_COLOR) for p in clipped],
            zorder=5,
            s=30,
            gid="clipped",
            label=("missed, p99 = inf" if all_inf else "no finite value") + " (drawn at the top)",
        )
        ax.annotate(
            _clip_text(clipped),
            (0.02, ceiling),
            xycoords=blended_transform_factory(ax.transAxes, ax.transData),
            xytext=(0, 3),
            textcoords="offset points",
            ha="left",
            va="bottom",
            fontsize=7.5,
            color=MISSED_COLOR,
            gid="clip-label",
            zorder=6,
            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"},
        )
    if limit is not None:
        ax.axhline(
            limit,
            color=MISSED_COLOR,
            linestyle="--",
            linewidth=1,
            label="SLO limit",
            gid="slo-limit",
        )
    for cfg, (rate, text) in bounds.items():
        color = palette.get(cfg, "#444")
        ax.axvline(
            rate, color=color, linestyle="-.", linewidth=1.1, label=text, gid=f"boundary:{cfg}"
        )
    xs = [p.x for p in pts]
    pad = 0.04 * (max(xs) - min(xs)) or 0.5
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    top = max([*finite, limit or 0.0])
    ax.set_ylim(0, (ceiling if clipped else top or 1.0) * 1.1)


def _figure(
    name: str,
    title: str,
    series: Mapping[str, list[list[Point]]],
    xlabel: str,
    slo: Mapping[str, Any],
    results: Sequence[Result],
    bounds: Mapping[str, tuple[float, str]],
) -> CurveFigure:
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    palette = colors(results)
    with rc_context(cast(Any, _RC)):
        fig = Figure(figsize=(10.5, 3.6), layout="constrained")
        axes = fig.subplots(1, 3)
        for ax, (key, label) in zip(axes, PANELS, strict=True):
            _panel(ax, key, series, palette, _num(slo, key) if slo else None, bounds)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(color="#eee")
        handles: dict[str, Any] = {}
        for ax in axes:
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(lab, h)
        if handles:
            fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                       ncol=min(len(handles), 4), fontsize=7.5,
                       frameon=False)  # fmt: skip
        fig.suptitle(title)
    return CurveFigure(name, title, _alt(title, series, xlabel, bounds), fig)


def _alt(
    title: str,
    series: Mapping[str, list[list[Point]]],
    xlabel: str,
    bounds: Mapping[str, tuple[float, str]],
) -> str:
    parts = []
    for cfg, runs in series.items():
        pts = [p for run in runs for p in run]
        n_missed = sum(1 for _, _, met in pts if not met)
        text = f"{cfg}: {len(pts)} points"
        if n_missed:
            text += f", {n_missed} missed the SLO (red)"
        if cfg in bounds:
            text += f", reported SLO rate {format_number(bounds[cfg][0])} req/s (dash-dot line)"
        parts.append(text)
    return f"{title}: output tok/s, TTFT p99 and TPOT p99 against {xlabel}; " + "; ".join(parts)
