"""The A/B gate's pieces without a server: cases from git, matching, interleaving, the summary."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_moeperf.ab.cases import (
    AbCase,
    case_from_change,
    device_mismatch,
    discover,
    dtype_selector,
    mismatch,
)
from pytest_moeperf.ab.interleave import run_interleaved, schedule, sweep_order
from pytest_moeperf.ab.summary import fleet_of, markdown_summary, overall, tiling_lines
from pytest_moeperf.errors import UsageError
from pytest_moeperf.verdict import judge
from pytest_moeperf.verdict.metrics import get_metric

NAME = "E=16,N=128,device_name=NVIDIA_H200.json"
TINY = {"model_type": "qwen3_moe", "num_experts": 16, "moe_intermediate_size": 128}
TILE = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
        "num_warps": 4, "num_stages": 3}  # fmt: skip


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _repo(tmp_path: Path, files: dict[str, dict[str, Any] | str],
          changes: dict[str, dict[str, Any] | str | None]) -> Path:  # fmt: skip
    repo = tmp_path / "repo"
    (repo / "configs").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")

    def write(name: str, content: dict[str, Any] | str | None) -> None:
        p = repo / "configs" / name
        if content is None:
            p.unlink()
        else:
            p.write_text(content if isinstance(content, str) else json.dumps(content))

    (repo / "README").write_text("x")
    for n, c in files.items():
        write(n, c)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    for n, c in changes.items():
        write(n, c)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "head")
    return repo


# -- interleaving --------------------------------------------------------------------------------
def test_schedule_is_counterbalanced() -> None:
    assert schedule(3) == [("base", 0), ("head", 0), ("head", 1), ("base", 1), ("base", 2),
                           ("head", 2)]  # fmt: skip
    order = schedule(4)
    # a linear drift adds the same total to both sides over every two pairs
    pos = {s: sum(i for i, (side, _) in enumerate(order) if side == s) for s in ("base", "head")}
    assert pos["base"] == pos["head"]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_schedule_rejects_bad_pairs(bad: Any) -> None:
    with pytest.raises(UsageError, match="pairs"):
        schedule(bad)


def test_run_interleaved_measures_in_order_and_keeps_sides_apart() -> None:
    calls: list[tuple[str, int]] = []

    def measure(side: str, k: int) -> str:
        calls.append((side, k))
        return f"{side}{k}"

    out = run_interleaved(measure, 2, ("base", "control"))
    assert calls == [("base", 0), ("control", 0), ("control", 1), ("base", 1)]
    assert out.of("base") == ["base0", "base1"] and out.of("control") == ["control0", "control1"]


def test_run_interleaved_stops_at_the_first_failure() -> None:
    def measure(side: str, k: int) -> int:
        if (side, k) == ("head", 1):
            raise RuntimeError("server died")
        return k

    with pytest.raises(RuntimeError, match="server died"):
        run_interleaved(measure, 3)


def test_sweep_order_alternates_and_checks_levels() -> None:
    assert sweep_order([1, 4]) == [(1, "base"), (1, "head"), (4, "head"), (4, "base")]
    with pytest.raises(UsageError, match="moeperf-sweep"):
        sweep_order([0, 4])
    with pytest.raises(UsageError):
        sweep_order([])


# -- cases --------------------------------------------------------------------------------------
def test_discover_from_a_git_range(tmp_path: Path) -> None:
    poor = {"1": {**TILE, "BLOCK_SIZE_M": 16}}
    repo = _repo(tmp_path, {NAME: {"1": TILE}, "notes.json": "{}"},
                 {NAME: poor, "notes.json": '{"a": 1}'})  # fmt: skip
    cases = discover(repo, git_range="HEAD~1..HEAD", folders=None, source="test")
    assert [c.file_name for c in cases] == [NAME]
    c = cases[0]
    assert c.status == "modified" and c.id == NAME.removesuffix(".json")
    assert c.base.files[NAME][1].block_size_m == 64
    assert c.head.files[NAME][1].block_size_m == 16
    assert "HEAD~1..HEAD" in c.origin and ":configs/" in c.base.where
    assert c.control().files == c.base.files and c.control().label == "control"


def test_an_added_file_is_in_tree_on_the_base_side(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {}, {NAME: {"8": TILE}})
    (c,) = discover(repo, git_range="HEAD~1...HEAD", folders=None, source="test")
    assert c.status == "added" and c.base.in_tree and c.base.where == "in-tree"
    assert not c.head.in_tree


def test_a_broken_head_file_fails_before_any_server(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {NAME: {"1": TILE}}, {NAME: {"one": TILE}})
    with pytest.raises(UsageError) as info:
        discover(repo, git_range="HEAD~1..HEAD", folders=None, source="test")
    assert "'one'" in str(info.value) and NAME in str(info.value)


def test_discover_from_folders(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (b / NAME).write_text(json.dumps({"4": TILE}))
    (a / "README.md").write_text("empty on purpose")
    (c,) = discover(tmp_path, git_range=None, folders="a,b", source="test")
    assert c.base.in_tree and c.status == "added" and c.origin == "folders a vs b"
    assert discover(tmp_path, git_range=None, folders=None, source="test") == []


@pytest.mark.parametrize("folders", ["a", "a,", "a,b,c"])
def test_folders_option_needs_two_folders(tmp_path: Path, folders: str) -> None:
    with pytest.raises(UsageError, match="two folders"):
        discover(tmp_path, git_range=None, folders=folders, source="command line")


def test_range_and_folders_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="give one, not both"):
        discover(tmp_path, git_range="HEAD", folders="a,b", source="command line")


def _case(name: str = NAME, base: dict[str, Any] | None = None,
          head: dict[str, Any] | None = None) -> AbCase:  # fmt: skip
    from pytest_moeperf.moeconfig.gitdiff import ChangedConfig
    from pytest_moeperf.moeconfig.naming import parse

    bt = None if base is None else json.dumps(base)
    ht = None if head is None else json.dumps(head)
    status = "added" if bt is None else "modified"
    change = ChangedConfig(name, parse(name), status, "a", "b", bt, ht,
                           "in-tree" if bt is None else f"a:{name}", f"b:{name}")  # fmt: skip
    return case_from_change(change, "test")


def test_mismatch_names_the_file_the_model_reads() -> None:
    assert mismatch(_case(head={"1": TILE}), TINY, tp=1, dp=1, ep=False, dtype=None) is None
    why = mismatch(_case("E=128,N=768,device_name=NVIDIA_H200.json", head={"1": TILE}), TINY,
                   tp=1, dp=1, ep=False, dtype=None)  # fmt: skip
    assert why is not None and "E=16,N=128,device_name=NVIDIA_H200.json" in why
    assert "E 128 != 16" in why
    # TP=2 halves N: the same file no longer applies
    why_tp = mismatch(_case(head={"1": TILE}), TINY, tp=2, dp=1, ep=False, dtype=None)
    assert why_tp is not None and "N 128 != 64" in why_tp


def test_dtype_selector_maps_spec_dtypes_to_vllm_names() -> None:
    assert dtype_selector("bfloat16", None) is None
    assert dtype_selector("bfloat16", "fp8") == "fp8_w8a8"
    why = mismatch(_case(head={"1": TILE}), TINY, tp=1, dp=1, ep=False, dtype="fp8_w8a8")
    assert why is not None and "dtype None != fp8_w8a8" in why


def test_device_mismatch_only_on_a_gpu() -> None:
    case = _case(head={"1": TILE})
    assert device_mismatch(case, "NVIDIA H200 NVL", "cuda") is None
    assert device_mismatch(case, "cpu", "cpu") is None
    why = device_mismatch(case, "NVIDIA H100 80GB HBM3", "cuda")
    assert why is not None and "NVIDIA_H100_80GB_HBM3" in why


# -- verdict words, fleet and the PR summary ------------------------------------------------------
def _verdict(metric: str, base: list[float], head: list[float]) -> Any:
    return judge(get_metric(metric), base, head)


def test_overall_word() -> None:
    reg = _verdict("output_tok_s", [100, 101, 99], [78, 79, 77])
    same = _verdict("output_tok_s", [100, 101, 99], [100, 99.5, 100.5])
    info = _verdict("power_w", [300, 301, 299], [500, 501, 499])
    assert reg.outcome == "regressed" and same.outcome == "unchanged"
    assert overall([same, reg]) == "regressed"
    assert overall([same, info]) == "unchanged"  # informational metrics never decide
    assert overall([]) == "inconclusive"


def test_fleet_of_uses_medians_and_the_headline_metric() -> None:
    f = fleet_of({"output_tok_s": [100.0, 102.0, 98.0], "tok_per_j": [2.0, 2.0, 2.0]},
                 {"output_tok_s": [80.0, 81.0, 79.0], "tok_per_j": [1.6, 1.6, 1.6]},
                 reference="base", gpus=1)  # fmt: skip
    assert f is not None
    assert f["cards"] == 80 and f["reference"] == "base" and f["goodput_metric"] == "output_tok_s"
    assert f["energy_per_token_relative"] == pytest.approx(0.25)
    assert fleet_of({"mbu": [0.5]}, {"mbu": [0.4]}, reference="base", gpus=1) is None


def _outcome(control: bool, backend: str = "cpu") -> Any:
    from pytest_moeperf.ab.gate import AbOutcome, SideState
    from pytest_moeperf.spec.loader import load_spec

    spec = load_spec(Path(__file__).parent.parent / "perf_tests" / "specs" / "cpu-ab.yaml")
    case = _case(base={"1": TILE}, head={"1": {**TILE, "BLOCK_SIZE_M": 16}})
    plan = SimpleNamespace(spec=spec, slo=spec.slo)
    sides = {
        name: SideState(side, SimpleNamespace(), f"{name}: backend ignores MoE configs",
                        sweep=[{"concurrency": c, "output_tok_s": v} for c, v in sweep])
        for name, side, sweep in (("base", case.base, [(1, 100.0), (4, 300.0)]),
                                  ("head", case.head, [(1, 99.0), (4, 240.0)]))
    }  # fmt: skip
    env = SimpleNamespace(accelerator="cpu", gpu_count=0, vllm_version="0.32.0", backend=backend)
    verdicts = [_verdict("output_tok_s", [100, 101, 99], [78, 79, 77])]
    ctrl = [_verdict("output_tok_s", [100, 101, 99], [100, 99.5, 100.5])] if control else None
    return AbOutcome(case, plan, 3, [("base", 0), ("head", 0), ("head", 1), ("base", 1)], sides,
                     verdicts, ctrl, [], ["output_tok_s inconclusive: example"], env)  # fmt: skip


def test_markdown_summary_says_what_a_reviewer_needs() -> None:
    text = markdown_summary(_outcome(control=True), "pytest perf_tests -k moe_config_ab")
    first = text.splitlines()[0]
    assert first.startswith("### ❌ MoE config gate: `E=16,N=128,device_name=NVIDIA_H200.json`")
    assert first.endswith("regressed")
    assert "| output_tok_s | 100.0 tok/s | 78.00 tok/s | -22.0 % |" in text
    assert "❌ **regressed**" in text and "on cpu with vLLM 0.32.0" in text
    assert "(base1 head1 head2 base2)" in text
    assert "backend reads no fused-MoE config files" in text
    assert "A/A control (base vs a fresh server with a copy of base): unchanged" in text
    assert "| 4 | 300.0 | 240.0 | -20.0 % |" in text
    assert "Reproduce: `pytest perf_tests -k moe_config_ab`" in text
    assert "note: output_tok_s inconclusive: example" in text
    assert ("Per-M kernel A/B: skipped: the vLLM CPU backend has no fused-MoE Triton kernels "
            "to time.") in text  # fmt: skip
    assert "Output equivalence" not in text  # not measured: no line


def test_markdown_summary_carries_the_output_equivalence_line() -> None:
    from pytest_moeperf.ab.equivalence import Greedy, compare, judge

    out = _outcome(control=True)
    same = [Greedy((1, 2), (-0.1, -0.2), ({1: -0.1}, {2: -0.2}))]
    out.equivalence = judge(compare(same, same, "head"), compare(same, same, "control"))
    text = markdown_summary(out, "pytest x")
    line = "Output equivalence (greedy, 8 prompts x 32 tokens, batch 1): pass. Head: 2/2 tokens"
    assert f"{line} agree, max |Δ logprob| 0 nats; A/A control: 2/2 tokens agree" in text


def test_markdown_summary_without_control_or_cpu_note() -> None:
    text = markdown_summary(_outcome(control=False, backend="cuda"), "pytest x")
    assert "A/A control" not in text and "CPU backend" not in text
    # a cuda backend on a machine without a GPU (this test): the harness's own reason
    assert "Per-M kernel A/B: skipped: no CUDA device" in text or "torch is not" in text


def test_the_kernel_line_where_the_gate_saw_no_gpu() -> None:
    from pytest_moeperf.ab.summary import kernel_line

    line = kernel_line("cuda", reason="")
    assert "the gate saw no GPU" in line and "pytest_moeperf.ab.perm_cli" in line
    assert kernel_line("cuda", reason="no CUDA device") == (
        "Per-M kernel A/B: skipped: no CUDA device.")  # fmt: skip


def test_tiling_lines_show_which_m_values_change() -> None:
    lines = tiling_lines(_outcome(control=False))
    assert lines[0].startswith("base -> head:") and "change tiling" in lines[0]
    assert len(lines) <= 10


def test_sweep_row_keeps_the_figures_the_summary_reads() -> None:
    from pytest_moeperf.ab.interleave import sweep_row

    row = sweep_row(16, "head", {"output_tok_s": 300.0, "tpot_p99_ms": 9.0, "goodput": 1.0})
    assert row == {"concurrency": 16, "config": "head", "rate": None, "output_tok_s": 300.0,
                   "ttft_p99_ms": None, "tpot_p99_ms": 9.0, "tok_per_j": None}  # fmt: skip


def _side_runs(values: list[float], others: float) -> list[Any]:
    from pytest_moeperf.hygiene.machine import MachineDuring
    from pytest_moeperf.run.probe import RunMeasurement

    return [RunMeasurement(i, None, [], {"output_tok_s": v},
                           machine=MachineDuring(0.0, others, 30.0))
            for i, v in enumerate(values)]  # fmt: skip


@pytest.mark.parametrize("busy", [False, True])
def test_a_side_whose_runs_lost_the_cpus_to_a_neighbour_is_not_called_regressed(busy: bool) -> None:
    """Interleaving shares the machine's drift between the sides, but not a neighbour busy during
    one side's runs only: then the -22 % of head is what the machine explains (inconclusive),
    and the A/A control's -15 % likewise; on a quiet machine both are what they read."""
    from pytest_moeperf.ab.gate import CONTROL, SideState, judge_outcome

    out = _outcome(control=False)
    head_others = 0.4 if busy else 0.0
    out.sides["base"] = SideState(out.case.base, SimpleNamespace(), "", runs=_side_runs(
        [100, 101, 99], 0.0))  # fmt: skip
    out.sides["head"] = SideState(out.case.head, SimpleNamespace(), "", runs=_side_runs(
        [78, 79, 77], head_others))  # fmt: skip
    out.sides[CONTROL] = SideState(out.case.base, SimpleNamespace(), "", runs=_side_runs(
        [85, 86, 84], head_others))  # fmt: skip
    out.control_base = _side_runs([100, 100.5, 99.5], 0.0)
    out.failures, out.warnings = [], []
    judge_outcome(out)
    (v,) = out.verdicts
    (c,) = out.control_verdicts
    if busy:
        assert v.outcome == c.outcome == "inconclusive"
        assert "the machine left this run 40 % less of its CPUs" in v.reason
        assert out.failures == []
    else:
        assert v.outcome == c.outcome == "regressed"
        assert any("too noisy for the gate" in f for f in out.failures)
