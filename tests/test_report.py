"""The HTML + Markdown report: content, escaping, self-containment, old/partial runs, misuse, CLI.

Rendered from the two samples in tests/data (a CPU nightly where energy is not measured, and an
H200-like A/B of two MoE configs with a sweep). Charts are drawn for real (matplotlib Agg);
the checks read the SVG text comments matplotlib writes for every label it draws.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf import report_cli
from pytest_moeperf.errors import UsageError
from pytest_moeperf.report import charts, content, curves, provenance
from pytest_moeperf.report.charts import Chart, Missing
from pytest_moeperf.report.html import render_html
from pytest_moeperf.report.markdown import md_escape, md_table, render_markdown
from pytest_moeperf.report.model import Metric, bar_labels, parse_payload, parse_payloads
from pytest_moeperf.report.render import build, read_results_file, write_report

DATA = Path(__file__).parent / "data"
CPU = DATA / "results_sample.json"
AB = DATA / "results_ab_h200.json"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def cpu() -> dict[str, Any]:
    return load(CPU)


@pytest.fixture
def ab() -> dict[str, Any]:
    return load(AB)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, Path]]:
    """Each sample rendered once (charts are the slow part): name -> (html, md, out dir)."""
    out = tmp_path_factory.mktemp("report")
    result = {}
    for name, path in (("cpu", CPU), ("ab", AB)):
        h, m = write_report([load(path)], out / name, title=f"{name} report", sources=[str(path)])
        result[name] = (h.read_text(), m.read_text(), out)
    return result


def lean(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload without search probes and sweeps: tests of text need no curve charts."""
    for r in payload["results"]:
        r["search_runs"], r["sweep"] = [], None
    return payload


def results_of(payload: dict[str, Any]) -> list[Any]:
    return list(parse_payload(payload, "test.json").results)


def svg_texts(chart: Chart) -> str:
    """All text matplotlib drew (it writes each string as an XML comment next to its glyphs)."""
    return " ".join(re.findall(r"<!-- (.*?) -->", chart.svg.decode()))


def body_text(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", html)


# -- conclusion first --------------------------------------------------------------------------


def test_conclusion_is_the_first_thing_after_the_title(rendered: dict[str, Any]) -> None:
    for name in ("cpu", "ab"):
        html, md, _ = rendered[name]
        body = html.split("<body>", 1)[1]
        assert re.match(r"\s*<h1>[^<]*</h1>\s*<p class=\"conclusion\"", body)
        md_lines = [x for x in md.splitlines() if x.strip()]
        assert md_lines[0].startswith("# ")
        assert md_lines[1].startswith("**") and md_lines[1].endswith("**")


def test_ab_conclusion_states_cards_and_energy(rendered: dict[str, Any]) -> None:
    html, md, _ = rendered["ab"]
    want = (
        "Serving the same SLO goodput as 64 cards of in-tree takes 57 cards with tuned-h200, "
        "and 8 % less energy per token."
    )
    assert want in html
    assert md_escape(want) in md


def test_fleet_sentence_says_more_energy_when_positive(ab: dict[str, Any]) -> None:
    ab["results"][1]["fleet"]["energy_per_token_rel"] = 0.12
    ab["results"][1]["fleet"]["cards"] = 71
    text = content.conclusion([parse_payload(ab, "ab.json")])
    assert text.startswith("Serving the same SLO goodput as 64 cards of in-tree takes 71 cards")
    assert "and 12 % more energy per token" in text


def test_fleet_sentence_with_unmeasured_energy_says_so(ab: dict[str, Any]) -> None:
    r = ab["results"][1]
    r["fleet"]["energy_per_token_rel"] = None
    r["metrics"]["tok_per_j"] = {"runs": [], "center": None, "unit": "tok/J", "note": "no NVML"}
    text = content.conclusion([parse_payload(ab, "ab.json")])
    assert "takes 57 cards with tuned-h200; energy per token not measured (no NVML)." in text
    assert "0 %" not in text


def test_fleet_row_of_the_reference_itself_is_not_a_fleet_sentence(ab: dict[str, Any]) -> None:
    ab["results"][1]["fleet"]["reference"] = "tuned-h200"
    text = content.conclusion([parse_payload(ab, "ab.json")])
    assert "cards of" not in text
    assert text.startswith("in-tree sustains 1,710 tok/s of SLO goodput")


def test_single_config_conclusion_gives_goodput_slo_and_verdict(cpu: dict[str, Any]) -> None:
    cpu["results"] = cpu["results"][:1]
    text = content.conclusion([parse_payload(cpu, "cpu.json")])
    assert text.startswith(
        "in-tree sustains 95.40 tok/s of SLO goodput (TTFT p99 ≤ 2,000 ms, TPOT p99 ≤ 200.0 ms) "
        "on cpu, unchanged against the baseline (-0.4 %, p = 0.41)."
    )
    assert "Energy per token was not measured (no NVML on this host)." in text
    assert "did not pass" not in text


def test_conclusion_without_verdict_names_the_baseline_status(cpu: dict[str, Any]) -> None:
    cpu["results"] = cpu["results"][:1]
    cpu["results"][0]["verdicts"] = []
    cpu["results"][0]["baseline"] = {"path": None, "status": "missing"}
    text = content.conclusion([parse_payload(cpu, "cpu.json")])
    assert "not compared with a baseline (baseline missing)" in text


def test_conclusion_names_results_that_did_not_pass(cpu: dict[str, Any]) -> None:
    text = content.conclusion([parse_payload(cpu, "cpu.json")])
    assert "1 of 2 results did not pass: in-tree (test_embedded_long_prompts) partial." in text


def test_conclusion_when_goodput_is_not_measured(cpu: dict[str, Any]) -> None:
    cpu["results"] = cpu["results"][:1]
    cpu["results"][0]["metrics"]["slo_goodput_tok_s"] = {
        "runs": [],
        "center": None,
        "unit": "tok/s",
        "note": "not measured: every probe aborted",
    }
    text = content.conclusion([parse_payload(cpu, "cpu.json")])
    assert text.startswith("SLO goodput of in-tree was not measured (every probe aborted).")


def test_conclusion_of_an_empty_session(cpu: dict[str, Any]) -> None:
    cpu["results"] = []
    assert content.conclusion([parse_payload(cpu, "cpu.json")]).startswith("No perf test")


def test_energy_sentence_absent_when_one_config_measured_it(ab: dict[str, Any]) -> None:
    ab["results"][0]["metrics"]["tok_per_j"] = {"runs": [], "center": None, "unit": "tok/J"}
    text = content.conclusion([parse_payload(ab, "ab.json")])
    assert "Energy per token was" not in text  # only when nothing measured it


# -- sections, charts, self-containment --------------------------------------------------------


def test_sections_in_order(rendered: dict[str, Any]) -> None:
    html, md, _ = rendered["ab"]
    ids = re.findall(r'<h2 id="([^"]+)"', html)
    assert ids == [
        "headline",
        "results",
        "curves",
        "numbers",
        "verdicts",
        "setup",
        "not-covered",
        "reproduce",
    ]
    heads = [x[3:] for x in md.splitlines() if x.startswith("## ")]
    assert heads == [
        "Headline figures",
        "Results per metric",
        "Throughput and latency curves",
        "All numbers",
        "Verdicts against the baseline",
        "Setup",
        "Not covered",
        "Reproduce",
    ]


def test_no_curve_section_without_search_or_sweep(cpu: dict[str, Any], tmp_path: Path) -> None:
    for r in cpu["results"]:
        r["search_runs"] = []
        r["sweep"] = None
    html, md = write_report([cpu], tmp_path / "r", title="t")
    assert 'id="curves"' not in html.read_text()
    assert "## Throughput and latency curves" not in md.read_text()


def test_html_embeds_every_chart_as_decodable_svg(rendered: dict[str, Any]) -> None:
    html, _, _ = rendered["ab"]
    uris = re.findall(r'<img src="data:image/svg\+xml;base64,([^"]+)"', html)
    assert len(uris) == 6  # goodput, tok/J, MBU, power, search curves, sweep curves
    for u in uris:
        svg = base64.b64decode(u).decode()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "</svg>" in svg


def test_html_is_self_contained(rendered: dict[str, Any]) -> None:
    for name in ("cpu", "ab"):
        html, _, _ = rendered[name]
        assert not re.search(r"https?://", html), "no URL may appear in the HTML"
        assert "<script" not in html and "<link" not in html and "@import" not in html
        assert "url(" not in html
        srcs = re.findall(r'\bsrc="([^"]*)"', html)
        assert srcs and all(s.startswith("data:") for s in srcs)
        assert "href=" not in html


def test_url_in_data_is_text_not_a_resource(cpu: dict[str, Any], tmp_path: Path) -> None:
    lean(cpu)
    cpu["command"] = "pytest perf_tests --moeperf-server-url http://10.0.0.5:8000"
    html = write_report([cpu], tmp_path / "r", title="t")[0].read_text()
    assert "http://10.0.0.5:8000" in body_text(html)
    assert all(s.startswith("data:") for s in re.findall(r'\bsrc="([^"]*)"', html))
    assert "href=" not in html


def test_html_has_a_csp_that_forbids_fetches(rendered: dict[str, Any]) -> None:
    html, _, _ = rendered["cpu"]
    assert "default-src 'none'" in html and "img-src data:" in html


def test_markdown_links_pngs_written_next_to_it(rendered: dict[str, Any]) -> None:
    _, md, out = rendered["ab"]
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == 6
    for link in links:
        assert link.startswith("ab_files/") and link.endswith(".png")
        data = (out / link).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_markdown_has_no_data_uris_or_urls(rendered: dict[str, Any]) -> None:
    for name in ("cpu", "ab"):
        _, md, _ = rendered[name]
        assert "data:" not in md and not re.search(r"https?://", md)


def test_output_is_deterministic(tmp_path: Path) -> None:
    """Same input, same bytes (but the --out path): reports can be diffed and cached."""
    a = write_report([load(AB)], tmp_path / "a", title="t")
    b = write_report([load(AB)], tmp_path / "b", title="t")
    for x, y in zip(a, b, strict=True):
        other = y.read_text().replace(str(tmp_path / "b"), str(tmp_path / "a"))
        assert x.read_text() == other.replace("b_files/", "a_files/")
    pngs = sorted(p.name for p in (tmp_path / "a_files").iterdir())
    assert pngs == sorted(p.name for p in (tmp_path / "b_files").iterdir())
    for name in pngs:
        assert (tmp_path / "a_files" / name).read_bytes() == (
            tmp_path / "b_files" / name
        ).read_bytes()


# -- not measured ------------------------------------------------------------------------------


def test_unmeasured_metric_shows_reason_instead_of_a_chart(rendered: dict[str, Any]) -> None:
    html, md, _ = rendered["cpu"]
    assert '<div class="missing"><strong>Energy efficiency: test_embedded_goodput</strong>' in html
    assert "in-tree: not measured (no NVML on this host)" in html
    assert "in-tree: not measured (no rated bandwidth for cpu)" in html
    assert "**Energy efficiency: test\\_embedded\\_goodput**: in-tree: not measured" in md
    assert 'id="chart-tok-per-j' not in html  # no zero bar for tok/J
    assert "0 tok/J" not in html


def test_bar_chart_returns_missing_when_nothing_measured(cpu: dict[str, Any]) -> None:
    results = results_of(cpu)[:1]
    got = charts.bar_chart(results, "tok_per_j", None)
    assert isinstance(got, Missing)
    assert got.lines == ("in-tree: not measured (no NVML on this host)",)


def test_bar_chart_labels_the_gap_when_one_config_is_unmeasured(ab: dict[str, Any]) -> None:
    ab["results"][0]["metrics"]["tok_per_j"] = {
        "runs": [],
        "center": None,
        "unit": "tok/J",
        "note": "NVML counter went backwards",
    }
    chart = charts.bar_chart(results_of(ab), "tok_per_j", None)
    assert isinstance(chart, Chart)
    assert chart.missing == ("in-tree: not measured (NVML counter went backwards)",)
    text = svg_texts(chart)
    assert "NVML counter" in text and "2.840" in text
    assert "in-tree: not measured" in chart.alt


def test_a_measured_zero_is_a_zero_not_not_measured() -> None:
    m = Metric(runs=(0.0, 0.0), center=0.0, unit="tok/s", note=None)
    assert m.measured and content.fmt_metric(m) == "0 tok/s"


def test_nan_center_is_not_measured(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["metrics"]["slo_goodput_tok_s"]["center"] = float("nan")
    r = results_of(cpu)[0]
    assert r.center("slo_goodput_tok_s") is None
    assert content.fmt_metric(r.metric("slo_goodput_tok_s")) == "not measured"


def test_missing_text_does_not_repeat_not_measured() -> None:
    assert content.missing_text("not measured: no NVML") == "not measured (no NVML)"
    assert content.missing_text("no NVML") == "not measured (no NVML)"
    assert content.missing_text(None) == "not measured"
    assert content.missing_text("not measured") == "not measured"


def test_metric_absent_from_an_old_run_reads_not_measured(cpu: dict[str, Any]) -> None:
    del cpu["results"][0]["metrics"]["mbu"]
    r = results_of(cpu)[0]
    assert content.fmt_metric(r.metric("mbu"), "mbu") == "not measured"


# -- chart content -----------------------------------------------------------------------------


def test_mbu_axis_runs_to_100_percent_of_rated_bandwidth(ab: dict[str, Any]) -> None:
    chart = charts.bar_chart(results_of(ab), "mbu", 4.8)
    assert isinstance(chart, Chart)
    text = svg_texts(chart)
    assert "% of 4.8 TB/s bandwidth" in text
    assert "100" in text.split() and "46.8 %" in text and "53.3 %" in text


def test_goodput_chart_draws_the_baseline_band(ab: dict[str, Any]) -> None:
    chart = charts.bar_chart(results_of(ab), "slo_goodput_tok_s", None)
    assert isinstance(chart, Chart)
    assert "baseline band" in svg_texts(chart)
    ab["results"][0]["verdicts"] = []
    ab["results"][1]["verdicts"] = []
    chart = charts.bar_chart(results_of(ab), "slo_goodput_tok_s", None)
    assert isinstance(chart, Chart) and "baseline band" not in svg_texts(chart)


def test_error_bars_span_min_to_max_of_runs() -> None:
    m = Metric(runs=(10.0, 12.0, 11.0), center=11.0, unit="", note=None)
    assert m.spread == (10.0, 12.0)
    assert Metric(runs=(10.0,), center=10.0, unit="", note=None).spread is None


def test_error_bars_are_drawn_per_bar(ab: dict[str, Any]) -> None:
    with_runs = charts.bar_chart(results_of(ab), "power_w", None)
    for r in ab["results"]:
        r["metrics"]["power_w"]["runs"] = [r["metrics"]["power_w"]["center"]]
    without = charts.bar_chart(results_of(ab), "power_w", None)
    assert isinstance(with_runs, Chart) and isinstance(without, Chart)
    caps = with_runs.svg.count(b'id="m'), without.svg.count(b'id="m')
    assert caps[0] > caps[1]  # cap markers of the error bars are defined only when drawn


def test_charts_of_several_tests_are_drawn_per_test(cpu: dict[str, Any]) -> None:
    lean(cpu)
    doc = build([cpu], title="t")
    names = [c.title for c in doc.bars]
    assert "SLO goodput: test_embedded_goodput" in names
    assert "SLO goodput: test_embedded_long_prompts" in names
    pngs = [c.name for c in doc.charts]
    assert len(pngs) == len(set(pngs))


def test_search_curves_against_arrival_rate_with_slo_lines(ab: dict[str, Any]) -> None:
    drawn = curves.curve_charts(results_of(ab))
    search = [c for c in drawn if c.name.startswith("search")]
    assert len(search) == 1
    text = svg_texts(search[0])
    assert "arrival rate (req/s)" in text and "TTFT p99 (ms)" in text and "TPOT p99 (ms)" in text
    assert "SLO limit" in text and "SLO missed" in text
    assert "in-tree" in text and "tuned-h200" in text


def test_sweep_curves_against_concurrency(ab: dict[str, Any]) -> None:
    drawn = curves.curve_charts(results_of(ab))
    sweep = [c for c in drawn if c.name.startswith("sweep")]
    assert len(sweep) == 1 and "concurrency" in svg_texts(sweep[0])
    assert "output tok/s" in svg_texts(sweep[0])


def test_rate_sweep_uses_request_rate_axis(ab: dict[str, Any]) -> None:
    for r in ab["results"]:
        r["search_runs"] = []
        for i, row in enumerate(r["sweep"]):
            row["concurrency"], row["rate"] = None, float(i + 1)
    drawn = curves.curve_charts(results_of(ab))
    assert len(drawn) == 1 and "request rate (req/s)" in svg_texts(drawn[0])


def test_probes_without_summary_are_skipped(cpu: dict[str, Any]) -> None:
    r = cpu["results"][0]
    r["search_runs"] = [{"probes": [{"rate": 1.0, "met": True}, {"rate": None, "summary": {}}]}]
    assert curves.curve_charts(results_of(cpu)) == []


def test_colors_are_stable_per_config(ab: dict[str, Any]) -> None:
    results = results_of(ab)
    c = charts.colors(results)
    assert set(c) == {"in-tree", "tuned-h200"} and c["in-tree"] != c["tuned-h200"]


# -- tables ------------------------------------------------------------------------------------


def test_all_numbers_table(ab: dict[str, Any]) -> None:
    t = content.numbers_table(results_of(ab))
    row = dict(zip(t.headers, t.rows[1], strict=True))
    assert row["config"] == "tuned-h200"
    assert row["engine"] == "vllm 0.11.0+cu130"
    assert row["MBU"] == "53.3 %"
    assert row["power"] == "662.0 W"
    assert row["SLO goodput"] == "1,925 tok/s"
    assert row["tok/J"] == "2.840 tok/J"
    assert row["TTFT p99"] == "402.0 ms"
    assert row["SLO met"] == "yes"
    assert row["accuracy"] == "gsm8k 90.8 %"
    assert row["accuracy Δ"] == "-0.4 pt"
    assert row["cards for equal goodput"] == "57 (vs 64 in-tree)"
    first = dict(zip(t.headers, t.rows[0], strict=True))
    assert first["cards for equal goodput"] == "n/a"


def test_numbers_table_of_cpu_run_reads_not_measured(cpu: dict[str, Any]) -> None:
    t = content.numbers_table(results_of(cpu))
    row = dict(zip(t.headers, t.rows[0], strict=True))
    assert row["tok/J"] == "not measured (no NVML on this host)"
    assert row["accuracy"] == "n/a" and row["accuracy Δ"] == "n/a"
    partial = dict(zip(t.headers, t.rows[1], strict=True))
    assert partial["outcome"] == "partial" and partial["TTFT p99"] == "not measured"
    assert partial["SLO met"] == "n/a"


def test_failed_accuracy_gate_is_marked(ab: dict[str, Any]) -> None:
    ab["results"][1]["accuracy"]["verdict"] = {"passed": False, "delta_points": -6.0}
    row = content.numbers_table(results_of(ab)).rows[1]
    assert "-6.0 pt (failed)" in row


def test_slo_met_no_when_p99_above_limit(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["metrics"]["ttft_p99_ms"]["center"] = 2500.0
    assert content.slo_met(results_of(cpu)[0]) == "no"


def test_slo_met_na_without_slo(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["spec"]["slo"] = None
    assert content.slo_met(results_of(cpu)[0]) == "n/a"


def test_verdict_table(ab: dict[str, Any]) -> None:
    t = content.verdict_table(results_of(ab))
    assert len(t.rows) == 7
    improved = next(r for r in t.rows if r[1] == "slo_goodput_tok_s" and r[0] == "tuned-h200")
    assert improved[2:8] == (
        "1,710 tok/s",
        "1,688..1,732",
        "1,925 tok/s",
        "+12.57 %",
        "1.2e-06",
        "improved",
    )
    assert any(r[7] == "unchanged (info)" for r in t.rows)  # power is informational


def test_verdict_table_says_not_compared_without_verdicts(cpu: dict[str, Any]) -> None:
    rows = content.verdict_table(results_of(cpu)).rows
    partial = [r for r in rows if r[0].endswith("(test_embedded_long_prompts)")]
    assert partial[0][7] == "not compared" and partial[0][8] == "baseline not-written: partial"


def test_verdict_advice_follows_the_reason(cpu: dict[str, Any]) -> None:
    rows = content.verdict_table(results_of(cpu)).rows
    ttft = next(r for r in rows if r[1] == "ttft_p99_ms")
    assert ttft[8].endswith("; run 7 more candidate runs to settle it")


def test_verdict_band_null_reads_na(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["verdicts"][0]["band"] = [None, None]
    rows = content.verdict_table(results_of(cpu)).rows
    assert rows[0][3] == "n/a"


def test_html_tables_mark_outcomes(rendered: dict[str, Any]) -> None:
    html, _, _ = rendered["ab"]
    assert '<td class="good">improved</td>' in html
    assert '<td class="good">passed</td>' in html


# -- setup, not covered, reproduce -------------------------------------------------------------


def test_setup_table_per_config_when_setups_differ(ab: dict[str, Any]) -> None:
    t = provenance.setup_table(results_of(ab))
    assert t.headers == ("", "in-tree", "tuned-h200")
    rows = {r[0]: r[1:] for r in t.rows}
    assert rows["accelerator"] == ("1 × NVIDIA H200", "1 × NVIDIA H200")
    assert rows["rated bandwidth"][0] == "4.8 TB/s"
    assert rows["driver / CUDA"][0] == "580.82.07 / 13.0"
    assert rows["parallelism"][0] == "tp=1, dp=1, ep=off"
    assert rows["power source"][0] == "nvml_total_energy_counter"
    assert rows["accuracy gate"][0] == "gsm8k, 5-shot, n=250"
    assert rows["runs per config, band"][0].startswith("5 runs (5 recorded)")
    assert rows["MoE config"][0].startswith("in-tree (hash")
    for key in ("model", "trace", "arrival", "SLO", "dtype / quantization", "engine (backend)"):
        assert key in rows


def test_setup_table_merges_identical_columns(cpu: dict[str, Any]) -> None:
    t = provenance.setup_table(results_of(cpu)[:1])
    assert t.headers == ("", "all configs")
    rows = {r[0]: r[1] for r in t.rows}
    assert rows["accelerator"] == "cpu"
    assert rows["rated bandwidth"] == "n/a"
    assert rows["accuracy gate"] == "none"


def test_setup_table_shows_the_host_calibration_the_result_recorded(cpu: dict[str, Any]) -> None:
    """What this machine measured, as the "another machine" warnings print it; older results
    say they have none, and a mangled block says so instead of failing the report."""
    figures = {"gemm_gflops": 41.2, "copy_gb_s": 9.81}

    def row() -> str:
        rows = {r[0]: r[1] for r in provenance.setup_table(results_of(cpu)[:1]).rows}
        return str(rows["host calibration"])

    assert row() == "not recorded"
    cpu["results"][0]["setup"]["calibration"] = {"version": 1, "figures": figures, "threads": 1}
    assert row() == "GEMM 41.2 GFLOP/s, copy 9.81 GB/s (1 thread)"
    cpu["results"][0]["setup"]["calibration"] = {"figures": "fast"}
    assert row() == "unreadable"


def test_not_covered_gpu_board_power_only(ab: dict[str, Any]) -> None:
    items = provenance.not_covered([parse_payload(ab, "ab.json")])
    assert items[0].startswith("Power and tok/J are GPU board power from NVML")
    assert "not the whole node" in items[0]
    assert not any("CPU backend" in x for x in items)


def test_not_covered_cpu_run(cpu: dict[str, Any]) -> None:
    items = provenance.not_covered([parse_payload(cpu, "cpu.json")])
    text = "\n".join(items)
    assert "Energy was not measured (no NVML on this host) on cpu" in text
    assert "The CPU backend ignores fused-MoE kernel configs" in text
    assert "cpu backend has no fused_moe Triton kernel" in text  # the recorded check
    assert "in-tree (test_embedded_long_prompts) is partial: interrupted after run 1" in text
    assert "was not compared with a baseline: not-written: partial" in text
    assert "Warning in cpu.json: spec cpu-long" in text
    assert "fixed 128/32 (poisson, burstiness 1.0)" in text


def test_not_covered_quick_mode(cpu: dict[str, Any]) -> None:
    cpu["quick"] = True
    assert any(
        x.startswith("Quick mode") for x in provenance.not_covered([parse_payload(cpu, "c")])
    )


def test_not_covered_gpu_without_accuracy(ab: dict[str, Any]) -> None:
    ab["results"][1]["accuracy"] = None
    items = provenance.not_covered([parse_payload(ab, "ab.json")])
    assert any(
        x.startswith("No accuracy measured for tuned-h200 (e.g. dummy weights)") for x in items
    )
    assert not any("for in-tree" in x and "accuracy" in x for x in items)


def test_not_covered_other_hardware_baseline(ab: dict[str, Any]) -> None:
    ab["results"][0]["baseline"]["status"] = "other-hardware"
    items = provenance.not_covered([parse_payload(ab, "ab.json")])
    assert "in-tree was not compared with a baseline: other-hardware." in items


def test_not_covered_few_runs(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["spec"]["runs"] = 1
    items = provenance.not_covered([parse_payload(cpu, "c")])
    assert any(x.startswith("Only 1 run(s) per config") for x in items)


def test_reproduce_lists_recorded_commands_then_report_command(ab: dict[str, Any]) -> None:
    runs = parse_payloads([ab], ["runs/ab night.json"])
    cmds = provenance.reproduce(runs, ["runs/ab night.json"], "H200 A/B", "out/rep")
    assert cmds[0] == ab["command"]
    assert cmds[1].startswith("vllm serve Qwen/Qwen3-30B-A3B")
    assert len(cmds) == 3  # the server command is the same for both configs: listed once
    assert cmds[-1] == "moeperf report 'runs/ab night.json' --title 'H200 A/B' --out out/rep"


def test_reproduce_section_in_both_files(rendered: dict[str, Any]) -> None:
    html, md, _ = rendered["cpu"]
    assert f"moeperf report {CPU} --title &#x27;cpu report&#x27;" in html
    assert f"moeperf report {CPU} --title 'cpu report'" in md
    assert "```sh\npytest perf_tests -m 'not moeperf_gpu'" in md


# -- escaping ----------------------------------------------------------------------------------


def test_html_escapes_text_from_the_data(cpu: dict[str, Any], tmp_path: Path) -> None:
    lean(cpu)
    r = cpu["results"][0]
    r["config_label"] = "<script>alert('x')</script>"
    r["reasons"] = ['"quoted" & <b>bold</b>']
    r["verdicts"][0]["reason"] = "<img src=x onerror=alert(1)>"
    cpu["command"] = "pytest -k 'a and not <b>'"
    html = write_report([cpu], tmp_path / "e", title="T <i>&</i>")[0].read_text()
    assert "<script>" not in html and "<img src=x" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<title>T &lt;i&gt;&amp;&lt;/i&gt;</title>" in html
    assert "pytest -k &#x27;a and not &lt;b&gt;&#x27;" in html


def test_alt_attribute_cannot_be_broken_out_of(ab: dict[str, Any], tmp_path: Path) -> None:
    lean(ab)
    ab["results"][0]["config_label"] = 'x" onload="alert(1)'
    html = write_report([ab], tmp_path / "e", title="t")[0].read_text()
    assert 'onload="alert(1)' not in html
    assert "x&quot; onload=&quot;alert(1)" in html


def test_markdown_escapes_html_and_table_pipes(cpu: dict[str, Any], tmp_path: Path) -> None:
    lean(cpu)
    r = cpu["results"][0]
    r["config_label"] = "a|b <script>"
    r["verdicts"][0]["reason"] = "line one\nline | two"
    md = write_report([cpu], tmp_path / "e", title="t")[1].read_text()
    assert "<script>" not in md and "&lt;script&gt;" in md
    for line in md.splitlines():
        if line.startswith("| "):
            cells = re.split(r"(?<!\\)\|", line)[1:-1]
            header_line = next(x for x in md.split("\n\n") if line in x).splitlines()[0]
            assert len(cells) == len(re.split(r"(?<!\\)\|", header_line)[1:-1])


def test_md_escape_and_table() -> None:
    assert md_escape("a_b*c`d[e]|f") == "a\\_b\\*c\\`d\\[e\\]\\|f"
    assert md_escape("x\ny  z") == "x y z"
    assert md_escape("<a>&") == "&lt;a&gt;&amp;"
    t = content.Table(("h1", "h2"), (("1", "2|3"),))
    assert md_table(t).splitlines() == ["| h1 | h2 |", "|---|---|", "| 1 | 2\\|3 |"]


def test_markdown_fence_survives_backticks_in_a_command(
    cpu: dict[str, Any], tmp_path: Path
) -> None:
    lean(cpu)
    cpu["command"] = "pytest -k 'a' ``` echo"
    md = write_report([cpu], tmp_path / "e", title="t")[1].read_text()
    assert "````sh\npytest -k 'a' ``` echo\n````" in md


# -- old and partial runs ----------------------------------------------------------------------


def test_minimal_old_run_still_renders(tmp_path: Path) -> None:
    payload = {"results": [{"nodeid": "perf_tests/test_x.py::test_old"}]}
    html, md = write_report([payload], tmp_path / "old", title="old run")
    text = body_text(html.read_text())
    assert "SLO goodput of default was not measured." in text
    assert "not measured" in text and "n/a" in text
    assert "Reproduce" in text and "moeperf report RESULTS.json" in text
    assert md.read_text().count("not measured") >= 4


def test_result_with_only_a_goodput_renders(cpu: dict[str, Any], tmp_path: Path) -> None:
    lean(cpu)
    r = cpu["results"][1]  # the partial result: no setup extras, one metric, no verdicts
    for key in ("spec", "setup", "moe_config"):
        r.pop(key)
    cpu["results"] = [r]
    html = write_report([cpu], tmp_path / "p", title="p")[0].read_text()
    assert "21.70 tok/s" in html and "partial" in html


def test_config_label_falls_back_to_moe_config_name(cpu: dict[str, Any]) -> None:
    r = cpu["results"][0]
    del r["config_label"]
    assert results_of(cpu)[0].config == "in-tree"
    del r["moe_config"]
    assert results_of(cpu)[0].config == "default"


def test_two_runs_of_one_config_are_told_apart(cpu: dict[str, Any]) -> None:
    cpu["results"] = cpu["results"][:1]
    runs = parse_payloads([cpu, copy.deepcopy(cpu)], ["mon.json", "tue.json"])
    results = [r for run in runs for r in run.results]
    assert bar_labels(results) == ["in-tree · run 1", "in-tree · run 2"]


def test_two_files_render_into_one_report(
    cpu: dict[str, Any], ab: dict[str, Any], tmp_path: Path
) -> None:
    html, _md = write_report(
        [cpu, ab], tmp_path / "both", title="both", sources=["c.json", "a.json"]
    )
    text = html.read_text()
    assert "c.json: 2 result(s)" in text and "a.json: 2 result(s)" in text
    assert "moeperf report c.json a.json --title both" in text
    assert "Serving the same SLO goodput as 64 cards of in-tree takes 57 cards" in text


def test_in_memory_payload_reads_like_its_file(cpu: dict[str, Any]) -> None:
    """The plugin passes its payload before JSON: tuples and Paths must not be "wrong type"."""
    r = cpu["results"][0]
    r["metrics"]["ttft_p99_ms"]["runs"] = tuple(r["metrics"]["ttft_p99_ms"]["runs"])
    r["verdicts"][0]["band"] = (93.9, 97.7)
    r["spec"]["path"] = Path("perf_tests/specs/cpu-smoke.yaml")
    r["reasons"] = ("a",)
    doc = build([lean(cpu)], title="t")
    assert doc.verdicts.rows[0][3] == "93.90..97.70"


# -- files -------------------------------------------------------------------------------------


def test_write_report_paths_and_suffix(cpu: dict[str, Any], tmp_path: Path) -> None:
    lean(cpu)
    html, md = write_report([cpu], tmp_path / "sub" / "night.json", title="t")
    assert html == tmp_path / "sub" / "night.html" and md == tmp_path / "sub" / "night.md"
    assert html.is_file() and md.is_file() and (tmp_path / "sub" / "night_files").is_dir()


def test_stale_pngs_of_an_earlier_report_are_removed(cpu: dict[str, Any], tmp_path: Path) -> None:
    lean(cpu)
    files = tmp_path / "r_files"
    files.mkdir()
    (files / "sweep-9-old.png").write_bytes(b"old")
    (files / "notes.txt").write_text("kept")
    write_report([cpu], tmp_path / "r", title="t")
    assert not (files / "sweep-9-old.png").exists()
    assert (files / "notes.txt").exists()


def test_report_files_follow_the_umask(cpu: dict[str, Any], tmp_path: Path) -> None:
    lean(cpu)
    old = os.umask(0o022)
    try:
        html, md = write_report([cpu], tmp_path / "r", title="t")
    finally:
        os.umask(old)
    for p in (html, md, *(tmp_path / "r_files").iterdir()):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
    assert not list(tmp_path.glob(".*.tmp"))


# -- misuse: each bad input is one UsageError naming the source and the field ------------------


def bad(payload: object, match: str) -> UsageError:
    with pytest.raises(UsageError, match=match) as e:
        parse_payload(payload, "night.json")
    assert str(e.value).startswith("night.json: ")
    return e.value


def test_top_level_not_an_object() -> None:
    bad([1, 2], r"\(top level\) = 'list': must be a JSON object")


def test_results_key_missing() -> None:
    bad({"schema_version": 1}, r"results = None: is missing")


def test_results_not_a_list() -> None:
    bad({"results": {"a": 1}}, r"\(top level\)\.results = \{'a': 1\}: must be a list")


def test_result_not_an_object() -> None:
    bad({"results": ["x"]}, r"results\[0\] = 'x': must be an object")


def test_result_without_nodeid() -> None:
    bad({"results": [{"outcome": "passed"}]}, r"results\[0\]\.nodeid = None: is missing")


def test_newer_schema_version(cpu: dict[str, Any]) -> None:
    cpu["schema_version"] = 2
    e = bad(cpu, r"schema_version = 2: this report reads schema_version <= 1")
    assert "upgrade pytest-moeperf" in e.fix


def test_schema_version_not_an_int(cpu: dict[str, Any]) -> None:
    cpu["schema_version"] = "1"
    bad(cpu, r"schema_version = '1'")


def test_metrics_not_an_object(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["metrics"] = [1]
    bad(cpu, r"results\[0\]\.metrics = \[1\]: must be an object")


def test_metric_entry_not_an_object(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["metrics"]["mbu"] = 0.4
    bad(cpu, r"results\[0\]\.metrics\.mbu = 0\.4: must be an object with runs and center")


def test_metric_runs_not_numbers(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["metrics"]["ttft_p99_ms"]["runs"] = [1.0, "fast"]
    bad(cpu, r"results\[0\]\.metrics\.ttft_p99_ms\.runs = \[1\.0, 'fast'\]: must be a list")


def test_metric_center_not_a_number(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["metrics"]["ttft_p99_ms"]["center"] = "612"
    bad(cpu, r"results\[0\]\.metrics\.ttft_p99_ms\.center = '612': must be a number or null")


def test_metric_center_bool(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["metrics"]["ttft_p99_ms"]["center"] = True
    bad(cpu, r"center = True: must be a number")


def test_verdicts_not_a_list(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["verdicts"] = {"metric": "x"}
    bad(cpu, r"results\[0\]\.verdicts = \{'metric': 'x'\}: must be a list")


def test_verdict_band_wrong_shape(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["verdicts"][0]["band"] = [1.0]
    bad(cpu, r"results\[0\]\.verdicts\[0\]\.band = \[1\.0\]: must be \[low, high\]")


def test_verdict_delta_not_a_number(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["verdicts"][1]["delta_rel"] = "5 %"
    bad(cpu, r"results\[0\]\.verdicts\[1\]\.delta_rel = '5 %'")


def test_reasons_not_strings(cpu: dict[str, Any]) -> None:
    cpu["results"][1]["reasons"] = "died"
    bad(cpu, r"results\[1\]\.reasons = 'died': must be a list of strings")


def test_warnings_not_strings(cpu: dict[str, Any]) -> None:
    cpu["warnings"] = [1]
    bad(cpu, r"\(top level\)\.warnings = \[1\]: must be a list of strings")


def test_setup_not_an_object(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["setup"] = "cpu"
    bad(cpu, r"results\[0\]\.setup = 'cpu': must be an object")


def test_search_runs_not_objects(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["search_runs"] = [3.2]
    bad(cpu, r"results\[0\]\.search_runs\[0\] = 3\.2: must be an object")


def test_long_bad_value_is_shortened(cpu: dict[str, Any]) -> None:
    cpu["results"][0]["setup"] = "x" * 500
    e = bad(cpu, r"must be an object")
    assert len(str(e)) < 300


def test_no_payloads() -> None:
    with pytest.raises(UsageError, match=r"write_report: payloads = \[\]: is empty"):
        parse_payloads([])


def test_sources_count_mismatch(cpu: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match=r"sources = \['a', 'b'\]: has 2 names for 1 payloads"):
        parse_payloads([cpu], ["a", "b"])


def test_empty_title(cpu: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"title = ' ': is empty. Fix: pass --title TEXT"):
        write_report([cpu], tmp_path / "r", title=" ")
    assert not list(tmp_path.iterdir())


def test_bad_payload_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"payload\[0\]: results"):
        write_report([{"nope": 1}], tmp_path / "r", title="t")
    assert not list(tmp_path.iterdir())


def test_read_results_file_missing(tmp_path: Path) -> None:
    p = tmp_path / "gone.json"
    with pytest.raises(UsageError, match=r"gone.json: results file = .*: does not exist"):
        read_results_file(p)


def test_read_results_file_not_json(tmp_path: Path) -> None:
    p = tmp_path / "log.json"
    p.write_text("=== 3 passed in 2.1s ===\n")
    with pytest.raises(UsageError, match=r"log.json: content = .*: is not JSON \(Expecting value"):
        read_results_file(p)


def test_read_results_file_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match=r"bin.json: results file = .*: cannot be read"):
        read_results_file(p)


def test_read_results_file_array(tmp_path: Path) -> None:
    p = tmp_path / "arr.json"
    p.write_text("[]")
    with pytest.raises(UsageError, match=r"arr.json: top level = 'list': must be a JSON object"):
        read_results_file(p)


# -- CLI ---------------------------------------------------------------------------------------


def test_cli_writes_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rep"
    rc = report_cli.main([str(CPU), "--title", "CPU nightly", "--out", str(out)])
    assert rc == 0
    assert (tmp_path / "rep.html").is_file() and (tmp_path / "rep.md").is_file()
    assert capsys.readouterr().out.strip() == f"report written to {out}.html and {out}.md"
    assert (
        f"moeperf report {CPU} --title &#x27;CPU nightly&#x27; --out {out}"
        in (tmp_path / "rep.html").read_text()
    )


def _cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert report_cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_cli_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _cli_error(
        [str(tmp_path / "nope.json"), "--title", "t", "--out", str(tmp_path / "r")], capsys
    )
    assert line.startswith("moeperf report: error: ") and "nope.json" in line
    assert "does not exist" in line
    assert not (tmp_path / "r.html").exists()


def test_cli_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "run.json"
    p.write_text("{not json")
    line = _cli_error([str(p), "--title", "t", "--out", str(tmp_path / "r")], capsys)
    assert str(p) in line and "is not JSON" in line


def test_cli_wrong_schema_names_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "base.json"
    p.write_text(json.dumps({"schema_version": 1, "metrics": {}}))
    line = _cli_error([str(CPU), str(p), "--title", "t", "--out", str(tmp_path / "r")], capsys)
    assert f"{p}: results = None: is missing" in line


def test_cli_bad_field_in_second_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = load(AB)
    data["results"][1]["metrics"]["mbu"]["center"] = "high"
    p = tmp_path / "ab.json"
    p.write_text(json.dumps(data))
    line = _cli_error([str(CPU), str(p), "--title", "t", "--out", str(tmp_path / "r")], capsys)
    assert f"{p}: results[1].metrics.mbu.center = 'high'" in line


def test_cli_requires_title(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_cli.main([str(CPU)]) == 2
    assert "--title" in capsys.readouterr().err


def test_cli_requires_a_results_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_cli.main(["--title", "t"]) == 2
    assert "RUN.json" in capsys.readouterr().err


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_cli.main(["--help"]) == 0
    assert "moeperf report" in capsys.readouterr().out


# -- the recorded H200 nightly of 2026-12-04: headline, cards, setup, not covered, reproduce ----

NIGHTLY = Path(__file__).parent.parent / "docs" / "results" / "h200-nightly-2026-12-04"
NIGHTLY_FILES = [str(NIGHTLY / "results-bf16-fp8-first.json"), str(NIGHTLY / "results-fp8.json")]
BF16, FP8 = "in-tree (test_h200_fixed_in_tree)", "in-tree (test_h200_fixed_fp8_in_tree)"


@pytest.fixture(scope="module")
def nightly() -> Any:
    payloads = [read_results_file(Path(p)) for p in NIGHTLY_FILES]
    return build(payloads, title="H200 nightly 2026-12-04", sources=NIGHTLY_FILES, out="r/n")


def test_nightly_takes_fp8_from_the_rerun(nightly: Any) -> None:
    assert [row[:3] for row in nightly.numbers.rows] == [
        (BF16, "perf_tests/test_h200.py::test_h200_fixed_in_tree", "passed"),
        (FP8, "perf_tests/test_h200.py::test_h200_fixed_fp8_in_tree", "passed"),
    ]
    replaced = nightly.notes[0]
    assert replaced.startswith(
        "perf_tests/test_h200.py::test_h200_fixed_fp8_in_tree [in-tree] of "
        f"{NIGHTLY_FILES[0]} (failed: the test failed after moeperf.run() (AssertionError:"
    )
    assert replaced.endswith(f"is replaced by the later {NIGHTLY_FILES[1]} (passed).")
    assert "did not pass" not in nightly.conclusion
    assert not any("baseline not-written" in x for x in nightly.not_covered)


def test_nightly_headline_gives_goodput_and_tok_per_j_per_config(nightly: Any) -> None:
    slo = "(TTFT p99 ≤ 2,000 ms, TPOT p99 ≤ 50.00 ms)"
    assert nightly.conclusion == (
        f"{BF16} sustains 1,938 tok/s of SLO goodput {slo} at 3.219 tok/J on NVIDIA H200, "
        "not compared with a baseline (this run wrote it). "
        f"{FP8} sustains 1,976 tok/s of SLO goodput {slo} at 5.426 tok/J on NVIDIA H200, "
        "not compared with a baseline (this run wrote it). "
        f"{FP8} against {BF16}: SLO goodput +1.9 % (inside the run-to-run bands: not a shown "
        "difference), tok/J +68.6 % (the run-to-run bands do not overlap)."
    )


def test_nightly_cards(nightly: Any) -> None:
    bf16, fp8 = nightly.cards
    assert (bf16.config, fp8.config) == (BF16, FP8)
    assert bf16.subtitle == "h200-fixed-1024-128 · bfloat16 · passed"
    assert fp8.subtitle == "h200-fixed-1024-128-fp8 · bfloat16, fp8 · passed"
    figs = {c.config: {f.label: (f.value, f.detail) for f in c.figures} for c in nightly.cards}
    slo = "TTFT p99 ≤ 2,000 ms, TPOT p99 ≤ 50.00 ms"
    rated = "of the rated 4.8 TB/s HBM bandwidth, at the SLO boundary"
    nvml = "board power (nvml_total_energy_counter)"
    assert figs[BF16] == {
        "SLO goodput": (
            "1,938 tok/s",
            f"SLO boundary 15.94 req/s (median of 3 runs, 14.76 req/s to 15.94 req/s), {slo}",
        ),
        "Energy efficiency": ("3.219 tok/J", f"at 576.1 W {nvml}"),
        "MBU": ("51.2 %", rated),
        "Run-to-run band": (
            "13.5 %",
            "max − min over the median of 3 runs: SLO goodput 1,925–2,187 tok/s; "
            "tok/J 2.984–3.293 (9.6 %)",
        ),
    }
    assert figs[FP8] == {
        "SLO goodput": (
            "1,976 tok/s",
            f"SLO boundary 14.31 req/s (median of 3 runs, 12.94 req/s to 15.09 req/s), {slo}",
        ),
        "Energy efficiency": ("5.426 tok/J", f"at 322.0 W {nvml}"),
        "MBU": ("45.0 %", rated),  # as amended in the baseline, not the recorded 84.5 %
        "Run-to-run band": (
            "18.9 %",
            "max − min over the median of 3 runs: SLO goodput 1,663–2,037 tok/s; "
            "tok/J 5.150–5.665 (9.5 %)",
        ),
    }


def test_nightly_fp8_mbu_is_the_amended_one_and_says_so(nightly: Any) -> None:
    amended = nightly.notes[1]
    assert amended.startswith(
        "perf_tests/test_h200.py::test_h200_fixed_fp8_in_tree [in-tree]: mbu 84.5 % → 45.0 %, "
        "as amended in the baseline this run wrote (baselines/perf_tests_test_h200.py--"
        "test_h200_fixed_fp8_in_tree-816173d2/"
    )
    assert "0.8449 -> 0.4503" in amended and "by benchmarks/h200/rederive_mbu.py" in amended
    assert len(nightly.notes) == 2  # the bf16 baseline was not amended
    assert [row[4] for row in nightly.numbers.rows] == ["51.2 %", "45.0 %"]


def test_nightly_setup_section(nightly: Any) -> None:
    assert nightly.setup.headers == ("", BF16, FP8)
    rows = {r[0]: r[1:] for r in nightly.setup.rows}
    assert rows["accelerator"] == ("1 × NVIDIA H200",) * 2
    assert (
        rows["GPU limits"] == ("700 W power limit, SM 1,980 MHz, memory 3,201 MHz, 140.4 GiB",) * 2
    )
    assert rows["host CPU"] == ("Intel(R) Xeon(R) Processor",) * 2
    assert rows["engine (backend)"] == ("vllm 0.24.0 (cuda)",) * 2
    assert rows["dtype / quantization"] == ("bfloat16 / none", "bfloat16 / fp8")
    assert rows["spec"] == ("h200-fixed-1024-128", "h200-fixed-1024-128-fp8")
    assert rows["MoE config"] == (
        "in-tree (hash n/a, 1 file(s) loaded)",
        "in-tree (hash n/a, 0 file(s) loaded)",
    )
    assert rows["runs per config, band"] == ("3 runs (3 recorded); error bars = min-max",) * 2


def test_nightly_not_covered(nightly: Any) -> None:
    items = nightly.not_covered
    assert f"No accuracy measured for {BF16}, {FP8} (e.g. dummy weights)" in items[1]
    assert (
        f"{FP8} loaded no fused-MoE config file (vLLM's default tiling): its figures are of the "
        "untuned kernel, not of a tuned config." in items
    )
    assert not any(x.startswith(f"{BF16} loaded no") for x in items)
    for label in (BF16, FP8):
        assert (
            f"{label} was not compared with a baseline: this run wrote it "
            "(--moeperf-refresh-baselines), so it has no verdict." in items
        )
    assert (
        "The run-to-run band of SLO goodput (max - min of the runs over the median) is 13.5 % "
        f"for {BF16}, 18.9 % for {FP8}: a difference smaller than that is not shown by these "
        "runs." in items
    )
    warnings = [x for x in items if x.startswith("Warning in ")]
    assert warnings == [
        f"Warning in {NIGHTLY_FILES[0]}, {NIGHTLY_FILES[1]}: vllm is installed but its server "
        "parser does not load here (ModuleNotFoundError: No module named "
        "'vllm.entrypoints.launchers')"
    ]


def test_nightly_reproduce_commands_paste_into_a_shell(nightly: Any) -> None:
    bf16_cmd, fp8_cmd, report = nightly.reproduce
    argv = shlex.split(bf16_cmd)
    assert argv[argv.index("-k") + 1] == "h200_fixed_in_tree or h200_fixed_fp8_in_tree"
    assert argv[argv.index("--moeperf-reason") + 1] == (
        "First H200 baselines (issue 16): steady-state probes, prefix caching off, 3 runs; "
        "vLLM 0.24.0, dummy weights"
    )
    assert argv[argv.index("--moeperf-results") + 1] == "/root/run/results.json"
    assert shlex.split(fp8_cmd)[shlex.split(fp8_cmd).index("-k") + 1] == "h200_fixed_fp8_in_tree"
    assert shlex.split(report) == [
        "moeperf",
        "report",
        *NIGHTLY_FILES,
        "--title",
        "H200 nightly 2026-12-04",
        "--out",
        "r/n",
    ]


def test_nightly_rendered_sections_hold_the_cards(nightly: Any) -> None:
    html, md = render_html(nightly), render_markdown(nightly, "n_files")
    for text in ("1,938 tok/s", "3.219 tok/J", "51.2 %", "13.5 %", "1,976 tok/s", "45.0 %"):
        assert f'<span class="value">{text}</span>' in html
    assert '<h2 id="headline">Headline figures</h2>' in html and '<ul id="notes">' in html
    assert "- SLO goodput: **1,938 tok/s** — SLO boundary 15.94 req/s (median of 3 runs" in md
    assert "- MBU: **45.0 %** — of the rated 4.8 TB/s HBM bandwidth" in md
    assert "- Run-to-run band: **18.9 %** — max − min over the median of 3 runs" in md
    assert md.index("## Headline figures") < md.index("Replaced and corrected results:")
    assert md.index("Replaced and corrected results:") < md.index("## Results per metric")


# -- several files: a later file wins per test ---------------------------------------------


def _rerun_pair(cpu: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    lean(cpu)
    first = copy.deepcopy(cpu)
    first["results"][0]["outcome"] = "failed"
    first["results"][0]["reasons"] = ["the test failed after moeperf.run() (AssertionError)"]
    first["warnings"] = [f"{first['results'][0]['nodeid']}: baseline not-written: failed", "w"]
    second = copy.deepcopy(cpu)
    second["results"] = second["results"][:1]
    second["results"][0]["metrics"]["slo_goodput_tok_s"]["center"] = 99.5
    return first, second


def test_later_file_wins_per_test(cpu: dict[str, Any]) -> None:
    first, second = _rerun_pair(cpu)
    doc = build([first, second], title="t", sources=["mon.json", "re-run.json"])
    rows = [(r[0], r[2], r[6]) for r in doc.numbers.rows]
    assert rows == [
        ("in-tree (test_embedded_long_prompts)", "partial", "21.70 tok/s"),
        ("in-tree (test_embedded_goodput)", "passed", "99.50 tok/s"),
    ]
    assert doc.notes == (
        "perf_tests/test_embedded.py::test_embedded_goodput [in-tree] of mon.json (failed: "
        "the test failed after moeperf.run() (AssertionError)) is replaced by the later "
        "re-run.json (passed).",
    )
    assert "Warning in mon.json: w" in doc.not_covered
    assert not any("baseline not-written: failed" in x for x in doc.not_covered)


def test_keeping_every_file_tells_the_runs_apart(cpu: dict[str, Any]) -> None:
    first, second = _rerun_pair(cpu)
    doc = build([first, second], title="t", sources=["a.json", "b.json"], latest_per_test=False)
    labels = [r[0] for r in doc.numbers.rows]
    assert labels == [
        "in-tree (test_embedded_goodput) · run 1",
        "in-tree (test_embedded_long_prompts)",
        "in-tree (test_embedded_goodput) · run 2",
    ]
    assert doc.notes == ()


def test_cli_several_files_later_wins(
    cpu: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = _rerun_pair(cpu)
    a, b = tmp_path / "first.json", tmp_path / "rerun.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    out = tmp_path / "rep"
    assert report_cli.main([str(a), str(b), "--title", "re-run", "--out", str(out)]) == 0
    md = (tmp_path / "rep.md").read_text()
    assert f"of {md_escape(a)} (failed" in md and f"by the later {md_escape(b)} (passed)" in md
    assert "· run 2" not in md and "99.50 tok/s" in md
    assert f"moeperf report {a} {b} --title re-run --out {out}" in md


# -- corrections amended into the baseline a result wrote -----------------------------------


def _amended_tree(cpu: dict[str, Any], tmp_path: Path, what: str = "mbu re-derived") -> Path:
    """A checkout: baselines/t/b.json (amended) and results/run.json recorded elsewhere."""
    lean(cpu)
    cpu["results"] = cpu["results"][:1]
    r = cpu["results"][0]
    r["baseline"] = {"status": "written", "path": "/root/repo/baselines/t/b.json"}
    r["metrics"]["mbu"] = {"runs": [0.8, 0.9, 0.7], "center": 0.8, "unit": "fraction"}
    stored = {k: m["runs"] for k, m in r["metrics"].items()}
    stored["mbu"] = [0.4, 0.5, 0.3]
    amendment = {"date": "2026-12-04", "by": "fix.py", "what": what, "why": "bf16 width"}
    (tmp_path / "baselines" / "t").mkdir(parents=True)
    (tmp_path / "baselines" / "t" / "b.json").write_text(
        json.dumps({"metrics": stored, "provenance": {"amended": [amendment]}})
    )
    (tmp_path / "results").mkdir()
    path = tmp_path / "results" / "run.json"
    path.write_text(json.dumps(cpu))
    return path


def test_amended_baseline_value_replaces_the_recorded_one(
    cpu: dict[str, Any], tmp_path: Path
) -> None:
    path = _amended_tree(cpu, tmp_path)
    doc = build([read_results_file(path)], title="t", sources=[str(path)])
    assert doc.numbers.rows[0][4] == "40.0 %"
    assert doc.notes == (
        "perf_tests/test_embedded.py::test_embedded_goodput [in-tree]: mbu 80.0 % → 40.0 %, "
        "as amended in the baseline this run wrote (baselines/t/b.json): 2026-12-04 by fix.py: "
        "mbu re-derived (why: bf16 width).",
    )


def test_amendment_not_naming_the_metric_is_not_applied(
    cpu: dict[str, Any], tmp_path: Path
) -> None:
    path = _amended_tree(cpu, tmp_path, what="power re-read")
    doc = build([read_results_file(path)], title="t", sources=[str(path)])
    assert doc.numbers.rows[0][4] == "80.0 %" and doc.notes == ()


def test_baseline_of_another_recording_is_not_applied(cpu: dict[str, Any], tmp_path: Path) -> None:
    path = _amended_tree(cpu, tmp_path)
    data = json.loads(path.read_text())
    data["results"][0]["metrics"]["slo_goodput_tok_s"]["runs"][0] += 1.0
    path.write_text(json.dumps(data))
    doc = build([read_results_file(path)], title="t", sources=[str(path)])
    assert doc.numbers.rows[0][4] == "80.0 %" and doc.notes == ()


def test_baseline_that_this_run_did_not_write_is_not_read(
    cpu: dict[str, Any], tmp_path: Path
) -> None:
    path = _amended_tree(cpu, tmp_path)
    data = json.loads(path.read_text())
    data["results"][0]["baseline"]["status"] = "compared"
    path.write_text(json.dumps(data))
    assert build([data], title="t", sources=[str(path)]).notes == ()


# -- recorded commands, re-quoted ------------------------------------------------------------


@pytest.mark.parametrize(
    ("recorded", "argv"),
    [
        ("pytest t.py -k a or b -v", ["pytest", "t.py", "-k", "a or b", "-v"]),
        ("pytest -m=not gpu --x", ["pytest", "-m=not gpu", "--x"]),
        ("pytest --moeperf-reason why; (1) -q", ["pytest", "--moeperf-reason", "why; (1)", "-q"]),
        ("pytest -k", ["pytest", "-k"]),
    ],
)
def test_requote_restores_free_text_arguments(recorded: str, argv: list[str]) -> None:
    assert shlex.split(provenance.requote(recorded)) == argv


def test_requote_leaves_quoted_and_other_commands_alone() -> None:
    assert provenance.requote("pytest -k 'a or b'") == "pytest -k 'a or b'"
    assert provenance.requote("vllm serve m --dtype bf16") == "vllm serve m --dtype bf16"


def test_a_goodput_met_at_rate_max_is_called_a_floor() -> None:
    """Every run met the SLO at search.rate_max: the card says the figure is a floor."""
    payload = read_results_file(Path(NIGHTLY_FILES[0]))
    capped = copy.deepcopy(payload)
    for result in capped["results"]:
        for run in result["search_runs"]:
            run["bracket"], run["converged"] = [run["bracket"][0], None], True
    cards = {c.config: c for c in build([capped], title="t", sources=NIGHTLY_FILES[:1],
                                        out="r/n").cards}  # fmt: skip
    detail = {f.label: f.detail for f in cards[BF16].figures}["SLO goodput"]
    assert "met at search.rate_max, so a floor (the boundary is higher)" in detail, detail
    plain = {c.config: c for c in build([payload], title="t", sources=NIGHTLY_FILES[:1],
                                        out="r/n").cards}  # fmt: skip
    assert "floor" not in {f.label: f.detail for f in plain[BF16].figures}["SLO goodput"]
