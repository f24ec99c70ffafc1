"""The search/sweep curve charts hold a point for every probe, in every panel.

Read from the recorded H200 nightly of 2026-12-04 (docs/results/h200-nightly-2026-12-04), where
every missed probe but two has a null (infinite) TTFT and TPOT p99 and the old chart drew only
the SLO lines, and from small synthetic results parsed the way report/model.py parses a file.
The checks read the matplotlib artists of each panel (by gid) before rendering, then the SVG.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.report import curves
from pytest_moeperf.report.curves import CurveFigure, panel_value
from pytest_moeperf.report.model import Result, parse_payload

NIGHTLY = Path(__file__).parent.parent / "docs" / "results" / "h200-nightly-2026-12-04"
FILES = ("results-bf16-fp8-first.json", "results-fp8.json")
P99_PANELS = {1: ("ttft", 2000.0), 2: ("tpot", 50.0)}  # panel index -> summary key, SLO limit


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((NIGHTLY / name).read_text())
    return data


def results_of(payload: dict[str, Any], source: str = "r.json") -> list[Result]:
    return list(parse_payload(payload, source).results)


def by_gid(ax: Any, prefix: str) -> list[Any]:
    return [a for a in ax.get_children() if str(a.get_gid() or "").startswith(prefix)]


def xy(artist: Any) -> list[tuple[float, float]]:
    """The data points of a Line2D or a scatter collection."""
    if hasattr(artist, "get_offsets"):
        return [(float(x), float(y)) for x, y in artist.get_offsets()]
    return list(zip(map(float, artist.get_xdata()), map(float, artist.get_ydata()), strict=True))


def points(ax: Any, prefix: str) -> list[tuple[float, float]]:
    return [p for a in by_gid(ax, prefix) for p in xy(a)]


def ceiling(ax: Any) -> float:
    (line,) = by_gid(ax, "ceiling")
    return float(line.get_ydata()[0])


def only(payload: dict[str, Any]) -> Result:
    (result,) = results_of(payload)
    return result


def probes(result: Result) -> list[dict[str, Any]]:
    return [p for run in result.search_runs for p in run["probes"]]


def figure_of(result: Result) -> CurveFigure:
    (fig,) = curves.curve_figures([result])
    assert fig.name.startswith("search-")
    return fig


@pytest.fixture(scope="module", params=FILES)
def recorded(request: pytest.FixtureRequest) -> list[tuple[Result, CurveFigure]]:
    return [(r, figure_of(r)) for r in results_of(load(request.param), request.param)]


def rates(xs: list[tuple[float, float]]) -> Counter[float]:
    return Counter(round(x, 6) for x, _ in xs)


def test_every_panel_holds_every_probe(recorded: list[tuple[Result, CurveFigure]]) -> None:
    for result, fig in recorded:
        want = Counter(round(p["rate"], 6) for p in probes(result))
        assert sum(want.values()) >= 10
        for ax in fig.fig.axes:
            drawn = points(ax, "met:") + points(ax, "missed") + points(ax, "clipped")
            assert rates(drawn) == want, ax.get_ylabel()


def test_met_and_missed_points_sit_at_their_recorded_values(
    recorded: list[tuple[Result, CurveFigure]],
) -> None:
    for result, fig in recorded:
        ps = probes(result)
        tput = fig.fig.axes[0]
        assert sorted(points(tput, "met:")) == sorted(
            (p["rate"], p["summary"]["output_tok_s"]) for p in ps if p["met"]
        )
        assert sorted(points(tput, "missed")) == sorted(
            (p["rate"], p["summary"]["output_tok_s"]) for p in ps if not p["met"]
        )
        assert not by_gid(tput, "clipped")  # every probe has a finite throughput
        for i, (key, _) in P99_PANELS.items():
            ax = fig.fig.axes[i]
            finite = [(p, v) for p in ps if (v := p["summary"][key]["p99_ms"]) is not None]
            assert sorted(points(ax, "met:")) == sorted(
                (p["rate"], v) for p, v in finite if p["met"]
            )
            assert sorted(points(ax, "missed")) == sorted(
                (p["rate"], v) for p, v in finite if not p["met"]
            )


def test_infinite_p99s_are_clipped_to_a_labelled_ceiling(
    recorded: list[tuple[Result, CurveFigure]],
) -> None:
    for result, fig in recorded:
        ps = probes(result)
        for i, (key, limit) in P99_PANELS.items():
            ax = fig.fig.axes[i]
            inf = [p for p in ps if p["summary"][key]["p99_ms"] is None]
            assert inf and all(not p["met"] and p["summary"][key]["n_inf"] > 0 for p in inf)
            top = ceiling(ax)
            finite = [v for p in ps if (v := p["summary"][key]["p99_ms"]) is not None]
            assert top > max(finite) and top > limit
            assert top == pytest.approx(max([*finite, limit]) * curves.CEILING_HEADROOM)
            clipped = points(ax, "clipped")
            assert sorted(x for x, _ in clipped) == sorted(p["rate"] for p in inf)
            assert all(y == top for _, y in clipped)
            assert ax.get_ylim()[1] > top  # the markers are inside the panel
            (label,) = by_gid(ax, "clip-label")
            assert label.get_text() == f"▲ {len(inf)} missed (p99 = inf)"
            assert label.xy[1] == top
            (slo,) = by_gid(ax, "slo-limit")
            assert float(slo.get_ydata()[0]) == limit


def test_reported_slo_rate_is_a_vertical_line_on_every_panel(
    recorded: list[tuple[Result, CurveFigure]],
) -> None:
    for result, fig in recorded:
        rate = result.center("slo_rate_rps")
        assert rate is not None
        for ax in fig.fig.axes:
            (line,) = by_gid(ax, "boundary:in-tree")
            assert list(map(float, line.get_xdata())) == [rate, rate]
            assert line.get_label() == (
                f"reported SLO rate, in-tree: {rate:.2f} req/s (median of 3 runs)"
            )
        # the throughput right of the line is of missed probes (saturated), marked as such
        highest_met = max(r["boundary_rate"] for r in result.search_runs)
        beyond = [p for p in probes(result) if p["rate"] > highest_met]
        assert beyond and not any(p["met"] for p in beyond)
        missed_x = {x for x, _ in points(fig.fig.axes[0], "missed")}
        assert {p["rate"] for p in beyond} <= missed_x


def test_bf16_figures_from_the_recorded_run() -> None:
    """The numbers a reader sees in the bf16 chart of the nightly."""
    (bf16, _fp8) = results_of(load(FILES[0]))
    fig = figure_of(bf16)
    ttft = fig.fig.axes[1]
    assert ceiling(ttft) == pytest.approx(2000.0 * 1.15)
    assert len(points(ttft, "clipped")) == 6 and len(points(ttft, "met:")) == 8
    assert (15.940533240533336, 1973.450503279959) in points(ttft, "met:")
    clipped = sorted(round(x, 2) for x, _ in points(ttft, "clipped"))
    assert clipped == [15.94, 17.22, 17.22, 17.39, 20.41, 32.0]
    assert "6 missed the SLO" in fig.alt and "reported SLO rate 15.94 req/s" in fig.alt


def test_rendered_svg_holds_the_labels() -> None:
    (chart,) = [c for c in curves.curve_charts(results_of(load(FILES[1]))) if "fp8" in c.name]
    text = " ".join(re.findall(r"<!-- (.*?) -->", chart.svg.decode()))
    assert "▲ 5 missed (p99 = inf)" in text
    assert "missed, p99 = inf (drawn at the top)" in text
    assert "reported SLO rate, in-tree: 14.31 req/s (median of 3 runs)" in text
    assert "SLO missed" in text and "SLO limit" in text and "in-tree: SLO met" in text
    assert chart.png.startswith(b"\x89PNG")


# -- synthetic results -------------------------------------------------------------------------


def _summary(rate: float, ttft: Any, tpot: Any, n_inf: int = 0) -> dict[str, Any]:
    return {
        "output_tok_s": rate * 120.0,
        "ttft": {"p99_ms": ttft, "n_inf": n_inf},
        "tpot": {"p99_ms": tpot, "n_inf": n_inf},
    }


def _payload(probe_list: list[dict[str, Any]], slo: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "results": [
            {
                "nodeid": "perf_tests/test_x.py::test_synthetic",
                "config_label": "cfg-a",
                "outcome": "passed",
                "spec": {"slo": slo} if slo else {},
                "metrics": {"slo_rate_rps": {"runs": [2.0], "center": 2.0, "unit": "req/s"}},
                "search_runs": [{"probes": probe_list, "boundary_rate": 2.0}],
            }
        ],
    }


def _probe(rate: float, met: bool, summary: dict[str, Any]) -> dict[str, Any]:
    return {"rate": rate, "met": met, "summary": summary}


NO_FINITE = [
    _probe(4.0, False, _summary(4.0, None, None, n_inf=7)),
    _probe(8.0, False, _summary(8.0, "inf", "Infinity")),
    _probe(16.0, False, _summary(16.0, math.inf, None, n_inf=3)),
]


def test_no_finite_p99_at_all_still_draws_every_probe() -> None:
    slo = {"ttft_p99_ms": 500.0, "tpot_p99_ms": 40.0}
    fig = figure_of(only(_payload(copy.deepcopy(NO_FINITE), slo)))
    tput, ttft, tpot = fig.fig.axes
    assert sorted(x for x, _ in points(tput, "missed")) == [4.0, 8.0, 16.0]
    for ax, limit in ((ttft, 500.0), (tpot, 40.0)):
        assert not by_gid(ax, "met:") and not by_gid(ax, "missed")
        assert points(ax, "clipped") == [(x, limit * 1.15) for x in (4.0, 8.0, 16.0)]
        (label,) = by_gid(ax, "clip-label")
        assert label.get_text() == "▲ 3 missed (p99 = inf)"


def test_no_finite_p99_and_no_slo_uses_a_unit_ceiling() -> None:
    fig = figure_of(only(_payload(copy.deepcopy(NO_FINITE), None)))
    for ax in fig.fig.axes[1:]:
        assert ceiling(ax) == 1.0 and len(points(ax, "clipped")) == 3
        assert not by_gid(ax, "slo-limit")
        assert ax.get_ylim() == pytest.approx((0.0, 1.1))
    chart = curves.curve_charts(results_of(_payload(copy.deepcopy(NO_FINITE), None)))[0]
    assert "3 missed (p99 = inf)" in " ".join(re.findall(r"<!-- (.*?) -->", chart.svg.decode()))


def test_met_probe_without_a_p99_reads_na_not_inf() -> None:
    ps = [
        _probe(1.0, True, _summary(1.0, 100.0, 10.0)),
        _probe(2.0, True, {"output_tok_s": 240.0}),  # an old summary without latency stats
        _probe(3.0, False, _summary(3.0, 900.0, 60.0)),
    ]
    fig = figure_of(only(_payload(ps, {"ttft_p99_ms": 500.0, "tpot_p99_ms": 50.0})))
    ttft = fig.fig.axes[1]
    assert points(ttft, "met:") == [(1.0, 100.0)]
    assert points(ttft, "missed") == [(3.0, 900.0)]
    assert points(ttft, "clipped") == [(2.0, 900.0 * 1.15)]
    (label,) = by_gid(ttft, "clip-label")
    assert label.get_text() == "▲ 1 met (p99 n/a)"
    (marker,) = by_gid(ttft, "clipped")
    assert marker.get_label() == "no finite value (drawn at the top)"


def test_flat_p99_keys_of_older_files_are_read() -> None:
    ps = [_probe(1.0, True, {"output_tok_s": 10.0, "ttft_p99_ms": 120.0, "tpot_p99_ms": None})]
    fig = figure_of(only(_payload(ps, None)))
    assert points(fig.fig.axes[1], "met:") == [(1.0, 120.0)]
    assert points(fig.fig.axes[2], "clipped") == [(1.0, 1.0)]


def test_without_a_reported_rate_the_highest_met_rate_is_marked() -> None:
    ps = [
        _probe(1.0, True, _summary(1.0, 100.0, 10.0)),
        _probe(3.0, True, _summary(3.0, 200.0, 20.0)),
        _probe(5.0, False, _summary(5.0, None, None, n_inf=2)),
    ]
    payload = _payload(ps, None)
    payload["results"][0]["metrics"] = {}
    fig = figure_of(only(payload))
    (line,) = by_gid(fig.fig.axes[0], "boundary:cfg-a")
    assert list(line.get_xdata()) == [3.0, 3.0]
    assert line.get_label() == "highest met rate, cfg-a: 3.000 req/s"


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({"ttft": {"p99_ms": 12.5, "n_inf": 0}}, (12.5, "")),
        ({"ttft": {"p99_ms": None, "n_inf": 4}}, (None, "inf")),
        ({"ttft": {"p99_ms": None, "n_inf": 0}}, (None, "n/a")),
        ({"ttft": {"p99_ms": "inf"}}, (None, "inf")),
        ({"ttft": {"p99_ms": math.inf}}, (None, "inf")),
        ({"ttft": {"p99_ms": math.nan}}, (None, "n/a")),
        ({"ttft": {"p99_ms": True}}, (None, "n/a")),
        ({"ttft_p99_ms": "7.5"}, (7.5, "")),
        ({"ttft_p99_ms": "fast"}, (None, "n/a")),
        ({}, (None, "n/a")),
    ],
)
def test_panel_value(raw: dict[str, Any], want: tuple[float | None, str]) -> None:
    assert panel_value(raw, "ttft_p99_ms") == want


def test_sweep_rows_draw_every_row_and_clip_a_missing_p99() -> None:
    payload = _payload([], None)
    r = payload["results"][0]
    r["search_runs"] = []
    r["sweep"] = [
        {"concurrency": 1, "output_tok_s": 90.0, "ttft_p99_ms": 60.0, "tpot_p99_ms": 8.0},
        {"concurrency": 8, "output_tok_s": 700.0, "ttft_p99_ms": None, "tpot_p99_ms": 9.0},
    ]
    (fig,) = curves.curve_figures(results_of(payload))
    assert fig.name.startswith("sweep-")
    ttft = fig.fig.axes[1]
    assert points(ttft, "met:") == [(1.0, 60.0)]
    assert points(ttft, "clipped") == [(8.0, 60.0 * 1.15)]
    assert not by_gid(ttft, "boundary:")  # a sweep has no SLO boundary
