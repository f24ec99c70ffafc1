"""The typed result a perf test reads: ``result.metrics.slo_goodput_tok_s.center``.

``PerfResult`` parses what it writes with the report's own model (report/model.py), so the
figures a test asserts on are the ones the results file and the report show.
"""

from __future__ import annotations

import json
import math

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.report.model import parse_payload, parse_result
from pytest_moeperf.report.rows import Metric, Metrics, MoeConfigProof
from pytest_moeperf.session import PerfResult

DATA = {
    "config_label": "in-tree",
    "metrics": {
        "slo_goodput_tok_s": {"center": 1938.4, "runs": [1925.0, 2187.5, 1938.4], "unit": "tok/s"},
        "tok_per_j": {"center": None, "runs": [], "unit": "tok/J", "note": "no NVML here"},
    },
    "moe_config": {
        "name": "in-tree",
        "check": "in-tree: loaded /x/E=128,N=768,device_name=NVIDIA_H200.json",
        "loaded": ["/x/E=128,N=768,device_name=NVIDIA_H200.json"],
        "hash": "abc123",
    },
    "verdicts": [
        {
            "metric": "slo_goodput_tok_s",
            "outcome": "unchanged",
            "delta_rel": -0.01,
            "p_value": 0.4,
            "unit": "tok/s",
            "gating": True,
        }
    ],
}


def result(data: dict[str, object] | None = None) -> PerfResult:
    return PerfResult.from_dict("perf_tests/test_x.py::test_goodput", "passed", dict(data or DATA))


def test_metrics_read_as_attributes() -> None:
    m = result().metrics.slo_goodput_tok_s
    assert isinstance(m, Metric)
    assert (m.center, m.runs, m.unit) == (1938.4, (1925.0, 2187.5, 1938.4), "tok/s")
    assert m.measured and m.spread == (1925.0, 2187.5)


def test_a_metric_not_measured_keeps_its_note() -> None:
    m = result().metrics.tok_per_j
    assert m.center is None and not m.measured and m.note == "no NVML here"


def test_a_misspelt_metric_names_the_ones_there_are() -> None:
    with pytest.raises(AttributeError) as err:
        _ = result().metrics.slo_goodput  # a typo in a perf test
    assert str(err.value) == (
        "no metric 'slo_goodput' in this result (it has: slo_goodput_tok_s, tok_per_j)"
    )


def test_metrics_are_still_a_mapping() -> None:
    metrics = result().metrics
    assert isinstance(metrics, Metrics)
    assert sorted(metrics) == ["slo_goodput_tok_s", "tok_per_j"] and len(metrics) == 2
    assert metrics["slo_goodput_tok_s"] == metrics.slo_goodput_tok_s
    assert metrics.get("mbu") is None


def test_moe_config_proof_reads_as_attributes_and_as_the_recorded_object() -> None:
    proof = result().moe_config
    assert isinstance(proof, MoeConfigProof)
    assert proof.name == "in-tree" and proof.hash == "abc123"
    assert proof.loaded == ("/x/E=128,N=768,device_name=NVIDIA_H200.json",)
    assert proof.check.startswith("in-tree: loaded")
    assert proof.get("check") == proof.check and dict(proof) == DATA["moe_config"]


def test_a_result_without_a_moe_config_has_an_empty_proof() -> None:
    proof = result({"metrics": {}}).moe_config
    assert (proof.name, proof.check, proof.loaded, proof.hash) == (None, "", (), None)


def test_verdicts_are_typed_rows() -> None:
    (v,) = result().verdicts
    assert (v.metric, v.outcome, v.delta_rel, v.p_value, v.gating) == (
        "slo_goodput_tok_s", "unchanged", -0.01, 0.4, True,
    )  # fmt: skip


def test_a_wrongly_typed_field_names_the_test_and_the_field() -> None:
    bad = {**DATA, "metrics": {"slo_goodput_tok_s": {"center": "fast", "runs": []}}}
    with pytest.raises(UsageError) as err:
        _ = result(bad).metrics
    text = str(err.value)
    assert "the result of perf_tests/test_x.py::test_goodput" in text
    assert "result.metrics.slo_goodput_tok_s.center" in text and "'fast'" in text


def test_the_record_is_written_with_the_fields_the_run_set_and_no_defaults() -> None:
    """A run fills a ``ResultRecord`` field by field; the file gets those fields, not a null for
    every block the schema knows (``fleet``, ``sweep``, ``ab`` belong to the A/B gate)."""
    from pytest_moeperf.report.schema import BaselineEntry, MetricEntry, ResultRecord

    rec = ResultRecord(nodeid="t", quick=False)
    rec.metrics = {"slo_goodput_tok_s": MetricEntry(runs=[1.0, 3.0], unit="tok/s", center=2.0)}
    rec.baseline = BaselineEntry(status="missing")
    rec.accuracy = None  # set, to null: written as null
    out = PerfResult("t", "failed", rec, reasons=["SLO gate"]).to_dict()
    assert out == {
        "nodeid": "t", "outcome": "failed", "reasons": ["SLO gate"], "quick": False,
        "metrics": {"slo_goodput_tok_s": {"runs": [1.0, 3.0], "center": 2.0, "unit": "tok/s"}},
        "baseline": {"status": "missing"}, "accuracy": None,
    }  # fmt: skip


def test_a_relayed_record_with_an_unknown_field_is_one_error() -> None:
    """A worker's record is checked on the controller: a field the schema does not know."""
    with pytest.raises(UsageError) as err:
        PerfResult.from_dict("t", "passed", {"metrcs": {}})
    assert "the result of t" in str(err.value) and "metrcs" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_test_and_the_results_file_read_the_same_figures() -> None:
    """What the perf test asserts on is what the report reads back from the written file."""
    r = result()
    payload = json.loads(json.dumps({"schema_version": 1, "results": [r.to_dict()]}))
    (from_file,) = parse_payload(payload, "results.json").results
    assert from_file.metrics == r.metrics
    assert dict(from_file.moe_config) == dict(r.moe_config)
    assert from_file.verdicts == r.verdicts


def test_parse_result_keeps_infinite_runs_and_drops_an_infinite_center() -> None:
    rec = {"nodeid": "t", "metrics": {"ttft_p99_ms": {"center": math.inf, "runs": [math.inf]}}}
    m = parse_result(rec, "here").metrics.ttft_p99_ms
    assert m.center is None and m.runs == (math.inf,)
