"""Everything one report shows, computed once and handed to both the HTML and Markdown writers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.report import charts, content, provenance
from pytest_moeperf.report.cards import Card, cards
from pytest_moeperf.report.charts import Chart, Missing
from pytest_moeperf.report.content import Table
from pytest_moeperf.report.curves import curve_charts
from pytest_moeperf.report.model import Result, Run


@dataclass(frozen=True)
class Document:
    title: str
    conclusion: str
    meta: str
    cards: tuple[Card, ...]
    notes: tuple[str, ...]  # results replaced by a later file, corrections applied
    bars: tuple[Chart | Missing, ...]
    curves: tuple[Chart, ...]
    numbers: Table
    verdicts: Table
    setup: Table
    hygiene: Table
    not_covered: tuple[str, ...]
    reproduce: tuple[str, ...]

    @property
    def charts(self) -> list[Chart]:
        return [c for c in (*self.bars, *self.curves) if isinstance(c, Chart)]


def build_document(
    runs: Sequence[Run],
    *,
    title: str,
    sources: Sequence[str],
    out: str,
    notes: Sequence[str] = (),
) -> Document:
    results = [r for run in runs for r in run.results]
    rated = next(
        (
            float(v)
            for r in results
            if isinstance(v := r.setup.get("rated_bandwidth_tb_s"), (int, float))
        ),
        None,
    )
    bars: tuple[Chart | Missing, ...] = ()
    curves: tuple[Chart, ...] = ()
    if results:
        families: dict[str, list[Result]] = {}
        for r in results:
            families.setdefault(r.family, []).append(r)
        named = len(families) > 1
        bars = tuple(
            charts.bar_chart(
                members,
                content.chart_metrics(members)[k],
                rated,
                test=family.rsplit("::", 1)[-1] if named else "",
                key=f"-{i}" if named else "",
            )
            for k in range(len(content.CHART_METRICS))
            for i, (family, members) in enumerate(families.items())
        )
        curves = tuple(curve_charts(results))
    return Document(
        title=title,
        conclusion=content.conclusion(runs),
        meta=provenance.generated_note(runs),
        cards=cards(results),
        notes=tuple(notes),
        bars=bars,
        curves=curves,
        numbers=content.numbers_table(results),
        verdicts=content.verdict_table(results),
        setup=provenance.setup_table(results) if results else Table(("",), ()),
        hygiene=provenance.hygiene_table(results),
        not_covered=tuple(provenance.not_covered(runs)),
        reproduce=tuple(provenance.reproduce(runs, sources, title, out)),
    )
