"""Read session results payloads into typed rows that the HTML and Markdown writers share.

Why a separate model: both writers must say the same thing (one conclusion, one "not measured"
rule), and a results file from an old or interrupted run lacks keys. The file is validated by
its pydantic schema (``report/schema.py``); missing keys become None here, once; a key present
with the wrong type, or one the schema does not know, is a UsageError naming the file and field,
because rendering it would show a wrong number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.hygiene.model import HygieneReport
from pytest_moeperf.report import RESULTS_SCHEMA_VERSION as SCHEMA_VERSION
from pytest_moeperf.report.rows import Metric as Metric
from pytest_moeperf.report.rows import Metrics as Metrics
from pytest_moeperf.report.rows import MoeConfigProof as MoeConfigProof
from pytest_moeperf.report.rows import VerdictRow as VerdictRow
from pytest_moeperf.report.schema import (
    FIX,
    MetricEntry,
    ResultRecord,
    VerdictEntry,
    validate,
    validate_record,
)


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


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _metric(m: MetricEntry) -> Metric:
    return Metric(runs=tuple(m.runs or ()), center=_finite(m.center), unit=m.unit or "",
                  note=m.note)  # fmt: skip


def _verdict(v: VerdictEntry) -> VerdictRow:
    lo, hi = v.band if v.band is not None else (None, None)
    band = (lo, hi) if _finite(lo) is not None and _finite(hi) is not None else None
    return VerdictRow(
        metric=v.metric or "?", outcome=v.outcome or "n/a",
        baseline_center=_finite(v.baseline_center),
        band=band,  # type: ignore[arg-type]  # both finite floats here
        candidate_center=_finite(v.candidate_center), delta_rel=_finite(v.delta_rel),
        p_value=_finite(v.p_value), unit=v.unit or "", reason=v.reason or "",
        advice=v.advice or "", gating=v.gating is not False,
    )  # fmt: skip


def _result(d: ResultRecord, source: str, where: str, run_index: int) -> Result:
    moe = d.moe_config.model_dump(exclude_unset=True) if d.moe_config else {}
    return Result(
        source=source,
        run_index=run_index,
        nodeid=d.nodeid,
        outcome=d.outcome or "unknown",
        reasons=tuple(d.reasons or ()),
        config=d.config_label or moe.get("name") or "default",
        spec=d.spec or {},
        setup=d.setup or {},
        moe_config=MoeConfigProof(moe),
        metrics=Metrics({name: _metric(m) for name, m in (d.metrics or {}).items()}),
        verdicts=tuple(_verdict(v) for v in d.verdicts or ()),
        baseline=d.baseline.model_dump(exclude_unset=True) if d.baseline else {},
        accuracy=d.accuracy,
        fleet=d.fleet,
        search_runs=tuple(d.search_runs or ()),
        sweep=tuple(d.sweep or ()),
        hygiene=None
        if d.hygiene is None
        else HygieneReport.from_dict(d.hygiene, source, f"{where}.hygiene"),
    )


def parse_result(record: Mapping[str, Any], source: str) -> Result:
    """One result record (as the plugin writes it into ``results``) as the typed ``Result``:
    the same model the report reads, so a perf test and the report see the same fields."""
    return _result(validate_record(record, source), source, "result", 0)


def parse_payload(payload: object, source: str, run_index: int = 0) -> Run:
    """Validate one results payload; raises UsageError naming ``source`` and the bad field."""
    if not isinstance(payload, Mapping):
        raise UsageError(source, "(top level)", type(payload).__name__,
                         "must be a JSON object", FIX)  # fmt: skip
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
    f = validate(payload, source)
    return Run(
        source=source,
        command=f.command,
        quick=bool(f.quick),
        started=_finite(f.started),
        finished=_finite(f.finished),
        plugin_version=f.plugin_version,
        warnings=tuple(f.warnings or ()),
        results=tuple(
            _result(d, source, f"results[{i}]", run_index) for i, d in enumerate(f.results)
        ),
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
