"""The A/B gate through the plugin, up to the point where servers would start.

A real git repository gets commits that change config files; ``--moeperf-ab-range`` must turn
exactly the changed MoE config files into test parameters, skip with the reason where no A/B was
asked for or nothing changed, skip a file the test's model never reads, and refuse bad input
with one line. The real-server flow (two servers, pairs, control, sweep) runs in
tests/test_tutorial.py; the H200 run is in docs/results/h200-ab-2026-12-02/.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

NAME = "E=16,N=128,device_name=NVIDIA_H200.json"
OTHER = "E=128,N=768,device_name=NVIDIA_H200.json"
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


@pytest.fixture
def repo(pytester: pytest.Pytester) -> Path:
    """A git repo (the pytester dir) whose last commit re-tiles NAME and edits a non-config."""
    root = pytester.path
    pytester.makefile(".yaml", ab=SPEC)
    pytester.makepyfile(test_pr_gate=TEST)
    cfg = root / "configs"
    cfg.mkdir()
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "ci@example.com")
    _git(root, "config", "user.name", "ci")
    (cfg / NAME).write_text(json.dumps({"1": TILE, "64": TILE}))
    (root / "notes.json").write_text("{}")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base tiling")
    (cfg / NAME).write_text(json.dumps({"1": {**TILE, "BLOCK_SIZE_M": 16}, "64": TILE}))
    (root / "notes.json").write_text('{"a": 1}')
    _git(root, "commit", "-qam", "retile M=1")
    return root


def test_a_git_range_becomes_one_parameter_per_changed_config(
    pytester: pytest.Pytester, repo: Path
) -> None:
    result = pytester.runpytest("--collect-only", "-q", "--moeperf-ab-range", "HEAD~1..HEAD")
    result.stdout.fnmatch_lines(
        ["test_pr_gate.py::test_moe_config_ab[E=16,N=128,device_name=NVIDIA_H200]"]
    )
    assert "notes" not in result.stdout.str()
    assert result.ret == 0


def test_without_an_ab_option_the_test_skips_and_says_how(
    pytester: pytest.Pytester, repo: Path
) -> None:
    result = pytester.runpytest("-rs")
    result.stdout.fnmatch_lines(["*no A/B requested: pass --moeperf-ab-range*"])
    result.assert_outcomes(skipped=1)


def test_a_range_without_config_changes_skips_and_says_so(
    pytester: pytest.Pytester, repo: Path
) -> None:
    (repo / "README").write_text("docs only")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "docs")
    result = pytester.runpytest("-rs", "--moeperf-ab-range", "HEAD~1..HEAD")
    result.stdout.fnmatch_lines(["*no MoE config file changed in git range HEAD~1..HEAD*"])
    result.assert_outcomes(skipped=1)


def test_a_file_the_model_never_reads_is_skipped_with_the_expected_name(
    pytester: pytest.Pytester, repo: Path
) -> None:
    (repo / "configs" / OTHER).write_text(json.dumps({"1": TILE}))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "an H200 config for another model")
    result = pytester.runpytest("-rs", "--moeperf-ab-range", "HEAD~1..HEAD")
    result.stdout.fnmatch_lines([
        "*E=128,N=768,device_name=NVIDIA_H200.json is not looked up by this test's model "
        "(expects E=16,N=128,device_name=NVIDIA_H200.json: E 128 != 16, N 768 != 128)*"
    ])  # fmt: skip
    result.assert_outcomes(skipped=1)


def test_a_bad_range_is_one_usage_error(pytester: pytest.Pytester, repo: Path) -> None:
    result = pytester.runpytest("--moeperf-ab-range", "nosuchbranch...HEAD")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*git range: range = 'nosuchbranch...HEAD': revision "
                                 "'nosuchbranch' does not name a commit*Fix:*"])  # fmt: skip


def test_a_broken_head_file_fails_collection_naming_the_blob(
    pytester: pytest.Pytester, repo: Path
) -> None:
    (repo / "configs" / NAME).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 64}}))
    _git(repo, "commit", "-qam", "truncated tiling")
    result = pytester.runpytest("--moeperf-ab-range", "HEAD~1..HEAD")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert NAME in err and "BLOCK_SIZE_N" in err and "Fix:" in err


def test_folders_option_needs_two_folders(pytester: pytest.Pytester, repo: Path) -> None:
    result = pytester.runpytest("--moeperf-ab-folders", "configs")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--moeperf-ab-folders = 'configs': needs two folders*"])


def test_sweep_levels_are_checked_where_they_come_from(
    pytester: pytest.Pytester, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOEPERF_SWEEP", "1,four")
    result = pytester.runpytest("--moeperf-ab-range", "HEAD~1..HEAD")
    assert result.ret != 0
    assert "environment variable MOEPERF_SWEEP" in result.stdout.str() + result.stderr.str()
