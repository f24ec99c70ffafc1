"""External endpoint mode against a real vLLM CPU server that pytest did not start for the test.

The session's shared ``cpu_server`` is started by *this* pytest process; the perf test runs in a
pytester subprocess with ``--moeperf-server-url`` pointing at it, so from the inner run's view
it is a server started outside pytest, exactly like a Kubernetes service or a Ray Serve endpoint.
"""

from __future__ import annotations

import json
import math

import pytest
from vllm_needed import skip_without_vllm

from pytest_moeperf.report.schema import validate
from pytest_moeperf.server.process import VllmServer

skip_without_vllm()
pytest_plugins = ["pytester"]

# 5 probes: on a busy 2-core CI VM (2026-12-06) the probe at 16 req/s fell behind and the
# search needed a fourth to bring its 12..16 bracket inside 25 %; this test is about the
# external mode, not about how fast a search converges.
SPEC = """
name: external-small
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
workload: {trace: fixed, num_requests: 16, seed: 0, input_tokens: 64, output_tokens: 16}
arrival: {process: poisson, rate: 2.0}
slo: {ttft_p99_ms: 3000, tpot_p99_ms: 300}
search: {rate_min: 8.0, rate_max: 16.0, tolerance: 0.25, max_probes: 5, probe_requests: 32}
runs: 1
"""

TEST = """
import pytest

@pytest.mark.moeperf_spec("external.yaml")
@pytest.mark.moeperf_moe_config(name="tuned-v2")
def test_external(moeperf):
    moeperf.run()
"""


def test_perf_test_against_an_external_server(pytester: pytest.Pytester,
                                              cpu_server: VllmServer) -> None:  # fmt: skip
    pytester.makefile(".yaml", external=SPEC)
    pytester.makepyfile(test_ext=TEST)
    results = pytester.path / "results.json"
    base = pytester.path / "baselines"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--moeperf-server-url", cpu_server.base_url + "/v1",
        "--moeperf-results", str(results), "--moeperf-baseline-dir", str(base),
        "--moeperf-refresh-baselines", "--moeperf-reason", "external check", timeout=600,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"*moe config: declared, not set: tuned-v2 on external server {cpu_server.base_url}*",
    ])  # fmt: skip
    validate(json.loads((results).read_text()), "results.json")  # the schema
    r = json.loads(results.read_text())["results"][0]
    assert r["moe_config"]["check"].startswith("declared, not set: tuned-v2")
    assert r["moe_config"]["loaded"] == []
    # real metrics from the real server
    goodput = r["metrics"]["slo_goodput_tok_s"]["center"]
    assert goodput is not None and goodput > 0
    ttft = r["metrics"]["ttft_p99_ms"]["center"]
    assert ttft is not None and math.isfinite(ttft) and ttft > 0
    # energy: not measured here, and it says why
    tok_per_j = r["metrics"]["tok_per_j"]
    assert tok_per_j["center"] is None
    assert "external server: the GPUs serving it are not known here" in tok_per_j["note"]
    energy = r["search_runs"][0]["energy"][0]
    assert energy["method"] == "not_measured" and "--moeperf-gpus" in energy["reason"]
    # the setup and the baseline key say external; the engine version is the server's own
    setup = r["setup"]
    assert setup["backend"] == "external" and setup["gpu_count"] == 0
    assert setup["vllm_version"] == "0.32.0" and setup["accelerator"] == "unknown"
    assert "external" in r["baseline"]["path"]
    stored = json.loads(next(base.rglob("*.json")).read_text())
    assert stored["key"]["backend"] == "external"
    assert stored["key"]["moe_config_hash"] == "declared"
