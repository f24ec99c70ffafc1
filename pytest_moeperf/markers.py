"""The plugin's markers: full signatures, registration text, and validation with clear errors.

Each marker is declared once as a Python signature; ``inspect.Signature.bind`` then rejects unknown
keywords and missing arguments exactly like a function call would, and the value checks below name
the marker, the test location, the bad value and the fix.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.errors import UsageError

IN_TREE = "in-tree"


# --- signatures (never called; used for binding and for `pytest --markers`) -----------------
def _moeperf_gpu() -> None: ...
def _moeperf_exclusive() -> None: ...
def _moeperf_spec(path: str, *, runs: int | None = None) -> None: ...
def _moeperf_slo(ttft_p99_ms: float, tpot_p99_ms: float, *,
                 e2el_p99_ms: float | None = None) -> None: ...  # fmt: skip
def _moeperf_accuracy(task: str = "gsm8k", shots: int = 5, max_drop: float = 1.0, *,
                      limit: int | None = None,
                      allow_uninformative: bool = False) -> None: ...  # fmt: skip
def _moeperf_moe_config(folder: str | None = None, *, files: Mapping[str, Any] | None = None,
                        name: str | None = None) -> None: ...  # fmt: skip


MARKERS: dict[str, tuple[Callable[..., None], str]] = {
    "moeperf_gpu": (_moeperf_gpu, "perf test that needs a GPU: runs only with --gpu, skipped "
                    "otherwise with the reason and the command."),
    "moeperf_exclusive": (_moeperf_exclusive, "the test's measurement must not share the node: "
                          "it leases every GPU of the pool (and the node) for its whole "
                          "duration, so under xdist it runs alone; this serialises the run."),
    "moeperf_spec": (_moeperf_spec, "the workload spec (YAML) the test serves and drives; path "
                     "relative to the test file or the specs folder (--moeperf-specs-dir, "
                     "default perf_tests/specs/); runs=N beats --moeperf-runs and the spec's "
                     "runs:."),
    "moeperf_slo": (_moeperf_slo, "SLO gate: p99 TTFT and p99 TPOT limits in ms (and optionally "
                    "p99 end-to-end latency); overrides the spec's slo."),
    "moeperf_accuracy": (_moeperf_accuracy, "accuracy gate: task (gsm8k), few-shot count and "
                         "the largest allowed drop in points vs the baseline, paired per "
                         "question; allow_uninformative=True lets a near-zero model (random "
                         "weights) pass and be a baseline."),
    "moeperf_moe_config": (_moeperf_moe_config, "fused-MoE config for the test's server: a folder "
                           "of vLLM config JSON files, 'in-tree', or files={name: path-or-dict}."),
}  # fmt: skip


def register(config: pytest.Config) -> None:
    for name, (_fn, text) in MARKERS.items():
        config.addinivalue_line("markers", f"{name}{signature_text(name)}: {text}")


def signature_text(name: str) -> str:
    """``(ttft_p99_ms: float, ...)`` as a user writes it, for help and error messages."""
    sig = inspect.signature(MARKERS[name][0], eval_str=True)
    return str(sig).replace(" -> None", "")


@dataclass(frozen=True)
class SloGate:
    ttft_p99_ms: float
    tpot_p99_ms: float
    e2el_p99_ms: float | None = None
    source: str = "default"


@dataclass(frozen=True)
class AccuracyGate:
    task: str
    shots: int
    max_drop: float
    limit: int | None
    source: str
    #: A near-zero score (the gate cannot see a drop) passes and may be a baseline only if True.
    allow_uninformative: bool = False


@dataclass(frozen=True)
class MoeConfigChoice:
    """The MoE config a test asked for: a folder, in-tree, or files to lay out."""

    name: str
    folder: Path | None  # None = in-tree (an empty tuned folder is laid out)
    files: Mapping[str, Any] | None
    source: str

    @property
    def in_tree(self) -> bool:
        return self.folder is None and not self.files


@dataclass(frozen=True)
class SpecChoice:
    path: Path
    runs: int | None
    source: str


def where(item: pytest.Item, marker: str) -> str:
    """``marker @pytest.mark.X on FILE:LINE (test)``, LINE the marker's own decorator line when
    it sits on the test function (else the test's line: a class or module ``pytestmark``)."""
    path, lineno, _ = item.location
    own = _decorator_line(item, marker)
    line = f":{own}" if own is not None else (f":{lineno + 1}" if lineno is not None else "")
    return f"marker @pytest.mark.{marker} on {path}{line} ({item.name})"


def _decorator_line(item: pytest.Item, marker: str) -> int | None:
    """1-based line of ``@pytest.mark.<marker>`` among the test function's decorators."""
    try:
        lines, start = inspect.getsourcelines(getattr(item, "obj", None))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None
    for offset, text in enumerate(lines):
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")):
            return None
        if f"mark.{marker}" in stripped:
            return start + offset
    return None


def _bind(item: pytest.Item, name: str) -> tuple[inspect.BoundArguments, str] | None:
    mark = item.get_closest_marker(name)
    if mark is None:
        return None
    source = where(item, name)
    fn = MARKERS[name][0]
    sig = inspect.signature(fn, eval_str=True)
    unknown = [k for k in mark.kwargs if k not in sig.parameters]
    if unknown:  # before bind(), which would first report a required argument as missing
        close = difflib.get_close_matches(unknown[0], list(sig.parameters), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(source, f"keyword {unknown[0]}", mark.kwargs[unknown[0]],
                         f"is not an argument of @pytest.mark.{name}",
                         f"use @pytest.mark.{name}{signature_text(name)}{hint}")  # fmt: skip
    try:
        bound = sig.bind(*mark.args, **mark.kwargs)
    except TypeError as exc:
        raise UsageError(
            source,
            "arguments",
            _call_text(mark),
            str(exc),
            f"use @pytest.mark.{name}{signature_text(name)}",
        ) from None
    bound.apply_defaults()
    return bound, source


def _call_text(mark: pytest.Mark) -> str:
    parts = [repr(a) for a in mark.args] + [f"{k}={v!r}" for k, v in mark.kwargs.items()]
    return f"({', '.join(parts)})"


def _number(source: str, field: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(
            source,
            field,
            value,
            "not a number",
            f"give {field} in milliseconds as a positive number, e.g. {field}=200",
        )
    if not math.isfinite(value) or value <= 0:
        raise UsageError(
            source,
            field,
            value,
            "must be a finite number > 0",
            f"give {field} in milliseconds as a positive number, e.g. {field}=200",
        )
    return float(value)


def slo_gate(item: pytest.Item) -> SloGate | None:
    got = _bind(item, "moeperf_slo")
    if got is None:
        return None
    b, source = got
    ttft = _number(source, "ttft_p99_ms", b.arguments["ttft_p99_ms"])
    tpot = _number(source, "tpot_p99_ms", b.arguments["tpot_p99_ms"])
    e2el = _number(source, "e2el_p99_ms", b.arguments["e2el_p99_ms"], allow_none=True)
    assert ttft is not None and tpot is not None
    return SloGate(ttft, tpot, e2el, source)


def accuracy_gate(item: pytest.Item) -> AccuracyGate | None:
    got = _bind(item, "moeperf_accuracy")
    if got is None:
        return None
    b, source = got
    task, shots = b.arguments["task"], b.arguments["shots"]
    max_drop, limit = b.arguments["max_drop"], b.arguments["limit"]
    allow = b.arguments["allow_uninformative"]
    if not isinstance(allow, bool):
        raise UsageError(source, "allow_uninformative", allow, "must be True or False",
                         "allow_uninformative=True only for a model that cannot do "
                         "gsm8k")  # fmt: skip
    if task != "gsm8k":
        raise UsageError(source, "task", task, "unknown accuracy task", "use task='gsm8k'")
    if isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= 8:
        raise UsageError(
            source,
            "shots",
            shots,
            "must be an integer from 0 to 8",
            "use shots=5 (lm-eval's gsm8k default)",
        )
    if (isinstance(max_drop, bool) or not isinstance(max_drop, int | float)
            or not math.isfinite(max_drop) or max_drop < 0):  # fmt: skip
        raise UsageError(
            source,
            "max_drop",
            max_drop,
            "must be a number of points >= 0",
            "e.g. max_drop=1.0 allows a drop of one accuracy point",
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(
            source,
            "limit",
            limit,
            "must be an integer >= 1 or None",
            "e.g. limit=50 runs the first 50 test questions",
        )
    if limit is not None:
        from pytest_moeperf.accuracy.gsm8k import questions_in_test_split

        data, n_test = questions_in_test_split()
        if limit > n_test:
            raise UsageError(source, "limit", limit,
                             f"the gsm8k test split has only {n_test} questions ({data})",
                             f"use limit <= {n_test}, or leave limit out to ask all "
                             f"{n_test}")  # fmt: skip
    return AccuracyGate(task, shots, float(max_drop), limit, source, allow)


def moe_config_choice(item: pytest.Item) -> MoeConfigChoice | None:
    got = _bind(item, "moeperf_moe_config")
    if got is None:
        return None
    b, source = got
    folder, files, name = b.arguments["folder"], b.arguments["files"], b.arguments["name"]
    if folder is not None and files is not None:
        raise UsageError(
            source,
            "folder/files",
            (folder, "files=..."),
            "give one, not both",
            "pass folder='path' or files={'E=...json': path_or_dict}",
        )
    if files is not None:
        if not isinstance(files, Mapping) or not files:
            raise UsageError(
                source,
                "files",
                files,
                "must be a non-empty mapping",
                "files={'E=128,N=768,device_name=NVIDIA_H200.json': path_or_dict}",
            )
        return MoeConfigChoice(name or "custom", None, files, source)
    if folder is None or folder == IN_TREE:
        return MoeConfigChoice(name or IN_TREE, None, None, source)
    if not isinstance(folder, str | Path):
        raise UsageError(
            source,
            "folder",
            folder,
            "must be a path or 'in-tree'",
            "pass folder='configs/my-tuning' or folder='in-tree'",
        )
    p = Path(folder)
    if not p.is_absolute():
        p = Path(str(item.path)).parent / p
    if not p.is_dir():
        raise UsageError(
            source,
            "folder",
            str(folder),
            f"no such directory ({p})",
            "point folder at a directory holding E=...,N=...,device_name=....json "
            "files, relative to the test file",
        )
    return MoeConfigChoice(name or p.name, p, None, source)


def exclusive(item: pytest.Item) -> bool:
    """True for a test marked ``moeperf_exclusive`` (which takes no arguments)."""
    return _bind(item, "moeperf_exclusive") is not None


def spec_choice(item: pytest.Item, specs_dir: Path) -> SpecChoice | None:
    got = _bind(item, "moeperf_spec")
    if got is None:
        return None
    b, source = got
    raw, runs = b.arguments["path"], b.arguments["runs"]
    if not isinstance(raw, str | Path):
        raise UsageError(
            source,
            "path",
            raw,
            "must be a path to a YAML spec",
            "e.g. @pytest.mark.moeperf_spec('cpu-smoke.yaml')",
        )
    if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 1):
        raise UsageError(
            source,
            "runs",
            runs,
            "must be an integer >= 1",
            "e.g. runs=5; the variance band needs at least 3",
        )
    candidates = [Path(str(item.path)).parent / raw, specs_dir / raw, Path(raw)]
    for c in candidates:
        if c.is_file():
            return SpecChoice(c, runs, source)
    tried = ", ".join(str(c) for c in candidates)
    raise UsageError(
        source,
        "path",
        str(raw),
        f"spec file not found (tried {tried})",
        f"put the spec in {specs_dir} or give a path relative to the test file",
    )
