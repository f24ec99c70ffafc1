"""The verdict table: alignment, marks, number formats and the explanation lines."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pytest_moeperf.report.table import MARKS, format_number, format_verdict_table
from pytest_moeperf.verdict import DEFAULT_METRICS, Verdict, judge

BASE = [1000.0, 1010.0, 990.0, 1005.0, 995.0]


def rows() -> list[Verdict]:
    g = DEFAULT_METRICS["slo_goodput_tok_s"]
    t = DEFAULT_METRICS["ttft_p99_ms"]
    m = DEFAULT_METRICS["mbu"]
    p = DEFAULT_METRICS["power_w"]
    return [
        judge(g, BASE, [950.0, 960.0, 940.0, 955.0, 945.0]),
        judge(t, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0]),
        judge(m, [0.61, 0.62, 0.6], [0.61, 0.615, 0.605]),
        judge(p, [300.0, 302.0], [301.0, 299.0]),
    ]


def test_title_header_and_one_line_per_row() -> None:
    text = format_verdict_table(rows(), title="moeperf: test_goodput")
    lines = text.splitlines()
    assert lines[0] == "moeperf: test_goodput"
    assert lines[1].split() == [
        "metric",
        "baseline",
        "band",
        "candidate",
        "delta",
        "p",
        "runs",
        "verdict",
    ]
    assert set(lines[2].replace(" ", "")) == {"-"}
    assert lines[3].startswith("slo_goodput_tok_s")
    assert lines[4].startswith("ttft_p99_ms")
    assert lines[5].startswith("mbu")
    assert lines[6].startswith("power_w")


def test_columns_are_aligned() -> None:
    lines = format_verdict_table(rows(), title="t").splitlines()
    header, rule, body = lines[1], lines[2], lines[3:7]
    # every column boundary of the dashed rule is a space in every row
    gaps = [i for i, ch in enumerate(rule) if ch == " "]
    for line in [header, *body]:
        for i in gaps:
            if i < len(line):
                assert line[i] == " ", (line, i)
    # right-aligned numeric columns end at the same place as their dashes
    ends = [
        i for i in range(len(rule)) if rule[i] == "-" and (i + 1 == len(rule) or rule[i + 1] == " ")
    ]
    delta_end = ends[4]
    for line in body:
        assert line[delta_end] == "%", line


def test_marks_for_each_outcome() -> None:
    text = format_verdict_table(rows(), title="t")
    assert "✗ regressed" in text
    assert "▲ improved" in text
    assert "✓ unchanged" in text
    assert "? inconclusive (info)" in text
    assert set(MARKS) == {"unchanged", "improved", "regressed", "inconclusive"}


def test_units_delta_and_runs() -> None:
    line = format_verdict_table(rows()[:1], title="t").splitlines()[3]
    assert "1,000 tok/s" in line
    assert "-5.00 %" in line
    assert "5/5" in line


def test_notes_only_for_rows_that_need_attention() -> None:
    text = format_verdict_table(rows(), title="t")
    notes = text.split("\n\n", 1)[1].splitlines()
    assert [n.split()[1] for n in notes] == ["slo_goodput_tok_s:", "ttft_p99_ms:", "power_w:"]
    assert notes[0].startswith("✗ slo_goodput_tok_s: -5.00 % (worse)")
    assert "too few runs" in notes[2] and "; run 1 more baseline" in notes[2]


def test_all_unchanged_has_no_notes() -> None:
    text = format_verdict_table(rows()[2:3], title="t")
    assert "\n\n" not in text


def test_missing_band_and_p_value_show_na() -> None:
    v = judge(DEFAULT_METRICS["mbu"], [0.6], [0.6, 0.61, 0.59])
    line = format_verdict_table([v], title="t").splitlines()[3]
    assert line.count("n/a") == 2


def test_infinite_delta() -> None:
    v = judge(DEFAULT_METRICS["slo_rate_rps"], [0.0, 0.0, 0.0], [1.0, 1.1, 0.9])
    assert "+inf %" in format_verdict_table([v], title="t")


def test_nan_delta() -> None:
    v = replace(judge(DEFAULT_METRICS["mbu"], [0.6] * 3, [0.6] * 3), delta_rel=math.nan)
    assert " n/a " in format_verdict_table([v], title="t") + " "


def test_empty_table() -> None:
    text = format_verdict_table([], title="nothing")
    assert text.splitlines()[0] == "nothing"
    assert "(no metrics to compare)" in text


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (12345.678, "12,346"),
        (999.94, "999.9"),
        (999.97, "1,000"),
        (99.996, "100.0"),
        (12.3456, "12.35"),
        (1.23456, "1.235"),
        (0.61234, "0.6123"),
        (0.0001234, "0.000123"),
        (0.0, "0"),
        (-5.5, "-5.500"),
        (math.nan, "n/a"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
    ],
)
def test_format_number(x: float, text: str) -> None:
    assert format_number(x) == text
