"""The key's spec hash: the spec, the measurement version, and an SLO that is not the spec's.

A run's boundary is the highest rate that meets *its* SLO, so every searched figure belongs to
that SLO. A ``moeperf_slo`` marker tightened from 2,000 to 1,000 ms used to keep the key, and
the next run was compared with the baseline of the old SLO: a lower boundary, "regressed".
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pytest_moeperf.run.probe import keyed_spec_hash
from pytest_moeperf.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent
SMOKE = load_spec(ROOT / "perf_tests" / "specs" / "cpu-smoke.yaml")


def test_the_specs_own_slo_keeps_the_hash_of_the_spec_alone() -> None:
    assert keyed_spec_hash(SMOKE, SMOKE.slo) == keyed_spec_hash(SMOKE)
    same = replace(SMOKE.slo, ttft_p99_ms=int(SMOKE.slo.ttft_p99_ms))  # a marker's int 2000
    assert keyed_spec_hash(SMOKE, same) == keyed_spec_hash(SMOKE)


def test_another_slo_is_another_key() -> None:
    tight = replace(SMOKE.slo, ttft_p99_ms=1000.0)
    looser = replace(SMOKE.slo, tpot_p99_ms=400.0)
    with_e2el = replace(SMOKE.slo, e2el_p99_ms=5000.0)
    hashes = {keyed_spec_hash(SMOKE, s) for s in (SMOKE.slo, tight, looser, with_e2el)}
    assert len(hashes) == 4
    as_int = replace(SMOKE.slo, ttft_p99_ms=1000)  # a marker's int: the same SLO as 1000.0
    assert keyed_spec_hash(SMOKE, as_int) == keyed_spec_hash(SMOKE, tight)


def test_the_committed_cpu_baseline_keeps_its_key() -> None:
    """The embedded test's marker repeats the spec's SLO: its stored key is still found."""
    (path,) = (ROOT / "baselines").rglob("cpu-*.json")
    stored = json.loads(path.read_text())["key"]["spec_hash"]
    marker = replace(SMOKE.slo, ttft_p99_ms=2000, tpot_p99_ms=200)  # perf_tests/test_embedded.py
    assert keyed_spec_hash(SMOKE, marker) == stored
