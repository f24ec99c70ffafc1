"""Read session results payloads into typed rows that the HTML and Markdown writers share.

Why a separate model: both writers must say the same thing (one conclusion, one "not measured"
rule), and a results file from an old or interrupted run lacks keys. Missing keys become None
here, once; a key that is present with the wrong type is a UsageError naming the file and field,
because rendering it would show a wrong number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.hygiene.model import HygieneReport
from pytest_moeperf.report.rows import Metric as Metric
from pytest_moeperf.report.rows import Metrics as Metrics
from pytest_moeperf.report.rows import MoeConfigProof as MoeConfigProof
from pytest_moeperf.report.rows import VerdictRow as VerdictRow

SCHEMA_VERSION = 1
_FIX = "pass a results file written by the moeperf plugin (--moeperf-results), schema_version 1"


@dataclass(frozen=True)
class Result:
    """One perf test result (one test x one MoE config) from one results file."""

    source: str  # file name (or "payload[i]") the result came from, for messages
    run_index: int  # which payload, so two nights of the same config stay apart
    nodeid: str
    outcome: str
    reasons: tuple[str, ...]
    config: str
    spec: Mapping[str, Any]
    setup: Mapping[str, Any]
    moe_config: MoeConfigProof
    metrics: Metrics
    verdicts: tuple[VerdictRow, ...]
    baseline: Mapping[str, Any]
    accuracy: Mapping[str, Any] | None
    fleet: Mapping[str, Any] | None
    search_runs: tuple[Mapping[str, Any], ...]
    sweep: tuple[Mapping[str, Any], ...]
    hygiene: HygieneReport | None = None  # None: recorded before hygiene checks existed

    @property
    def family(self) -> str:
        """The test without its parametrization: results of one family are compared as bars."""
        return self.nodeid.split("[", 1)[0]

    def metric(self, name: str) -> Metric | None:
        return self.metrics.get(name)

    def center(self, name: str) -> float | None:
        m = self.metrics.get(name)
        return m.center if m is not None and m.measured else None

    def verdict(self, name: str) -> VerdictRow | None:
        return next((v for v in self.verdicts if v.metric == name), None)


@dataclass(frozen=True)
class Run:
    """One results file: the session's provenance plus its results."""

    source: str
    command: str | None
    quick: bool
    started: float | None
    finished: float | None
    plugin_version: str | None
    warnings: tuple[str, ...]
    results: tuple[Result, ...] = field(default_factory=tuple)


class _Reader:
    """Type-checked access to one payload; every error names the file and the dotted field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, value: object, problem: str) -> UsageError:
        return UsageError(self.source, where, _short(value), problem, _FIX)

    def mapping(self, d: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, Mapping):
            raise self.fail(f"{where}.{key}", v, "must be an object")
        return v

    def text(self, d: Mapping[str, Any], key: str, where: str) -> str | None:
        v = d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise self.fail(f"{where}.{key}", v, "must be a string")
        return str(v)

    def number(self, d: Mapping[str, Any], key: str, where: str) -> float | None:
        v = d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(f"{where}.{key}", v, "must be a number or null")
        return float(v) if math.isfinite(v) else None

    def items(self, d: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
        v = d.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.fail(f"{where}.{key}", v, "must be a list")
        for i, x in enumerate(v):
            if not isinstance(x, Mapping):
                raise self.fail(f"{where}.{key}[{i}]", x, "must be an object")
        return v

    def strings(self, d: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
        v = d.get(key)
        if v is None:
            return ()
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(f"{where}.{key}", v, "must be a list of strings")
        return tuple(v)


def _short(value: object) -> object:
    text = repr(value)
    return value if len(text) <= 80 else text[:77] + "..."


def _metric(r: _Reader, d: Mapping[str, Any], where: str) -> Metric:
    runs_raw = d.get("runs") or []
    if not isinstance(runs_raw, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in runs_raw
    ):
        raise r.fail(f"{where}.runs", runs_raw, "must be a list of numbers")
    return Metric(
        runs=tuple(float(x) for x in runs_raw),
        center=r.number(d, "center", where),
        unit=r.text(d, "unit", where) or "",
        note=r.text(d, "note", where),
    )


def _verdict(r: _Reader, d: Mapping[str, Any], where: str) -> VerdictRow:
    band_raw = d.get("band")
    band: tuple[float, float] | None = None
    if band_raw is not None:
        if (
            not isinstance(band_raw, list)
            or len(band_raw) != 2
            or not all(isinstance(x, (int, float)) or x is None for x in band_raw)
        ):
            raise r.fail(f"{where}.band", band_raw, "must be [low, high]")
        lo, hi = band_raw
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
            band = (float(lo), float(hi))
    return VerdictRow(
        metric=r.text(d, "metric", where) or "?",
        outcome=r.text(d, "outcome", where) or "n/a",
        baseline_center=r.number(d, "baseline_center", where),
        band=band,
        candidate_center=r.number(d, "candidate_center", where),
        delta_rel=r.number(d, "delta_rel", where),
        p_value=r.number(d, "p_value", where),
        unit=r.text(d, "unit", where) or "",
        reason=r.text(d, "reason", where) or "",
        advice=r.text(d, "advice", where) or "",
        gating=bool(d.get("gating", True)),
    )


def _result(r: _Reader, d: Mapping[str, Any], where: str, run_index: int) -> Result:
    nodeid = r.text(d, "nodeid", where)
    if not nodeid:
        raise r.fail(f"{where}.nodeid", d.get("nodeid"), "is missing: every result names its test")
    moe = r.mapping(d, "moe_config", where) or {}
    config = r.text(d, "config_label", where) or r.text(moe, "name", f"{where}.moe_config")
    metrics_raw = r.mapping(d, "metrics", where) or {}
    metrics: dict[str, Metric] = {}
    for name, m in metrics_raw.items():
        if not isinstance(m, Mapping):
            raise r.fail(f"{where}.metrics.{name}", m, "must be an object with runs and center")
        metrics[str(name)] = _metric(r, m, f"{where}.metrics.{name}")
    verdicts = tuple(
        _verdict(r, v, f"{where}.verdicts[{i}]")
        for i, v in enumerate(r.items(d, "verdicts", where))
    )
    return Result(
        source=r.source,
        run_index=run_index,
        nodeid=nodeid,
        outcome=r.text(d, "outcome", where) or "unknown",
        reasons=r.strings(d, "reasons", where),
        config=config or "default",
        spec=r.mapping(d, "spec", where) or {},
        setup=r.mapping(d, "setup", where) or {},
        moe_config=MoeConfigProof(moe),
        metrics=Metrics(metrics),
        verdicts=verdicts,
        baseline=r.mapping(d, "baseline", where) or {},
        accuracy=r.mapping(d, "accuracy", where),
        fleet=r.mapping(d, "fleet", where),
        search_runs=tuple(r.items(d, "search_runs", where)),
        sweep=tuple(r.items(d, "sweep", where)),
        hygiene=None
        if d.get("hygiene") is None
        else HygieneReport.from_dict(d["hygiene"], r.source, f"{where}.hygiene"),
    )


def parse_result(record: Mapping[str, Any], source: str) -> Result:
    """One result record (as the plugin writes it into ``results``) as the typed ``Result``:
    the same model the report reads, so a perf test and the report see the same fields."""
    return _result(_Reader(source), record, "result", 0)


def parse_payload(payload: object, source: str, run_index: int = 0) -> Run:
    """Validate one results payload; raises UsageError naming ``source`` and the bad field."""
    r = _Reader(source)
    if not isinstance(payload, Mapping):
        raise r.fail("(top level)", type(payload).__name__, "must be a JSON object")
    version = payload.get("schema_version")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION
    ):
        raise UsageError(
            source,
            "schema_version",
            version,
            f"this report reads schema_version <= {SCHEMA_VERSION}",
            "upgrade pytest-moeperf to the version that wrote the file",
        )
    if "results" not in payload:
        raise r.fail("results", None, "is missing: not a moeperf session results file")
    results = tuple(
        _result(r, d, f"results[{i}]", run_index)
        for i, d in enumerate(r.items(payload, "results", "(top level)"))
    )
    return Run(
        source=source,
        command=r.text(payload, "command", "(top level)"),
        quick=bool(payload.get("quick", False)),
        started=r.number(payload, "started", "(top level)"),
        finished=r.number(payload, "finished", "(top level)"),
        plugin_version=r.text(payload, "plugin_version", "(top level)"),
        warnings=r.strings(payload, "warnings", "(top level)"),
        results=results,
    )


def parse_payloads(payloads: Sequence[object], sources: Sequence[str] | None = None) -> list[Run]:
    if sources is not None and len(sources) != len(payloads):
        raise UsageError(
            "write_report",
            "sources",
            list(sources),
            f"has {len(sources)} names for {len(payloads)} payloads",
            "pass one source name per payload",
        )
    names = (
        list(sources) if sources is not None else [f"payload[{i}]" for i in range(len(payloads))]
    )
    if not payloads:
        raise UsageError("write_report", "payloads", [], "is empty", "pass at least one results")
    return [parse_payload(p, names[i], i) for i, p in enumerate(payloads)]


def bar_labels(results: Sequence[Result]) -> list[str]:
    """Config names made unique: "in-tree", "in-tree (test_x)" or "in-tree · run 2"."""
    families = {r.family for r in results}
    labels = []
    for r in results:
        label = r.config
        if len(families) > 1:
            label += f" ({r.family.rsplit('::', 1)[-1]})"
        labels.append(label)
    seen: dict[str, int] = {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
    return [
        f"{label} · run {r.run_index + 1}" if seen[label] > 1 else label
        for label, r in zip(labels, results, strict=True)
    ]


def latest_per_test(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """Keep one result per test (nodeid x config): the one of the latest file that holds it.

    Why: a test that failed for a reason of its own (a wrong assertion) is re-run into a new
    results file; the report of that night takes the re-run, says so, and drops the session
    warnings that were about the replaced result. Returns the runs and one line per replacement.
    """
    last: dict[tuple[str, str], int] = {}
    for i, run in enumerate(runs):
        for r in run.results:
            last[(r.nodeid, r.config)] = i
    out: list[Run] = []
    notes: list[str] = []
    for i, run in enumerate(runs):
        keep = tuple(r for r in run.results if last[(r.nodeid, r.config)] == i)
        gone = [r for r in run.results if last[(r.nodeid, r.config)] != i]
        for r in gone:
            later = runs[last[(r.nodeid, r.config)]]
            new = next(x for x in later.results if (x.nodeid, x.config) == (r.nodeid, r.config))
            why = f": {_clip('; '.join(r.reasons), 140)}" if r.reasons else ""
            notes.append(
                f"{r.nodeid} [{r.config}] of {run.source} ({r.outcome}{why}) is replaced by "
                f"the later {later.source} ({new.outcome})."
            )
        warnings = tuple(
            w for w in run.warnings if not any(w.startswith(f"{r.nodeid}:") for r in gone)
        )
        out.append(replace(run, results=keep, warnings=warnings))
    return out, notes


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"
