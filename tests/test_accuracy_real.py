"""gsm8k 5-shot on the real vLLM CPU server, through the perf flow, gated per question.

The embedded model has random weights, so its accuracy is ~0: the point is the plumbing. Two
pytest runs (pytester subprocesses) of a perf test with ``moeperf_accuracy`` measure the shared
session server (``cpu_server``) through ``--moeperf-server-url``, with a two-probe search:
1. ``--moeperf-refresh-baselines`` stores a baseline holding every question's outcome (the
   marker's ``allow_uninformative=True`` says a near-zero score may be one);
2. the same test pairs its outcomes with the stored ones, passes, and says in the terminal and
   in the results file that accuracy is near zero on both sides and that the marker allowed it.
Without ``allow_uninformative`` such a refresh is refused (tests/test_accuracy_health.py).
"""

from __future__ import annotations

import json

import pytest
from vllm_needed import skip_without_vllm

from pytest_moeperf.server.process import VllmServer

skip_without_vllm()
pytest_plugins = ["pytester"]

LIMIT = 8

# Short probes: one at rate_min, one at rate_max; the SLO is loose so both meet it.
SPEC = """
name: accuracy-real
model: {path: embedded, dtype: bfloat16, max_model_len: 4096}
engine_args: {max-num-seqs: 16, enforce-eager: true}
workload: {trace: fixed, num_requests: 8, seed: 0, input_tokens: 32, output_tokens: 8}
arrival: {process: poisson, rate: 2.0}
slo: {ttft_p99_ms: 20000, tpot_p99_ms: 2000}
search: {rate_min: 8.0, rate_max: 16.0, tolerance: 0.1, max_probes: 2, probe_requests: 32}
runs: 1
"""

TEST = f"""
import pytest

@pytest.mark.moeperf_spec("acc.yaml")
@pytest.mark.moeperf_accuracy("gsm8k", shots=5, max_drop=1.0, limit={LIMIT},
                              allow_uninformative=True)
def test_gsm8k(moeperf):
    moeperf.run()
"""


def test_gsm8k_real_server_baseline_then_paired_gate(
    pytester: pytest.Pytester, cpu_server: VllmServer
) -> None:
    pytester.makefile(".yaml", acc=SPEC)
    pytester.makepyfile(test_acc=TEST)
    base = pytester.path / "baselines"
    results = pytester.path / "results.json"
    common = ["-p", "no:cacheprovider", "--moeperf-baseline-dir", str(base),
              "--moeperf-results", str(results), "--moeperf-server-url", cpu_server.base_url,
              "-rfE"]  # fmt: skip

    refresh = ["--moeperf-refresh-baselines", "--moeperf-reason", "gsm8k seed"]
    first = pytester.runpytest_subprocess(*common, *refresh, timeout=600)
    first.assert_outcomes(passed=1)
    (path,) = base.rglob("*.json")
    acc = json.loads(path.read_text())["accuracy"]
    assert (acc["task"], acc["shots"], acc["limit"], acc["n"]) == ("gsm8k", 5, LIMIT, LIMIT)
    rows = acc["per_question"]
    assert [r["index"] for r in rows] == list(range(LIMIT))
    assert {"strict_correct", "flexible_correct", "extracted_flexible", "target"} <= set(rows[0])
    # Every prompt fit and was answered: errors would fail the near-zero case (a dead server).
    assert acc["errors"] == 0, [r["error"] for r in rows if r["error"]][:3]
    assert acc["flexible_extract"] < 0.05 and acc["strict_match"] < 0.05
    assert acc["scope"] == f"first {LIMIT} questions (marker limit)"
    first.stdout.fnmatch_lines([f"*gsm8k 5-shot: strict * (n={LIMIT}, first {LIMIT} questions*"])

    second = pytester.runpytest_subprocess(*common, timeout=600)
    second.assert_outcomes(passed=1)
    data = json.loads(results.read_text())["results"][0]
    assert data["baseline"]["status"] == "compared"
    verdict = data["accuracy"]["verdict"]
    assert verdict["passed"] and not verdict["informative"]
    assert verdict["n"] == LIMIT and verdict["metric"] == "flexible_extract"
    assert verdict["baseline_acc"] < 0.05 and verdict["candidate_acc"] < 0.05
    assert verdict["reason"].startswith("not informative: accuracy near zero on both sides")
    assert verdict["reason"].endswith("allowed by allow_uninformative=True")
    second.stdout.fnmatch_lines(
        ["*accuracy gate passed (flexible_extract): not informative: accuracy near zero on both "
         "sides*allowed by allow_uninformative=True*"]
    )  # fmt: skip
