"""The hygiene report's data: one item per check, and the "noisy machine" verdict.

Why a status per check and a separate ``spoils`` flag: a machine can be unhealthy in ways that do
not move throughput (a pending ECC mode change) and healthy-looking in ways that do (a power cap
set by the datacenter). Only warnings that would spoil the numbers make the machine "noisy".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_moeperf.errors import UsageError

OK, WARN, UNKNOWN = "ok", "warn", "unknown"
STATUSES = (OK, WARN, UNKNOWN)
NOISY_PREFIX = "noisy machine before measuring: "  # the session warning's words
_FIX = "pass a results file written by the moeperf plugin (--moeperf-results)"


@dataclass(frozen=True)
class HygieneCheck:
    """One read-only check: ``value`` is what was read (JSON-safe), ``detail`` says it in words."""

    name: str  # "gpu0.power_limit", "host.cpu_load"
    status: str  # ok | warn | unknown
    value: Any = None
    detail: str = ""
    spoils: bool = False  # a warning that would spoil the numbers

    @property
    def noisy(self) -> bool:
        return self.status == WARN and self.spoils

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "value": self.value,
            "detail": self.detail,
            "spoils": self.spoils,
        }


@dataclass
class HygieneReport:
    """Every check taken once, after the server is up and before load."""

    checks: list[HygieneCheck]
    taken_at: float
    sample_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def noisy(self) -> list[str]:
        """One line per warning that would spoil the numbers; empty on a quiet machine."""
        return [f"{c.name}: {c.detail}" for c in self.checks if c.noisy]

    @property
    def verdict(self) -> str:
        return "noisy" if self.noisy else "quiet"

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def check(self, name: str) -> HygieneCheck | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "noisy": self.noisy,
            "counts": self.counts(),
            "checks": [c.to_dict() for c in self.checks],
            "taken_at": self.taken_at,
            "sample_s": self.sample_s,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: object, source: str = "hygiene", where: str = "hygiene") -> HygieneReport:
        """Read a ``to_dict`` back; a wrong type is a UsageError naming ``source`` and field."""

        def fail(at: str, value: object, problem: str) -> UsageError:
            text = repr(value)
            shown = value if len(text) <= 80 else text[:77] + "..."
            return UsageError(source, at, shown, problem, _FIX)

        if not isinstance(d, Mapping):
            raise fail(where, d, "must be an object")
        raw = d.get("checks") or []
        if not isinstance(raw, (list, tuple)):
            raise fail(f"{where}.checks", raw, "must be a list")
        checks = []
        for i, c in enumerate(raw):
            at = f"{where}.checks[{i}]"
            if not isinstance(c, Mapping):
                raise fail(at, c, "must be an object")
            name, status, detail = c.get("name"), c.get("status"), c.get("detail", "")
            if not isinstance(name, str) or not name:
                raise fail(f"{at}.name", name, "must be a non-empty string")
            if status not in STATUSES:
                raise fail(f"{at}.status", status, f"must be one of {', '.join(STATUSES)}")
            if not isinstance(detail, str):
                raise fail(f"{at}.detail", detail, "must be a string")
            checks.append(
                HygieneCheck(
                    name, str(status), c.get("value"), detail, bool(c.get("spoils", False))
                )
            )
        notes = d.get("notes") or []
        if not isinstance(notes, (list, tuple)) or not all(isinstance(n, str) for n in notes):
            raise fail(f"{where}.notes", notes, "must be a list of strings")
        numbers = {}
        for key in ("taken_at", "sample_s"):
            v = d.get(key, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise fail(f"{where}.{key}", v, "must be a number")
            numbers[key] = float(v)
        return cls(checks, numbers["taken_at"], numbers["sample_s"], list(notes))
