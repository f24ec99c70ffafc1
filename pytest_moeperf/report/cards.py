"""The headline cards: per config, the four figures a reader looks for first.

SLO goodput (with the rate and SLO it was measured at), energy efficiency (with the board power
behind it), MBU (against the rated bandwidth) and the run-to-run band (min-max of the runs over
the median: a difference smaller than the band is not shown by these runs). Plain strings, so
the HTML and Markdown writers show the same numbers; a missing figure says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.report.content import fmt, fmt_metric, missing_text, slo_text
from pytest_moeperf.report.model import Metric, Result, bar_labels

BAND_METRICS = (("slo_goodput_tok_s", "SLO goodput"), ("tok_per_j", "tok/J"))


@dataclass(frozen=True)
class CardFigure:
    label: str
    value: str
    detail: str


@dataclass(frozen=True)
class Card:
    config: str  # the label used everywhere else in the report
    subtitle: str
    figures: tuple[CardFigure, ...]


def band_width(m: Metric | None) -> float | None:
    """(max - min) / median of the runs; None with fewer than two finite runs."""
    if m is None or m.spread is None or not m.measured or not m.center:
        return None
    lo, hi = m.spread
    return (hi - lo) / m.center


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _missing(r: Result, name: str) -> str:
    m = r.metric(name)
    return fmt_metric(m, name) if m is not None else missing_text(None)


def _goodput(r: Result) -> CardFigure:
    m = r.metric("slo_goodput_tok_s")
    if m is None or not m.measured:
        return CardFigure("SLO goodput", _missing(r, "slo_goodput_tok_s"), slo_text(r.spec))
    # Each metric's centre is its own median: the goodput's run and the rate's run may differ
    # (H100 chat-mix: 1,447 tok/s from the run at 3.80 req/s, the median rate 3.655), so with
    # several runs the rate is the boundaries' median and range, not "the rate of" the goodput.
    rate, rm = r.center("slo_rate_rps"), r.metric("slo_rate_rps")
    at = f"at {fmt(rate, 'req/s')}, " if rate is not None else ""
    if rate is not None and rm is not None and rm.spread is not None:
        lo, hi = rm.spread
        at = (f"SLO boundary {fmt(rate, 'req/s')} (median of {len(rm.runs)} runs, "
              f"{fmt(lo, 'req/s')} to {fmt(hi, 'req/s')}), ")  # fmt: skip
    from pytest_moeperf.verdict.server_cost import capped

    if r.search_runs and all(capped(run) for run in r.search_runs):
        at += "met at search.rate_max, so a floor (the boundary is higher), "
    return CardFigure("SLO goodput", fmt_metric(m), f"{at}{slo_text(r.spec)}")


def _energy(r: Result) -> CardFigure:
    m = r.metric("tok_per_j")
    if m is None or not m.measured:
        return CardFigure("Energy efficiency", _missing(r, "tok_per_j"), "")
    power = r.metric("power_w")
    src = r.setup.get("power_source")
    detail = f"at {fmt_metric(power, 'power_w')} board power" if power and power.measured else ""
    if src:
        detail += f" ({src})" if detail else str(src)
    return CardFigure("Energy efficiency", fmt_metric(m), detail)


def _mbu(r: Result) -> CardFigure:
    m = r.metric("mbu")
    if m is None or not m.measured:
        return CardFigure("MBU", _missing(r, "mbu"), "")
    rated = r.setup.get("rated_bandwidth_tb_s")
    detail = f"of the rated {rated} TB/s HBM bandwidth" if rated else "of the rated bandwidth"
    return CardFigure("MBU", fmt_metric(m, "mbu"), detail + ", at the SLO boundary")


def _band(r: Result) -> CardFigure:
    goodput = r.metric("slo_goodput_tok_s")
    width = band_width(goodput)
    if goodput is None or goodput.spread is None or width is None:
        n = len(goodput.runs) if goodput is not None else 0
        return CardFigure("Run-to-run band", "n/a", f"{n} run(s) of SLO goodput: no band")
    lo, hi = goodput.spread
    parts = [f"SLO goodput {fmt(lo)}–{fmt(hi, goodput.unit)}"]
    tpj = r.metric("tok_per_j")
    if (w := band_width(tpj)) is not None and tpj is not None and tpj.spread is not None:
        parts.append(f"tok/J {fmt(tpj.spread[0])}–{fmt(tpj.spread[1])} ({_pct(w)})")
    v = r.verdict("slo_goodput_tok_s")
    if v is not None and v.band is not None:
        parts.append(f"baseline band {fmt(v.band[0])}–{fmt(v.band[1], v.unit)}")
    how = f"max − min over the median of {len(goodput.runs)} runs: "
    return CardFigure("Run-to-run band", _pct(width), how + "; ".join(parts))


def cards(results: Sequence[Result]) -> tuple[Card, ...]:
    out = []
    for label, r in zip(bar_labels(results), results, strict=True):
        dtype = r.setup.get("dtype") or "n/a"
        quant = r.setup.get("quantization")
        what = f"{dtype}" + (f", {quant}" if quant else "")
        subtitle = f"{r.spec.get('name') or r.nodeid} · {what} · {r.outcome}"
        out.append(Card(label, subtitle, (_goodput(r), _energy(r), _mbu(r), _band(r))))
    return tuple(out)
