"""The self-contained HTML file: inline CSS, charts as SVG data URIs, no scripts, no fetches.

Every string that comes from a results file goes through ``esc`` (html.escape with quotes), so a
config name or a command line holding ``<script>`` is shown, not run.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from pytest_moeperf.report.cards import Card
from pytest_moeperf.report.charts import Chart, Missing
from pytest_moeperf.report.content import Table
from pytest_moeperf.report.document import Document

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;
max-width:1150px;padding:0 1rem;color:#1b1b1b;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.3rem}h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;
margin-top:2rem}
p.conclusion{font-size:1.15rem;background:#f4f7fb;border-left:4px solid #4e79a7;
padding:.6rem .9rem}
p.meta{color:#666;font-size:.85rem}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
figure{margin:0;border:1px solid #eee;padding:.4rem;background:#fff}
figure img{display:block;max-width:100%;height:auto}
figcaption{font-size:.8rem;color:#555;max-width:520px}
.not-measured{color:#a00;font-style:italic}
div.missing{border:1px dashed #c99;padding:.6rem .9rem;min-width:260px;align-self:flex-start}
table{border-collapse:collapse;font-size:.82rem;margin:.5rem 0;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.25rem .45rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
td.bad{color:#a00;font-weight:600}td.good{color:#276b27;font-weight:600}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:.82rem}
.cards{display:flex;flex-wrap:wrap;gap:1rem}
.card{border:1px solid #dde3ea;border-radius:6px;padding:.6rem .9rem;min-width:300px;flex:1}
.card h3{margin:0;font-size:1rem}.card p.sub{margin:.1rem 0 .5rem;color:#666;font-size:.8rem}
.card dl{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:.5rem 1rem;margin:0}
.card dt{font-size:.75rem;color:#555;text-transform:uppercase;letter-spacing:.03em}
.card dd{margin:0}.card .value{font-size:1.35rem;font-weight:600}
.card .detail{display:block;font-size:.75rem;color:#555}
"""
_BAD = {"failed", "regressed", "no", "partial", "error", "warn", "noisy:"}
_GOOD = {"passed", "improved", "yes", "ok", "quiet:"}


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _img(chart: Chart) -> str:
    data = base64.b64encode(chart.svg).decode("ascii")
    cap = esc(chart.title)
    if chart.missing:
        cap += " — " + "; ".join(
            f'<span class="not-measured">{esc(m)}</span>' for m in chart.missing
        )
    return (
        f'<figure id="chart-{esc(chart.name)}"><img src="data:image/svg+xml;base64,{data}" '
        f'alt="{esc(chart.alt)}"><figcaption>{cap}</figcaption></figure>'
    )


def _missing(m: Missing) -> str:
    lines = "".join(f'<li class="not-measured">{esc(x)}</li>' for x in m.lines)
    return f'<div class="missing"><strong>{esc(m.title)}</strong><ul>{lines}</ul></div>'


def _charts(items: Sequence[Chart | Missing]) -> str:
    parts = [_img(c) if isinstance(c, Chart) else _missing(c) for c in items]
    return '<div class="charts">' + "".join(parts) + "</div>"


def _cell(text: str) -> str:
    word = text.split(" ", 1)[0]
    cls = ' class="bad"' if word in _BAD else ' class="good"' if word in _GOOD else ""
    return f"<td{cls}>{esc(text)}</td>"


def table(t: Table, css_id: str) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in t.rows)
    return f'<table id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cards(cards: Sequence[Card], notes: Sequence[str]) -> str:
    parts = []
    for c in cards:
        items = "".join(
            f'<div><dt>{esc(f.label)}</dt><dd><span class="value">{esc(f.value)}</span>'
            f'<span class="detail">{esc(f.detail)}</span></dd></div>'
            for f in c.figures
        )
        parts.append(
            f'<div class="card"><h3>{esc(c.config)}</h3><p class="sub">{esc(c.subtitle)}</p>'
            f"<dl>{items}</dl></div>"
        )
    out = '<div class="cards">' + "".join(parts) + "</div>"
    if notes:
        out += '<p class="meta">Replaced and corrected results:</p><ul id="notes">'
        out += "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"
    return out


def render_html(doc: Document) -> str:
    s: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # No network: this policy makes the browser refuse any fetch a future edit might add.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(doc.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(doc.title)}</h1>",
        f'<p class="conclusion" id="conclusion">{esc(doc.conclusion)}</p>',
        f'<p class="meta">{esc(doc.meta)}</p>',
    ]
    if doc.cards:
        s += ['<h2 id="headline">Headline figures</h2>', _cards(doc.cards, doc.notes)]
    s += [
        '<h2 id="results">Results per metric</h2>',
        _charts(doc.bars),
    ]
    if doc.curves:
        s += ['<h2 id="curves">Throughput and latency curves</h2>', _charts(doc.curves)]
    s += [
        '<h2 id="numbers">All numbers</h2>',
        table(doc.numbers, "numbers-table"),
        '<h2 id="verdicts">Verdicts against the baseline</h2>',
        table(doc.verdicts, "verdict-table"),
        '<h2 id="setup">Setup</h2>',
        table(doc.setup, "setup-table"),
        '<p class="meta">Machine hygiene, read once per server before load (nothing was '
        "changed on the machine):</p>",
        table(doc.hygiene, "hygiene-table"),
        '<h2 id="not-covered">Not covered</h2>',
        "<ul>" + "".join(f"<li>{esc(x)}</li>" for x in doc.not_covered) + "</ul>",
        '<h2 id="reproduce">Reproduce</h2>',
        "".join(f"<pre><code>{esc(c)}</code></pre>" for c in doc.reproduce),
        "</body></html>",
    ]
    return "\n".join(s) + "\n"
