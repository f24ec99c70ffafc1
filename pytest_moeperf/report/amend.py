"""Corrections made to a run's baseline after the run: applied to the report, and said.

Why: the baseline file a run wrote is the stored record of that run. When a metric is
re-derived there later (``provenance.amended``, e.g. MBU after the fp8 weight-width fix), the
results file still holds the old value, and a report built from it alone would print a figure
known to be wrong. Only a baseline that this result wrote (status "written") is used, only when
every metric that was not amended equals the result's runs value for value (else it is another
recording), and only for metrics that an amendment names.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_moeperf.report.content import fmt_metric
from pytest_moeperf.report.model import Metric, Metrics, Result, Run


def locate(recorded: str, source: str) -> Path | None:
    """The baseline file: at its recorded path, or, when it was recorded on another machine,
    at the same ``baselines/...`` path in a folder above the results file (its checkout)."""
    path = Path(recorded)
    if path.is_file():
        return path
    if "baselines" not in path.parts or not Path(source).is_file():
        return None
    tail = _tail(path)
    for folder in Path(source).resolve().parents:
        if (folder / tail).is_file():
            return folder / tail
    return None


def _tail(path: Path) -> Path:
    """``baselines/...`` of a path (from its last ``baselines`` folder), else the path."""
    parts = path.parts
    if "baselines" not in parts:
        return path
    return Path(*parts[len(parts) - 1 - parts[::-1].index("baselines") :])


def apply_amendments(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """The runs with amended baseline values in place; one line per amended result."""
    out, notes = [], []
    for run in runs:
        results = []
        for r in run.results:
            new, note = _amend(r, run.source)
            results.append(new)
            if note:
                notes.append(note)
        out.append(replace(run, results=tuple(results)))
    return out, notes


def _numbers(v: object) -> list[float] | None:
    if not isinstance(v, list) or not v:
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return None
    return [float(x) for x in v]


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-9) for x, y in zip(a, b, strict=False)
    )


def _load(path: Path) -> Mapping[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, Mapping) else None


def _amend(r: Result, source: str) -> tuple[Result, str | None]:
    recorded = r.baseline.get("path")
    if r.baseline.get("status") != "written" or not isinstance(recorded, str):
        return r, None
    path = locate(recorded, source)
    doc = _load(path) if path is not None else None
    if path is None or doc is None:
        return r, None
    prov, stored = doc.get("provenance"), doc.get("metrics")
    amended = prov.get("amended") if isinstance(prov, Mapping) else None
    if not isinstance(amended, list) or not isinstance(stored, Mapping):
        return r, None
    entries = [a for a in amended if isinstance(a, Mapping)]
    said = " ".join(str(a.get("what", "")) for a in entries)
    changed: dict[str, list[float]] = {}
    matched = 0
    for name, m in r.metrics.items():
        runs = _numbers(stored.get(name))
        if runs is None:
            continue
        if _same(runs, m.runs):
            matched += 1
        elif name in said:
            changed[name] = runs
        else:
            return r, None  # a metric differs that no amendment names: another recording
    if not changed or not matched:
        return r, None
    metrics = dict(r.metrics)
    moves = []
    for name, runs in changed.items():
        old = metrics[name]
        finite = [x for x in runs if math.isfinite(x)]
        new = Metric(tuple(runs), statistics.median(finite) if finite else None, old.unit, None)
        metrics[name] = new
        moves.append(f"{name} {fmt_metric(old, name)} → {fmt_metric(new, name)}")
    tail = _tail(path)
    how = "; ".join(
        f"{a.get('date', 'n/a')} by {a.get('by', 'n/a')}: {a.get('what', '')}"
        + (f" (why: {a['why']})" if a.get("why") else "")
        for a in entries
    )
    note = (
        f"{r.nodeid} [{r.config}]: {', '.join(moves)}, as amended in the baseline this run "
        f"wrote ({tail}): {how}."
    )
    return replace(r, metrics=Metrics(metrics)), note
