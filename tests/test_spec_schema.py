"""The spec's pydantic schema (spec/schema.py): which error a spec with several gets, null as
absent, the published JSON Schema, and the plugin's start staying free of pydantic.

The one-line wording of each kind of error is tested in test_spec_loader.py, as before the
schema; these are the rules the schema brought."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from pytest_moeperf.errors import UsageError
from pytest_moeperf.spec.loader import load_spec_text

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = """\
name: tiny
model:
  path: embedded
  max_model_len: 1024
workload:
  trace: fixed
  num_requests: 16
  input_tokens: 64
  output_tokens: 16
arrival:
  rate: 2.0
slo:
  ttft_p99_ms: 2000
  tpot_p99_ms: 200
"""


def error_of(text: str) -> UsageError:
    with pytest.raises(UsageError) as info:
        load_spec_text(text, "spec.yaml")
    return info.value


def test_an_unknown_key_is_named_before_a_bad_value_of_its_section() -> None:
    text = MINIMAL.replace("  rate: 2.0", "  rate: fast\n  burstyness: 2")
    err = error_of(text)
    assert (err.what, err.problem) == ("arrival.burstyness", "unknown field")
    assert "did you mean `burstiness`?" in err.fix


def test_errors_come_in_the_order_the_file_is_read() -> None:
    """The first section with an error is named, whatever pydantic's own order."""
    text = MINIMAL.replace("max_model_len: 1024", "max_model_len: big").replace(
        "ttft_p99_ms: 2000", "ttft_p99_ms: -1"
    )
    assert error_of(text).what == "model.max_model_len"
    assert error_of(MINIMAL.replace("ttft_p99_ms: 2000", "ttft_p99_ms: -1")).what == (
        "slo.ttft_p99_ms"
    )


def test_a_field_of_another_trace_is_refused_before_its_type() -> None:
    """The fix is to remove it, not to correct it: a bad value there does not change that."""
    text = MINIMAL.replace("trace: fixed", "trace: chat-mix-v1").replace(
        "input_tokens: 64", "input_tokens: lots"
    )
    err = error_of(text)
    assert (err.what, err.problem) == ("workload.input_tokens", "only used by trace `fixed`")
    err = error_of(MINIMAL.replace("  rate: 2.0", "  rate: 2.0\n  concurrency: null"))
    assert (err.what, err.problem) == ("arrival.concurrency", "not used by process poisson")


def test_null_reads_as_absent_but_not_for_a_true_false_field() -> None:
    spec = load_spec_text(MINIMAL + "runs: null\nwindow:\n  cooldown_fraction: null\n")
    assert spec.runs == 3 and spec.window.cooldown_fraction == 0.1
    err = error_of(MINIMAL + "search:\n  rate_min: 1.0\n  warm_start: null\n")
    assert (err.what, err.problem) == ("search.warm_start", "must be true or false")
    assert error_of(MINIMAL + "name: null\n").problem == "field given twice"
    assert error_of(MINIMAL.replace("name: tiny", "name: null")).problem == (
        "missing required field"
    )


def test_numbers_keep_their_type_and_the_hash() -> None:
    """A whole number given for a float field is a float, as the hand loader made it: the
    spec hash (and every baseline keyed on it) does not move."""
    spec = load_spec_text(MINIMAL)
    assert isinstance(spec.slo.ttft_p99_ms, float) and isinstance(spec.arrival.rate, float)
    assert isinstance(spec.workload.num_requests, int)
    assert json.dumps(spec.to_dict()["slo"]) == (
        '{"ttft_p99_ms": 2000.0, "tpot_p99_ms": 200.0, "e2el_p99_ms": null}'
    )


@pytest.mark.parametrize("path", sorted((ROOT / "perf_tests" / "specs").glob("*.yaml")),
                         ids=lambda p: p.name)  # fmt: skip
def test_every_committed_spec_meets_the_published_json_schema(path: Path) -> None:
    schema = json.loads((ROOT / "docs" / "spec.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_the_published_schema_refuses_an_unknown_key() -> None:
    schema = json.loads((ROOT / "docs" / "spec.schema.json").read_text())
    data = yaml.safe_load(MINIMAL)
    data["slo"]["ttft_p99"] = 5
    with pytest.raises(jsonschema.ValidationError, match="ttft_p99"):
        jsonschema.validate(data, schema)


def test_the_plugin_starts_without_importing_pydantic() -> None:
    """Importing the spec package (the plugin does, at start) leaves pydantic for the first
    spec read: the schema module is imported inside the loader."""
    code = ("import sys, pytest_moeperf.plugin, pytest_moeperf.spec; "
            "print('pydantic' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
