"""The per-M kernel A/B inside the gate: which M keys a config change moved, and numerics.

The gate runs ``ab/perm_cli.py`` for its case as a subprocess *before* it starts any server:
the timing needs the whole GPU and holds a CUDA context, which would sit beside vLLM's servers
(and shrink the memory they size) if it ran in the gate's own process. Its files (the per-M
``.json`` with raw samples, the ``.md`` table and ``<name>-best-of-both.json``) go next to the A/B
summary. The gate's verdict stays the end-to-end one; the table and the best-of-both file are
advice, except numerics: a tiling whose error exceeds the dtype's rounding fails the gate.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pytest_moeperf.ab.cases import AbCase, AbSide
from pytest_moeperf.ab.perm_cli import outputs
from pytest_moeperf.moeconfig.folder import in_tree_config_dir, lay_out_config_folder

#: per-pair timing budget (the issue's goal: ~20 keys in at most 60 s on the H200)
BUDGET_S = 40.0
#: wall limit of the subprocess: import, CUDA init, Triton compiles of ~20 tilings a side
TIMEOUT_S = 600.0
DTYPES = {None: "bf16", "fp8_w8a8": "fp8_w8a8"}


@dataclass
class PermOutcome:
    """What the summary prints and the gate judges; ``skipped`` or ``error`` say why not."""

    skipped: str | None = None
    error: str | None = None
    table_md: str = ""
    regressed_keys: list[str] = field(default_factory=list)
    numerics_passed: bool = True
    numerics_message: str = ""
    predicted_gain: float | None = None
    files: list[Path] = field(default_factory=list)
    #: M -> (verdict "slower" / "faster" / "same", head vs base time - 1)
    per_m: dict[int, tuple[str, float]] = field(default_factory=dict)

    def failures(self, file_name: str) -> list[str]:
        """The gate fails when the timing could not run or a tiling computes wrongly."""
        if self.error:
            return [f"{file_name}: per-M kernel A/B: {self.error}"]
        return [] if self.numerics_passed else [f"{file_name}: {self.numerics_message}"]

    def summary_lines(self) -> list[str]:
        if self.skipped:
            return [f"Per-M kernel A/B: skipped: {self.skipped}."]
        if self.error:
            return [f"Per-M kernel A/B: failed: {self.error}"]
        body = self.table_md.split("\n", 2)[2] if self.table_md.count("\n") >= 2 else ""
        files = ", ".join(f"`{p.name}`" for p in self.files)
        where = self.files[0].parent if self.files else "?"
        return ["Per-M kernel A/B (advice; numerics gate):", "", body.strip(), "",
                f"Written in `{where}`: {files}."]  # fmt: skip


def in_gate(case: AbCase, dtype_selector: str | None, shape_dir: Path, out: Path,
            workload_ms: list[int], say: Callable[[str], None]) -> PermOutcome | None:  # fmt: skip
    """The gate's step: None without a visible GPU (the summary then says why it is skipped),
    else the outcome, with the keys that got slower said as soon as they are known."""
    from pytest_moeperf.metrics.hardware import visible_gpus

    if not visible_gpus():
        return None
    out.mkdir(parents=True, exist_ok=True)
    say(f"moeperf {case.id}: per-M kernel A/B of {case.file_name} (files in {out})")
    got = run(case, dtype_selector, shape_dir, out, workload_ms)
    if got.regressed_keys:
        say(f"moeperf {case.id}: keys slower in head: {', '.join(got.regressed_keys)}")
    return got


def side_file(side: AbSide, file_name: str, dest: Path) -> Path | str:
    """The file one side serves, as a path; or why it has none (vLLM's default tiling)."""
    if not side.in_tree:
        folder = lay_out_config_folder(dest / side.label, {file_name: side.files[file_name]})
        return folder / file_name
    tree = in_tree_config_dir()
    path = tree / file_name if tree is not None else None
    if path is None or not path.is_file():
        return (f"the {side.label} side is vLLM's default tiling (no in-tree {file_name}); "
                "per-M timing compares two config files")  # fmt: skip
    return path


def command(base: Path, head: Path, dtype: str, shape_dir: Path, out: Path,
            workload_ms: list[int]) -> list[str]:  # fmt: skip
    ms = ",".join(str(m) for m in workload_ms)
    extra = ["--workload-ms", ms] if ms else []
    return [sys.executable, "-X", "faulthandler", "-m", "pytest_moeperf.ab.perm_cli",
            "--base", str(base), "--head", str(head), "--dtype", dtype, "--shape", str(shape_dir),
            "--budget-s", str(BUDGET_S), "--out", str(out), *extra]  # fmt: skip


def run(case: AbCase, dtype_selector: str | None, shape_dir: Path, out: Path,
        workload_ms: list[int], timeout_s: float = TIMEOUT_S) -> PermOutcome:  # fmt: skip
    """Lay out both sides' files under ``out``, time them in a subprocess, read what it wrote."""
    from pytest_moeperf.ab.kernel_bench import skip_reason

    dtype = DTYPES.get(dtype_selector)
    if dtype is None:
        return PermOutcome(skipped=f"per-M timing covers bf16 and fp8_w8a8, not {dtype_selector}")
    reason = skip_reason()
    if reason:
        return PermOutcome(skipped=reason)
    files, name = out / "configs", f"{Path(case.file_name).stem}-{dtype}"
    shutil.rmtree(files, ignore_errors=True)  # a rerun into the same results folder:
    for old in outputs(out, name):  # nothing of the last run may be read as this one's
        old.unlink(missing_ok=True)
    base, head = (side_file(s, case.file_name, files) for s in (case.base, case.head))
    for f in (base, head):
        if isinstance(f, str):
            return PermOutcome(skipped=f)
    assert isinstance(base, Path) and isinstance(head, Path)
    cmd = command(base, head, dtype, shape_dir, out, workload_ms)
    log = out / "perm.log"
    try:
        with log.open("w", encoding="utf-8") as fh:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return PermOutcome(error=f"no result within {timeout_s:.0f} s (log: {log})")
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        return PermOutcome(error=f"exit {proc.returncode}: {' | '.join(tail)} (log: {log})")
    return read(out, name)


def read(out: Path, name: str) -> PermOutcome:
    """The outcome from the files ``perm_cli`` wrote for one pair."""
    paths = outputs(out, name)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        return PermOutcome(error=f"perm_cli wrote no {', '.join(missing)}")
    from pytest_moeperf.moeconfig.perm import serving_key

    doc = json.loads(paths[0].read_text(encoding="utf-8"))
    head = doc["head_config"]
    slower = [int(m) for m, c in doc["comparisons"].items() if c.get("verdict") == "slower"]
    regressed = sorted({serving_key(head, m) for m in slower}, key=int)
    per_m = {int(m): (str(c["verdict"]), float(c["delta"])) for m, c in doc["comparisons"].items()}
    return PermOutcome(
        table_md=paths[1].read_text(encoding="utf-8"),
        regressed_keys=regressed,
        numerics_passed=bool(doc["numerics"]["passed"]),
        numerics_message=str(doc.get("numerics_message", "")),
        predicted_gain=doc["best_of_both"].get("predicted_gain"),
        files=paths,
        per_m=per_m,
    )


#: what a per-M verdict predicts for output tok/s at the concurrency whose decode batch it is
_EXPECTS = {"slower": -1, "faster": 1}


def cross_check(per_m: dict[int, tuple[str, float]],
                sweep: dict[int, tuple[float, float]]) -> list[str]:  # fmt: skip
    """Per-M kernel verdicts against the end-to-end concurrency sweep, level by level.

    At concurrency c a closed loop decodes batches of up to c sequences, so the fused-MoE
    kernel runs mostly at M = c: the timed M nearest c stands for it. A slower kernel there
    predicts lower output tok/s, a faster one higher; the sweep (``sweep``: c -> (base, head)
    tok/s, one run a side) agrees when its change has that sign. Where the kernel is unchanged
    nothing is predicted, and the line gives the sweep's change as the noise of one run.
    """
    if not per_m:
        return []
    lines = []
    for c in sorted(sweep):
        base, head = sweep[c]
        if not base or not head:
            continue
        m = min(per_m, key=lambda k: (abs(k - c), k))
        verdict, delta = per_m[m]
        change = head / base - 1
        seen = f"sweep {change * 100:+.1f} % output tok/s"
        want = _EXPECTS.get(verdict)
        if want is None:
            lines.append(f"- concurrency {c}: kernel at M={m} unchanged; {seen} (one run's noise)")
            continue
        word = "agrees" if want * change > 0 else "disagrees"
        lines.append(f"- concurrency {c}: kernel at M={m} {delta * 100:+.1f} % ({verdict}); "
                     f"{seen}: {word}")  # fmt: skip
    if lines:
        lines.insert(0, "Cross-check, per-M kernel vs concurrency sweep (decode batch M = "
                        "concurrency):")  # fmt: skip
    return lines
