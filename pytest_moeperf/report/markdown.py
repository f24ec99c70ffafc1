"""The Markdown twin of the HTML report, for PR comments and job summaries.

Charts are PNG files in ``<stem>_files/`` next to the .md (relative links, so the pair can be
moved or attached together). Text from the data is escaped so a ``|`` in a reason cannot break
a table and a ``<tag>`` in a config name is shown, not interpreted as HTML.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_moeperf.report.cards import Card
from pytest_moeperf.report.charts import Chart, Missing
from pytest_moeperf.report.content import Table
from pytest_moeperf.report.document import Document

_SPECIAL = re.compile(r"([\\`*_\[\]#|~])")


def md_escape(text: object) -> str:
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _SPECIAL.sub(r"\\\1", s)
    return " ".join(s.split())  # a newline would end a table row or a paragraph


def md_table(t: Table) -> str:
    lines = [
        "| " + " | ".join(md_escape(h) or " " for h in t.headers) + " |",
        "|" + "---|" * len(t.headers),
    ]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def _fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}sh\n{text}\n{ticks}"


def _charts(items: Sequence[Chart | Missing], files_dir: str) -> list[str]:
    out = []
    for c in items:
        if isinstance(c, Chart):
            out.append(f"![{md_escape(c.alt)}]({files_dir}/{c.name}.png)")
            out += [f"- *{md_escape(m)}*" for m in c.missing]
        else:
            out.append(f"**{md_escape(c.title)}**: " + "; ".join(md_escape(x) for x in c.lines))
        out.append("")
    return out


def _cards(cards: Sequence[Card], notes: Sequence[str]) -> list[str]:
    out = []
    for c in cards:
        out += [f"**{md_escape(c.config)}** · {md_escape(c.subtitle)}", ""]
        for f in c.figures:
            detail = f" — {md_escape(f.detail)}" if f.detail else ""
            out.append(f"- {md_escape(f.label)}: **{md_escape(f.value)}**{detail}")
        out.append("")
    if notes:
        out += ["Replaced and corrected results:", ""]
        out += [f"- {md_escape(n)}" for n in notes] + [""]
    return out


def render_markdown(doc: Document, files_dir: str) -> str:
    s = [
        f"# {md_escape(doc.title)}",
        "",
        f"**{md_escape(doc.conclusion)}**",
        "",
        f"<sub>{md_escape(doc.meta)}</sub>",
        "",
    ]
    if doc.cards:
        s += ["## Headline figures", "", *_cards(doc.cards, doc.notes)]
    s += [
        "## Results per metric",
        "",
        *_charts(doc.bars, files_dir),
    ]
    if doc.curves:
        s += ["## Throughput and latency curves", "", *_charts(doc.curves, files_dir)]
    s += [
        "## All numbers",
        "",
        md_table(doc.numbers),
        "",
        "## Verdicts against the baseline",
        "",
        md_table(doc.verdicts),
        "",
        "## Setup",
        "",
        md_table(doc.setup),
        "",
        "Machine hygiene, read once per server before load (nothing was changed on the machine):",
        "",
        md_table(doc.hygiene),
        "",
        "## Not covered",
        "",
        *(f"- {md_escape(x)}" for x in doc.not_covered),
        "",
        "## Reproduce",
        "",
        *(x for c in doc.reproduce for x in (_fence(c), "")),
    ]
    return "\n".join(s).rstrip("\n") + "\n"
