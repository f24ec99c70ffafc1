"""The results file's pydantic schema (report/schema.py): what the plugin writes, the report
reads, and docs/results.schema.json publishes are one declaration."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.report.model import parse_payload
from pytest_moeperf.report.schema import json_schema, validate
from pytest_moeperf.session import MoePerfSession

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "results_sample.json"


@pytest.fixture
def sample() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SAMPLE.read_text())
    return data


def committed_results() -> list[Path]:
    """Every session results file in the repository (GPU nights, CPU runs, test data)."""
    out = []
    for p in sorted([*ROOT.glob("docs/results/**/*.json"), *ROOT.glob("tests/data/*.json")]):
        try:
            data = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and "results" in data and "plugin_version" in data:
            out.append(p)
    return out


def test_every_committed_results_file_matches_the_schema() -> None:
    files = committed_results()
    assert len(files) >= 10, files  # the H200/H100 nights and the test data
    for p in files:
        validate(json.loads(p.read_text()), str(p))


def test_the_published_schema_is_current() -> None:
    committed = (ROOT / "docs" / "results.schema.json").read_text()
    assert committed == json_schema(), (
        "docs/results.schema.json is stale: python -m pytest_moeperf.report.schema > "
        "docs/results.schema.json"
    )


def test_the_schema_refuses_unknown_fields_where_the_plugin_owns_the_object() -> None:
    schema = json.loads(json_schema())
    for name in ("MetricEntry", "VerdictEntry", "ResultRecord", "MoeConfigEntry"):
        assert schema["$defs"][name]["additionalProperties"] is False, name
    assert schema["additionalProperties"] is False


def test_a_misspelt_field_is_one_error_naming_it(sample: dict[str, Any]) -> None:
    sample["results"][0]["metrics"]["mbu"]["centre"] = 0.4
    with pytest.raises(UsageError) as e:
        parse_payload(sample, "night.json")
    text = str(e.value)
    assert text.startswith("night.json: results[0].metrics.mbu.centre = 0.4: is not a field")
    assert text.endswith("Fix: correct or remove it; the fields here are center, note, runs, unit")
    assert "\n" not in text


def test_an_unknown_top_level_key_in_a_result_is_named(sample: dict[str, Any]) -> None:
    sample["results"][0]["goodput"] = 1.0
    with pytest.raises(UsageError, match=r"results\[0\]\.goodput = 1\.0: is not a field") as e:
        parse_payload(sample, "night.json")
    assert "the fields here are ab, accuracy, baseline, config_label" in e.value.fix
    sample["results"][0].pop("goodput")
    sample["results"][0]["moe_config"]["laoded"] = []
    with pytest.raises(UsageError, match=r"moe_config\.laoded = \[\]: is not a field") as e:
        parse_payload(sample, "night.json")
    assert e.value.fix.endswith("check, file, hash, loaded, name, source")


def test_free_form_blocks_keep_their_keys(sample: dict[str, Any]) -> None:
    """setup, search_runs and the like belong to other modules: any key passes through."""
    sample["results"][0]["setup"]["a_new_setup_field"] = "x"
    run = parse_payload(sample, "night.json")
    assert run.results[0].setup["a_new_setup_field"] == "x"


def test_nulls_the_plugin_writes_read_as_absent(sample: dict[str, Any]) -> None:
    r = sample["results"][0]
    r["sweep"], r["reasons"], r["verdicts"] = None, None, None
    r["metrics"]["mbu"]["unit"] = None
    got = parse_payload(sample, "night.json").results[0]
    assert got.sweep == () and got.reasons == () and got.verdicts == ()
    assert got.metrics.mbu.unit == ""


def test_a_result_that_does_not_match_is_still_written_and_said(
    sample: dict[str, Any],
) -> None:
    """The writer's check: the plugin's own bug must not cost the night's measurements."""
    session = MoePerfSession.__new__(MoePerfSession)
    session.warnings = []
    bad = copy.deepcopy(sample)
    bad["results"][0]["metrics"]["mbu"]["center"] = "0.4"
    session._check_schema(bad)
    assert len(session.warnings) == 1
    assert "does not match its schema" in session.warnings[0]
    assert (
        "results[0].metrics.mbu.center = '0.4': must be a number or null" in (session.warnings[0])
    )
    session.warnings.clear()
    session._check_schema(sample)
    assert session.warnings == []
