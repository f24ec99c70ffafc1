"""What a baseline was measured on: a result only compares with one from the same setup.

Hardware fields decide whether two numbers may be compared at all (an H100 baseline says nothing
about an A100); software fields are what a comparison is usually *about* (a new vLLM, a new MoE
config), so the report names them but does not refuse.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_moeperf.baseline.calibration import Calibration

if TYPE_CHECKING:
    from pytest_moeperf.baseline.schema import KeyEntry

HARDWARE_FIELDS: tuple[str, ...] = ("backend", "gpu_name", "gpu_count", "driver", "cuda")
SOFTWARE_FIELDS: tuple[str, ...] = (
    "vllm_version",
    "model",
    "dtype",
    "tp",
    "dp",
    "spec_hash",
    "moe_config_hash",
)
_NAMED = (*HARDWARE_FIELDS, *SOFTWARE_FIELDS)


@dataclass(frozen=True)
class BaselineKey:
    """Everything that must match for two measurements to be the same experiment.

    ``backend`` is "cuda" or "cpu"; on the CPU backend ``gpu_name`` holds the CPU model and
    ``driver``/``cuda`` are empty. ``spec_hash`` covers the workload spec and ``moe_config_hash``
    the fused-MoE tuning files in use ("" when vLLM's defaults are used).

    ``calibration`` is the machine's measured speed (baseline/calibration.py): it is stored in
    the file but is neither part of the file name nor of equality, since two sessions on one
    machine never measure the same figures; ``gates.compare`` judges it with a tolerance.
    None: not measured (a remote server, or a baseline from before calibrations existed).
    """

    backend: str
    gpu_name: str
    gpu_count: int
    driver: str
    cuda: str
    vllm_version: str
    model: str
    dtype: str
    tp: int
    dp: int
    spec_hash: str
    moe_config_hash: str
    calibration: Calibration | None = field(default=None, compare=False)

    def names(self) -> dict[str, Any]:
        """The named fields only: what the file name and the digest are made of."""
        return {n: getattr(self, n) for n in _NAMED}

    def to_dict(self) -> dict[str, Any]:
        cal = None if self.calibration is None else self.calibration.to_dict()
        return {**self.names(), "calibration": cal}

    @classmethod
    def from_dict(cls, d: object, *, source: str = "baseline key") -> BaselineKey:
        """Build a key from JSON, naming the bad or missing field in a UsageError."""
        from pytest_moeperf.baseline.schema import KeyEntry, validate

        return cls.from_entry(validate(KeyEntry, d, source))

    @classmethod
    def from_entry(cls, entry: KeyEntry) -> BaselineKey:
        """The key of a validated file (``baseline/schema.py``)."""
        cal = entry.calibration
        values = entry.model_dump(exclude={"calibration"})
        return cls(**values, calibration=None if cal is None else Calibration.from_entry(cal))

    def digest(self) -> str:
        """Stable hash of every field; the same setup gives the same digest on any machine."""
        blob = json.dumps(self.names(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def slug(self) -> str:
        """A file-name-safe name: readable parts for humans, a short hash for uniqueness."""
        model = self.model.rstrip("/").rsplit("/", 1)[-1]
        parts = [
            self.backend,
            f"{self.gpu_name}x{self.gpu_count}",
            model,
            self.dtype,
            f"tp{self.tp}dp{self.dp}",
        ]
        readable = safe_name("-".join(p for p in parts if p), limit=80)
        return f"{readable}-{self.digest()[:10]}"

    def mismatches(self, other: BaselineKey) -> list[str]:
        """Names of the fields that differ, hardware fields first."""
        return [
            n for n in (*HARDWARE_FIELDS, *SOFTWARE_FIELDS) if getattr(self, n) != getattr(other, n)
        ]

    def hardware_mismatches(self, other: BaselineKey) -> list[str]:
        return [n for n in self.mismatches(other) if n in HARDWARE_FIELDS]

    def software_mismatches(self, other: BaselineKey) -> list[str]:
        return [n for n in self.mismatches(other) if n in SOFTWARE_FIELDS]

    def describe_mismatches(self, other: BaselineKey) -> str:
        """One line such as "hardware: gpu_name 'A100' vs 'H100'; software: tp 1 vs 2"."""
        out = []
        for label, names in (
            ("hardware", self.hardware_mismatches(other)),
            ("software", self.software_mismatches(other)),
        ):
            if names:
                diffs = ", ".join(
                    f"{n} {getattr(self, n)!r} vs {getattr(other, n)!r}" for n in names
                )
                out.append(f"{label}: {diffs}")
        return "; ".join(out) if out else "identical"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str, *, limit: int = 100) -> str:
    """Replace every run of characters outside [A-Za-z0-9._-] by one '_' and cap the length.

    Not injective on its own ("a/b" and "a_b" collide): callers add a hash of the original.
    """
    cleaned = _UNSAFE.sub("_", text).strip("._-") or "_"
    return cleaned[:limit].rstrip("._-") or "_"
