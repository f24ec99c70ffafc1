"""Load and check fused-MoE tuned config files before a server ever sees them.

vLLM itself does almost no checking (``{int(key): val for key, val in json.load(f).items()}``):
a typo shows up as a Triton compile error deep inside the first forward pass, an empty file
silently falls back to the default tiling, and a bad key crashes model loading. Here every
problem is one UsageError naming the file, the key, the value and the fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import UsageError

REQUIRED_FIELDS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)
# Optional per-M fields seen in vLLM's in-tree Triton configs (ROCm and XPU tunings). The
# ",backend=flydsl" files use another schema (tile_m, ...) and another loader; not handled here.
OPTIONAL_INT_FIELDS = ("SPLIT_K", "kpack", "waves_per_eu", "matrix_instr_nonkdim", "num_ctas")
OPTIONAL_STR_FIELDS = ("grf_mode",)
TOP_LEVEL_METADATA = ("triton_version",)  # vLLM pops this before reading the M keys
_NUM_WARPS = (1, 2, 4, 8, 16)
# BLOCK_SIZE_M=8 is allowed below the 16 floor: vLLM ships it (H100/H200 fp8 block-quant files).
_BLOCK_RANGES = {"BLOCK_SIZE_M": (8, 256), "BLOCK_SIZE_N": (16, 256), "BLOCK_SIZE_K": (16, 256)}


@dataclass(frozen=True)
class TileConfig:
    """One kernel tiling (the value of one M key). Frozen so tilings compare and hash."""

    block_size_m: int
    block_size_n: int
    block_size_k: int
    group_size_m: int
    num_warps: int
    num_stages: int
    extra: tuple[tuple[str, int | str], ...] = field(default_factory=tuple)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TileConfig:
        """Build from an already validated vLLM dict (see :func:`validate_config`)."""
        extra = tuple(sorted((k, v) for k, v in d.items() if k not in REQUIRED_FIELDS))
        return cls(
            block_size_m=d["BLOCK_SIZE_M"],
            block_size_n=d["BLOCK_SIZE_N"],
            block_size_k=d["BLOCK_SIZE_K"],
            group_size_m=d["GROUP_SIZE_M"],
            num_warps=d["num_warps"],
            num_stages=d["num_stages"],
            extra=extra,
        )

    def to_dict(self) -> dict[str, int | str]:
        """The dict vLLM passes to the kernel, with vLLM's key names."""
        out: dict[str, int | str] = {
            "BLOCK_SIZE_M": self.block_size_m,
            "BLOCK_SIZE_N": self.block_size_n,
            "BLOCK_SIZE_K": self.block_size_k,
            "GROUP_SIZE_M": self.group_size_m,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }
        out.update(dict(self.extra))
        return out

    def short(self) -> str:
        """Compact form for report lines: ``64x128x64 g1 w4 s3``."""
        s = (
            f"{self.block_size_m}x{self.block_size_n}x{self.block_size_k} "
            f"g{self.group_size_m} w{self.num_warps} s{self.num_stages}"
        )
        if self.extra:
            s += " " + " ".join(f"{k}={v}" for k, v in self.extra)
        return s


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _check_field(name: str, v: int) -> str | None:
    """Return the problem with a field's integer value, or None when it is sane."""
    if name in _BLOCK_RANGES:
        lo, hi = _BLOCK_RANGES[name]
        if not (_pow2(v) and lo <= v <= hi):
            return f"must be a power of two in {lo}..{hi}"
    elif name == "GROUP_SIZE_M" or name in ("SPLIT_K", "num_ctas"):
        if v < 1:
            return "must be >= 1"
    elif name == "num_warps":
        if v not in _NUM_WARPS:
            return f"must be one of {list(_NUM_WARPS)}"
    elif name == "num_stages":
        if not 1 <= v <= 8:
            return "must be in 1..8"
    elif name == "kpack":
        if v not in (1, 2):
            return "must be 1 or 2"
    elif name == "matrix_instr_nonkdim":
        if v not in (16, 32):
            return "must be 16 or 32"
    elif name == "waves_per_eu" and v < 0:
        return "must be >= 0"
    return None


def _tile_problems(key: str, value: object, source: str) -> list[UsageError]:
    if not isinstance(value, dict):
        return [
            UsageError(
                source,
                f"key {key!r}",
                value,
                "each batch size M must map to a JSON object of kernel parameters",
                'write e.g. {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, '
                '"GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}',
            )
        ]
    out: list[UsageError] = []
    for name in REQUIRED_FIELDS:
        if name not in value:
            out.append(
                UsageError(
                    source,
                    f"key {key!r}",
                    sorted(value.keys()),
                    f"missing required field {name!r}",
                    f"add {name!r}; every M entry needs all of {list(REQUIRED_FIELDS)}",
                )
            )
    allowed = (*REQUIRED_FIELDS, *OPTIONAL_INT_FIELDS, *OPTIONAL_STR_FIELDS)
    for name, v in value.items():
        what = f"key {key!r} field {name!r}"
        if name not in allowed:
            out.append(
                UsageError(
                    source,
                    what,
                    v,
                    "unknown kernel parameter (vLLM passes every field to the Triton kernel)",
                    f"remove it or correct the spelling; known fields: {list(allowed)}",
                )
            )
        elif name in OPTIONAL_STR_FIELDS:
            if not isinstance(v, str):
                out.append(UsageError(source, what, v, "must be a string", f'write "{v}"'))
        elif not _is_int(v):
            out.append(
                UsageError(source, what, v, "must be a JSON integer", "write a plain integer")
            )
        else:
            problem = _check_field(name, v)
            if problem:
                out.append(
                    UsageError(source, what, v, problem, "use a value the Triton kernel accepts")
                )
    return out


def find_problems(data: object, source: str) -> list[UsageError]:
    """Every problem in a parsed config, in file order (empty list: the config is valid)."""
    if not isinstance(data, dict):
        return [
            UsageError(
                source,
                "top level",
                type(data).__name__,
                "a MoE config must be a JSON object mapping batch size M to kernel parameters",
                'write {"1": {...}, "2": {...}, ...}',
            )
        ]
    out: list[UsageError] = []
    seen: dict[int, str] = {}
    for key, value in data.items():
        if key in TOP_LEVEL_METADATA:
            if not isinstance(value, str):
                out.append(
                    UsageError(source, f"key {key!r}", value, "must be a string", "quote it")
                )
            continue
        if not (key.isascii() and key.isdigit()) or int(key) < 1:
            out.append(
                UsageError(
                    source,
                    f"key {key!r}",
                    key,
                    "not an integer batch size M (keys are the token counts the kernel was "
                    "tuned for)",
                    'use a positive integer string like "64", or remove the entry',
                )
            )
            continue
        m = int(key)
        if m in seen:
            out.append(
                UsageError(
                    source,
                    f"key {key!r}",
                    key,
                    f"batch size M={m} appears twice (also as {seen[m]!r}); vLLM keeps the last",
                    "keep one entry per M",
                )
            )
        seen[m] = key
        out.extend(_tile_problems(key, value, source))
    if not seen and not out:
        out.append(
            UsageError(
                source,
                "batch size keys",
                [],
                "no M entries: vLLM logs that it uses this file, then silently falls back to "
                "the default config",
                "add tuned entries, or delete the file to use the in-tree/default config",
            )
        )
    return out


def validate_config(data: object, source: str) -> dict[int, TileConfig]:
    """Check a parsed config and return it as M -> TileConfig, keeping the file's key order.

    Order is kept on purpose: vLLM breaks ties between two equally near keys by file order.
    """
    problems = find_problems(data, source)
    if problems:
        raise problems[0]
    assert isinstance(data, dict)
    return {int(k): TileConfig.from_dict(v) for k, v in data.items() if k not in TOP_LEVEL_METADATA}


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.load keeps the last duplicate silently; keep all so validation can name them."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def parse_config_text(text: str, source: str) -> dict[int, TileConfig]:
    """Parse + validate JSON text (a file, or a ``git show`` blob); syntax errors give line:col."""
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as e:
        raise UsageError(
            source,
            "JSON",
            f"line {e.lineno} column {e.colno}",
            f"invalid JSON: {e.msg}",
            "fix the syntax at that position (trailing commas and comments are not JSON)",
        ) from None
    except _DuplicateKey as e:
        raise UsageError(
            source,
            f"key {e.key!r}",
            e.key,
            "appears twice in one JSON object; json.load would silently keep the last",
            "keep one entry per key",
        ) from None
    problems = find_problems(data, source)
    if problems:
        raise _at_line(problems[0], text)
    return validate_config(data, source)


def _at_line(err: UsageError, text: str) -> UsageError:
    """The same error with ``:LINE`` of the key (and field) it is about added to its source."""
    m = re.match(r"key '([^']*)'(?: field '([^']*)')?", err.what)
    if m is None:
        return err
    line = line_of_key(text, m[1])
    if line is not None and m[2] is not None:
        line = line_of_key(text, m[2], after_line=line) or line
    if line is None:
        return err
    return UsageError(f"{err.source}:{line}", err.what, err.value, err.problem, err.fix)


def line_of_key(text: str, key: str, after_line: int = 0) -> int | None:
    """1-based line of the first ``"key":`` at or after ``after_line`` (None if not found)."""
    pattern = re.compile(r'"' + re.escape(json.dumps(key)[1:-1]) + r'"\s*:')
    for n, line in enumerate(text.splitlines(), start=1):
        if n >= after_line and pattern.search(line):
            return n
    return None


def load_config(path: Path) -> dict[int, TileConfig]:
    """Read one config file; checks the contents only (use naming.parse for the file name)."""
    source = f"file {path}"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(
            source, "path", str(path), "file does not exist", "check the path"
        ) from None
    except IsADirectoryError:
        raise UsageError(
            source, "path", str(path), "is a directory", "point at one .json file"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            source, "bytes", f"offset {e.start}", "not UTF-8 text", "save the file as UTF-8 JSON"
        ) from None
    return parse_config_text(text, source)
