"""``moeperf measure``: the run without pytest, against the real vLLM CPU server.

One test per misuse (each exits 2 with one line naming the value, where it came from, and the
fix, before any server starts) and one real measurement through ``--server-url`` on the shared
session server: the same ``RunDriver`` the perf tests use finds a boundary and writes its runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.cli import main
from pytest_moeperf.server.process import VllmServer

#: A loose SLO and a 45 % tolerance: a few short probes find a boundary even on a busy VM (where
#: the probe at 16 req/s may fall behind; the boundary is then below it, else the floor at it).
SPEC = """
name: measure-cli
model: {path: embedded, dtype: bfloat16, max_model_len: 4096}
engine_args: {max-num-seqs: 16, enforce-eager: true}
workload: {trace: fixed, num_requests: 8, seed: 0, input_tokens: 32, output_tokens: 8}
arrival: {process: poisson, rate: 2.0}
slo: {ttft_p99_ms: 20000, tpot_p99_ms: 2000}
search: {rate_min: 8.0, rate_max: 16.0, tolerance: 0.45, max_probes: 4, probe_requests: 32}
runs: 1
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "measure.yaml"
    path.write_text(SPEC)
    return path


def test_a_missing_spec_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moeperf measure: error: ") and "nope.yaml" in err
    assert err.count("\n") == 1


def test_zero_runs_is_refused(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure", str(spec), "--runs", "0"]) == 2
    err = capsys.readouterr().err
    assert "--runs = 0: must be at least 1. Fix: pass 1 or more" in err


def test_a_moe_config_that_is_not_a_folder(spec: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert main(["measure", str(spec), "--moe-config", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "--moe-config" in err and "is not a folder" in err and "device_name" in err


def test_nothing_listening_at_the_url(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure", str(spec), "--server-url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "--server-url: moeperf_server_url = 'http://127.0.0.1:9': nothing answers there" in err


def test_measures_a_real_server_without_pytest(
    spec: Path, tmp_path: Path, cpu_server: VllmServer, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "runs.json"
    code = main(["measure", str(spec), "--server-url", cpu_server.base_url,
                 "--json", str(out_json)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "moeperf measure: warmed up" in out and "moeperf measure: run 1/1 probe 1 " in out
    assert "moeperf measure: run 1/1: SLO " in out, out  # the boundary, or a floor said so
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("moeperf measure: measure-cli: slo_goodput_tok_s median "), out
    doc = json.loads(out_json.read_text())
    assert doc["spec"] == "measure-cli" and len(doc["runs"]) == 1
    run, probes = doc["runs"][0], doc["runs"][0]["probes"]
    assert run["metrics"]["slo_goodput_tok_s"] > 0 and probes
    if len(probes) == 1:  # met at rate_max at once (a fast moment of the VM): the floor
        assert probes[0]["met"] and probes[0]["rate"] == 16.0, probes[0]
