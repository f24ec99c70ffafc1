"""The baseline file's pydantic schema (baseline/schema.py): what the store reads, writes and
docs/baseline.schema.json publishes are one declaration, and its errors keep the one-line form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.baseline.schema import BaselineFile, json_schema, validate
from pytest_moeperf.baseline.storage import read_baseline_file
from pytest_moeperf.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted(ROOT.glob("baselines/**/*.json"))


@pytest.fixture
def cpu() -> dict[str, Any]:
    (path,) = ROOT.glob("baselines/**/cpu-*.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def error(data: object) -> str:
    with pytest.raises(UsageError) as e:
        validate(BaselineFile, data, "b.json")
    text = str(e.value)
    assert "\n" not in text and "Fix: " in text
    return text


def test_the_published_schema_is_current() -> None:
    committed = (ROOT / "docs" / "baseline.schema.json").read_text()
    assert committed == json_schema(), (
        "docs/baseline.schema.json is stale: python -m pytest_moeperf.baseline.schema > "
        "docs/baseline.schema.json"
    )


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name[:40] + "/" + p.name[:24])
def test_every_committed_baseline_matches_the_schema(path: Path) -> None:
    validate(BaselineFile, json.loads(path.read_text()), str(path))
    assert read_baseline_file(path).metrics


def test_there_are_committed_baselines_to_check() -> None:
    assert len(COMMITTED) >= 4  # the CPU default's and the GPU nights'


def test_types_are_strict_not_converted(cpu: dict[str, Any]) -> None:
    """A bool is not a run's value and a number is not a commit: refused, never coerced."""
    cpu["metrics"]["slo_goodput_tok_s"] = [True, 1.0, 2.0]
    assert error(cpu).startswith(
        "b.json: metrics.slo_goodput_tok_s = [True, 1.0, 2.0]: must be a list of finite numbers"
    )
    cpu["metrics"]["slo_goodput_tok_s"] = [1.0, 2.0, 3.0]
    cpu["provenance"]["commit"] = 123
    assert error(cpu).startswith("b.json: provenance.commit = 123: must be a string")


def test_every_missing_field_of_one_object_is_named_at_once(cpu: dict[str, Any]) -> None:
    del cpu["runs"], cpu["provenance"]
    text = error(cpu)
    assert "misses field(s) runs, provenance" in text
    assert text.startswith("b.json: baseline = ['accuracy', 'key', 'metrics', 'schema_version',")


def test_a_calibration_problem_names_its_field(cpu: dict[str, Any]) -> None:
    del cpu["key"]["calibration"]["figures"]
    assert error(cpu).startswith("b.json: key.calibration.figures = None: must map names to "
                                 "finite numbers >= 0")  # fmt: skip
    cpu["key"]["calibration"] = "fast"
    assert error(cpu).startswith("b.json: key.calibration = 'fast': must be an object or null")


def test_unknown_keys_kept_at_the_top_and_ignored_inside(cpu: dict[str, Any]) -> None:
    """A newer plugin's top-level field survives a refresh by this one (Baseline.extra); inside
    the key, provenance and calibration an unknown field does not change what is compared."""
    cpu["dashboard_note"] = {"owner": "kernels"}
    cpu["key"]["rack"] = "r12"
    cpu["provenance"]["ci_job"] = 7
    got = validate(BaselineFile, cpu, "b.json")
    assert got.model_extra == {"dashboard_note": {"owner": "kernels"}}
    assert "rack" not in got.key.model_dump() and "ci_job" not in got.provenance.model_dump()


def test_the_plugin_starts_without_importing_pydantic() -> None:
    """The plugin's start stays light (pydantic comes with the first file read)."""
    code = ("import sys, pytest_moeperf.plugin, pytest_moeperf.baseline; "
            "print('pydantic' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
