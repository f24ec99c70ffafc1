"""What an A/B gate compares: one case per changed MoE config file, base side vs head side.

A PR that edits ``E=128,N=768,device_name=NVIDIA_H200.json`` is judged by serving the same
workload with the base file and with the head file. Cases come from a git range or from two
folders (``moeconfig.gitdiff``); a case applies to a perf test only when the test's model would
look the file up (same E, N, dtype and block shape; the device is checked once the GPU is known).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.folder import IN_TREE
from pytest_moeperf.moeconfig.gitdiff import ChangedConfig
from pytest_moeperf.moeconfig.naming import MoeConfigName, expected_config_name
from pytest_moeperf.moeconfig.validate import TileConfig

#: vLLM's fused-MoE dtype selector per spec dtype / quantization (None: no dtype in the name).
_DTYPE_SELECTOR: dict[str, str | None] = {
    "bfloat16": None,
    "float16": None,
    "half": None,
    "auto": None,
    "float32": "float32",
    "fp8": "fp8_w8a8",
    "fp8_w8a8": "fp8_w8a8",
    "int8_w8a16": "int8_w8a16",
    "int4_w4a16": "int4_w4a16",
}


@dataclass(frozen=True)
class AbSide:
    """One side of a case: the tuned files to lay out (none: vLLM's in-tree file/default)."""

    label: str  # "base" / "head" / "control"
    where: str  # the blob or file it came from, or "in-tree"
    files: Mapping[str, dict[int, TileConfig]]

    @property
    def in_tree(self) -> bool:
        return not self.files


@dataclass(frozen=True)
class AbCase:
    """One changed config file: the base and head sides, and where the change came from."""

    file_name: str
    name: MoeConfigName
    status: str  # added | deleted | modified
    base: AbSide
    head: AbSide
    origin: str  # "git range origin/main...HEAD" / "folders A vs B"

    @property
    def id(self) -> str:
        """The pytest parameter id: the file name, which is what a reviewer looks for."""
        return self.file_name.removesuffix(".json")

    def control(self) -> AbSide:
        """The A/A control's second side: the base contents again, laid out as a fresh folder.

        For an in-tree base the copy is still in-tree: the server reads vLLM's own file.
        """
        return AbSide("control", f"copy of {self.base.where}", self.base.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file_name,
            "status": self.status,
            "origin": self.origin,
            "base": self.base.where,
            "head": self.head.where,
        }


def case_from_change(change: ChangedConfig, origin: str) -> AbCase:
    """Validate both sides now: a malformed file fails before any server starts."""
    base, head = change.base_config(), change.head_config()
    f = change.file_name
    return AbCase(
        f,
        change.name,
        change.status,
        AbSide("base", change.base_label, {f: base} if base is not None else {}),
        AbSide("head", change.head_label, {f: head} if head is not None else {}),
        origin,
    )


def discover(
    root: Path, *, git_range: str | None, folders: str | None, source: str
) -> list[AbCase]:
    """Cases from ``--moeperf-ab-range`` (a git range in ``root``) or ``--moeperf-ab-folders``."""
    from pytest_moeperf.moeconfig.gitdiff import changed_between_folders, changed_config_files

    if git_range and folders:
        raise UsageError(
            source,
            "A/B source",
            (git_range, folders),
            "give one, not both",
            "use --moeperf-ab-range RANGE or --moeperf-ab-folders BASE,HEAD",
        )
    if git_range:
        origin = f"git range {git_range}"
        return [case_from_change(c, origin) for c in changed_config_files(root, git_range)]
    if folders:
        parts = [p.strip() for p in folders.split(",")]
        if len(parts) != 2 or not all(parts):
            raise UsageError(
                source,
                "--moeperf-ab-folders",
                folders,
                "needs two folders separated by a comma",
                "e.g. --moeperf-ab-folders configs/main,configs/pr-123",
            )
        a, b = (Path(p) if Path(p).is_absolute() else root / p for p in parts)
        origin = f"folders {parts[0]} vs {parts[1]}"
        return [case_from_change(c, origin) for c in changed_between_folders(a, b)]
    return []


def dtype_selector(spec_dtype: str, quantization: str | None) -> str | None:
    """vLLM's ``dtype=`` part of the file name for a spec's dtype and quantization."""
    key = (quantization or spec_dtype).lower()
    return _DTYPE_SELECTOR.get(key, key)


def mismatch(
    case: AbCase, model_config: Mapping[str, Any], *, tp: int, dp: int, ep: bool, dtype: str | None
) -> str | None:
    """Why the test's model would not read this file (None: it would, on a matching GPU)."""
    want = expected_config_name(
        model_config, tp=tp, dp=dp, ep=ep, dtype=dtype, device_name=case.name.device_name
    )
    got = case.name
    diffs = [
        f"{k} {getattr(got, k)} != {getattr(want, k)}"
        for k in ("E", "N", "dtype", "block_shape")
        if getattr(got, k) != getattr(want, k)
    ]
    if not diffs:
        return None
    return (
        f"{case.file_name} is not looked up by this test's model (expects "
        f"{want.file_name()}: {', '.join(diffs)})"
    )


def device_mismatch(case: AbCase, device_name: str, backend: str) -> str | None:
    """On a GPU the file's device must be this GPU's; the CPU backend reads no file at all."""
    from pytest_moeperf.moeconfig.naming import normalize_device_name

    if backend != "cuda":
        return None
    here = normalize_device_name(device_name)
    if here == case.name.device_name:
        return None
    return (
        f"{case.file_name} is for {case.name.device_name}; this GPU is {here}, so vLLM "
        f"would not read it here"
    )


def model_config_of(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            str(path),
            "config.json",
            None,
            f"cannot be read: {exc}",
            "point the spec's model.path at a Hugging Face model folder",
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            str(path),
            "config.json",
            type(data).__name__,
            "is not an object",
            "use the model's Hugging Face config.json",
        )
    return data


def describe(side: AbSide) -> str:
    return IN_TREE if side.in_tree else side.where
