"""The typed parts of one result record: metrics, the MoE config proof and verdict rows.

Shared by the report, the plugin's ``PerfResult`` (what a perf test reads) and the CLIs, so all
of them read one result the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    """One metric of one result: the per-run values, their center and why it may be missing."""

    runs: tuple[float, ...]
    center: float | None
    unit: str
    note: str | None

    @property
    def measured(self) -> bool:
        return self.center is not None and math.isfinite(self.center)

    @property
    def spread(self) -> tuple[float, float] | None:
        """min-max of the finite runs, the variance band drawn when no verdict band exists."""
        xs = [x for x in self.runs if math.isfinite(x)]
        return (min(xs), max(xs)) if len(xs) >= 2 else None


class Metrics(Mapping[str, Metric]):
    """A result's metrics by name, also as attributes: ``result.metrics.slo_goodput_tok_s``.

    A name the result does not hold is an AttributeError that lists the ones it does, so a
    perf test's typo is one line, not a KeyError deep in a dict."""

    def __init__(self, items: Mapping[str, Metric] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, name: str) -> Metric:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getattr__(self, name: str) -> Metric:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise AttributeError(f"no metric {name!r} in this result (it has: {known})") from None

    def __repr__(self) -> str:
        return f"Metrics({self._items!r})"


class MoeConfigProof(Mapping[str, Any]):
    """Which MoE config a result served with, and the proof: the files the server's log shows
    it loaded (``loaded``; empty when the backend reads none) and the one-line ``check``.
    Read as attributes; the recorded object stays readable as a mapping."""

    def __init__(self, raw: Mapping[str, Any] | None = None) -> None:
        self._raw = dict(raw or {})

    @property
    def name(self) -> str | None:
        v = self._raw.get("name")
        return None if v is None else str(v)

    @property
    def check(self) -> str:
        return str(self._raw.get("check") or "")

    @property
    def loaded(self) -> tuple[str, ...]:
        v = self._raw.get("loaded")
        return tuple(str(x) for x in v) if isinstance(v, list) else ()

    @property
    def hash(self) -> str | None:
        v = self._raw.get("hash")
        return None if v is None else str(v)

    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"MoeConfigProof({self._raw!r})"


@dataclass(frozen=True)
class VerdictRow:
    metric: str
    outcome: str
    baseline_center: float | None
    band: tuple[float, float] | None
    candidate_center: float | None
    delta_rel: float | None
    p_value: float | None
    unit: str
    reason: str
    advice: str
    gating: bool
