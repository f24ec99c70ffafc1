"""ab/perm_gate.py: the per-M kernel A/B as a step of the gate. Off a GPU only the skip is real;
the rest is tested on the H100's recorded per-M files (docs/results/h100-kernels-2026-12-05)
and on a stand-in for the ``perm_cli`` subprocess that writes them, so that the gate's reading
of the files, its failures and the summary block are checked here."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.ab import perm_gate
from pytest_moeperf.ab.cases import AbCase, AbSide
from pytest_moeperf.ab.summary import markdown_summary
from pytest_moeperf.moeconfig.naming import parse

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "docs" / "results" / "h100-kernels-2026-12-05"
NAME = "E=128,N=768,device_name=NVIDIA_H200.json"


def tiles() -> dict[int, Any]:
    from pytest_moeperf.moeconfig.validate import TileConfig

    doc = json.loads((RECORDED / "large-M-worse-bf16.json").read_text())
    return {int(m): TileConfig.from_dict(t) for m, t in doc["head_config"].items()}


def case(base_in_tree: bool = False) -> AbCase:
    base = AbSide("base", "in-tree", {}) if base_in_tree else AbSide("base", "a", {NAME: tiles()})
    head = AbSide("head", "b", {NAME: tiles()})
    return AbCase(NAME, parse(NAME), "modified", base, head, "folders a vs b")


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("large-M-worse-bf16", ["64", "96", "128", "256", "512", "1024", "1536", "2048", "3072",
                                "4096"]),
        ("one-middle-key-worse-bf16", ["48"]),
        # reversed key order: M=12 lies midway between keys 8 and 16, vLLM takes the first in
        # file order, so the head serves it with key 16 (1.3 % slower on the H100)
        ("reordered-bf16", ["16"]),
    ],
)  # fmt: skip
def test_read_names_the_keys_the_head_made_slower(name: str, keys: list[str]) -> None:
    got = perm_gate.read(RECORDED, name)
    assert got.error is None and got.skipped is None
    assert got.regressed_keys == keys
    assert got.numerics_passed and got.numerics_message.startswith("numerics ok")
    assert got.predicted_gain == pytest.approx(0.0)
    assert [p.name for p in got.files] == [f"{name}.json", f"{name}.md",
                                           f"{name}-best-of-both.json"]  # fmt: skip
    assert got.failures(NAME) == []


def test_summary_block_is_the_table_and_the_files() -> None:
    lines = perm_gate.read(RECORDED, "one-middle-key-worse-bf16").summary_lines()
    text = "\n".join(lines)
    assert lines[0] == "Per-M kernel A/B (advice; numerics gate):"
    assert "| M | base key | head key | base µs | head µs | Δ (CI) | p | verdict |" in text
    assert "- regressed keys (head slower): 48 (M=48)" in text
    assert "# Per-M kernel A/B" not in text  # the file's title is left out
    stem = "one-middle-key-worse-bf16"
    assert lines[-1] == (f"Written in `{RECORDED}`: `{stem}.json`, `{stem}.md`, "
                         f"`{stem}-best-of-both.json`.")  # fmt: skip


def test_a_numerics_failure_fails_the_gate_with_the_message(tmp_path: Path) -> None:
    for suffix in (".md", "-best-of-both.json"):
        shutil.copy(RECORDED / f"reordered-bf16{suffix}", tmp_path / f"bad-bf16{suffix}")
    doc = json.loads((RECORDED / "reordered-bf16.json").read_text())
    doc["numerics"]["passed"] = False
    doc["numerics_message"] = "numerics FAILED: head at M=64: rel. error 0.2 > 0.0156"
    (tmp_path / "bad-bf16.json").write_text(json.dumps(doc))
    got = perm_gate.read(tmp_path, "bad-bf16")
    assert got.failures(NAME) == [f"{NAME}: numerics FAILED: head at M=64: rel. error 0.2 > 0.0156"]


def test_missing_files_are_an_error_that_names_them(tmp_path: Path) -> None:
    got = perm_gate.read(tmp_path, "x-bf16")
    assert got.error is not None and str(tmp_path / "x-bf16.json") in got.error
    assert got.failures(NAME) == [f"{NAME}: per-M kernel A/B: {got.error}"]
    assert got.summary_lines() == [f"Per-M kernel A/B: failed: {got.error}"]


def test_skips_say_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    got = perm_gate.run(case(), "int4_w4a16", tmp_path, tmp_path, [])
    assert got.skipped == "per-M timing covers bf16 and fp8_w8a8, not int4_w4a16"
    monkeypatch.setattr("pytest_moeperf.ab.kernel_bench.skip_reason", lambda: "no CUDA device")
    assert perm_gate.run(case(), None, tmp_path, tmp_path, []).skipped == "no CUDA device"
    assert perm_gate.run(case(), None, tmp_path, tmp_path, []).summary_lines() == [
        "Per-M kernel A/B: skipped: no CUDA device."]  # fmt: skip


def test_an_in_tree_side_without_a_file_is_vllms_default(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setattr("pytest_moeperf.ab.kernel_bench.skip_reason", lambda: None)
    monkeypatch.setattr(perm_gate, "in_tree_config_dir", lambda: tmp_path / "none")
    got = perm_gate.run(case(base_in_tree=True), None, tmp_path, tmp_path / "out", [])
    assert got.skipped == (f"the base side is vLLM's default tiling (no in-tree {NAME}); per-M "
                           "timing compares two config files")  # fmt: skip


STAND_IN = """
import shutil, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
head = args[args.index("--head") + 1]
print("stand-in for perm_cli:", " ".join(args))
if "{fail}" == "yes":
    print("Traceback: CUDA error: out of memory", file=sys.stderr)
    sys.exit(1)
for suffix in (".json", ".md", "-best-of-both.json"):
    shutil.copy("{recorded}/large-M-worse-bf16" + suffix, out + "/{stem}-bf16" + suffix)
"""


def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail: bool) -> list[list[str]]:
    """``perm_gate.command`` replaced by a script that copies the recorded H100 files (or fails),
    keeping the real command's arguments so that they are checked too."""
    script = tmp_path / "stand_in.py"
    stem = NAME.removesuffix(".json")
    script.write_text(STAND_IN.format(fail="yes" if fail else "no", recorded=RECORDED, stem=stem))
    seen: list[list[str]] = []
    real = perm_gate.command

    def fake(*a: Any) -> list[str]:
        cmd = real(*a)
        seen.append(cmd)
        return [sys.executable, str(script), *cmd[5:]]

    monkeypatch.setattr(perm_gate, "command", fake)
    monkeypatch.setattr("pytest_moeperf.ab.kernel_bench.skip_reason", lambda: None)
    return seen


def test_run_lays_out_both_files_and_reads_what_the_subprocess_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen = stand_in(monkeypatch, tmp_path, fail=False)
    out = tmp_path / "out"
    out.mkdir()
    got = perm_gate.run(case(), None, tmp_path / "shape", out, [256])
    assert got.error is None, got.error
    assert got.regressed_keys[:2] == ["64", "96"]
    (cmd,) = seen
    assert cmd[:5] == [sys.executable, "-X", "faulthandler", "-m", "pytest_moeperf.ab.perm_cli"]
    args = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert args["--base"] == str(out / "configs" / "base" / NAME)
    assert args["--head"] == str(out / "configs" / "head" / NAME)
    assert (args["--dtype"], args["--workload-ms"], args["--budget-s"]) == ("bf16", "256", "40.0")
    assert json.loads(Path(args["--head"]).read_text())["64"]["BLOCK_SIZE_M"] == 16
    assert "stand-in for perm_cli" in (out / "perm.log").read_text()


def test_a_rerun_into_the_same_folder_starts_clean(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The second gate run in one results folder lays its files out again (the folder of the
    first would be refused as not empty) and never reads the first run's tables."""
    stand_in(monkeypatch, tmp_path, fail=False)
    out = tmp_path / "out"
    out.mkdir()
    assert perm_gate.run(case(), None, tmp_path, out, []).error is None
    again = perm_gate.run(case(), None, tmp_path, out, [])
    assert again.error is None and again.regressed_keys[0] == "64"
    stand_in(monkeypatch, tmp_path, fail=True)
    failed = perm_gate.run(case(), None, tmp_path, out, [])
    assert failed.error is not None
    stem = NAME.removesuffix(".json")
    assert not any(p.exists() for p in perm_gate.outputs(out, f"{stem}-bf16"))


def test_a_failed_subprocess_fails_the_gate_with_its_last_lines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stand_in(monkeypatch, tmp_path, fail=True)
    out = tmp_path / "out"
    out.mkdir()
    got = perm_gate.run(case(), "fp8_w8a8", tmp_path, out, [])
    assert got.error is not None and got.error.startswith("exit 1: ")
    assert "CUDA error: out of memory" in got.error and str(out / "perm.log") in got.error


def test_in_gate_is_not_run_without_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("pytest_moeperf.metrics.hardware.visible_gpus", lambda: [])
    said: list[str] = []
    assert perm_gate.in_gate(case(), None, tmp_path, tmp_path / "o", [], said.append) is None
    assert said == [] and not (tmp_path / "o").exists()


def test_in_gate_says_the_slower_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stand_in(monkeypatch, tmp_path, fail=False)
    monkeypatch.setattr("pytest_moeperf.metrics.hardware.visible_gpus", lambda: ["gpu0"])
    said: list[str] = []
    got = perm_gate.in_gate(case(), None, tmp_path, tmp_path / "o", [], said.append)
    assert got is not None and got.error is None
    assert said[1].endswith("keys slower in head: 64, 96, 128, 256, 512, 1024, 1536, 2048, "
                            "3072, 4096")  # fmt: skip


def test_the_gate_summary_prints_the_per_m_block_instead_of_the_skip_line() -> None:
    from tests.test_ab import _outcome

    out = _outcome(control=False, backend="cuda")
    out.perm = perm_gate.read(RECORDED, "large-M-worse-bf16")
    text = markdown_summary(out, "pytest x")
    assert "Per-M kernel A/B (advice; numerics gate):" in text
    assert "| 4096 | 4096 | 4096 | 898.8 | 3,649 |" in text
    assert "Per-M kernel A/B: skipped" not in text


def test_cross_check_against_the_sweep_level_by_level() -> None:
    """The H100's large-M-worse per-M verdicts against a sweep: unchanged keys predict nothing,
    slower keys predict lower tok/s; the nearest timed M stands for a level (100 -> M=96)."""
    per_m = perm_gate.read(RECORDED, "large-M-worse-bf16").per_m
    assert per_m[48] == ("same", 0.0) and per_m[64][0] == "slower"
    sweep = {1: (100.0, 99.0), 64: (1000.0, 970.0), 100: (1200.0, 1212.0), 7: (50.0, 0.0)}
    assert perm_gate.cross_check(per_m, sweep) == [
        "Cross-check, per-M kernel vs concurrency sweep (decode batch M = concurrency):",
        "- concurrency 1: kernel at M=1 unchanged; sweep -1.0 % output tok/s (one run's noise)",
        "- concurrency 64: kernel at M=64 +5.9 % (slower); sweep -3.0 % output tok/s: agrees",
        "- concurrency 100: kernel at M=96 +6.4 % (slower); sweep +1.0 % output tok/s: disagrees",
    ]  # level 7 has no head figure: left out
    faster = {16: ("faster", -0.05)}
    assert perm_gate.cross_check(faster, {16: (10.0, 11.0)})[1].endswith(": agrees")
    assert perm_gate.cross_check({}, sweep) == []
    assert perm_gate.cross_check(per_m, {}) == []


def test_the_gate_summary_carries_the_cross_check() -> None:
    from tests.test_ab import _outcome

    out = _outcome(control=False, backend="cuda")  # sweep: 1 -> 100/99, 4 -> 300/240 tok/s
    out.perm = perm_gate.read(RECORDED, "one-middle-key-worse-bf16")
    text = markdown_summary(out, "pytest x")
    assert "- concurrency 4: kernel at M=4 unchanged; sweep -20.0 % output tok/s" in text
    assert text.index("Cross-check") > text.index("Per-M kernel A/B (advice")
