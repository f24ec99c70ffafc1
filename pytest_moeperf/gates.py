"""Gates after measurement: compare with the stored baseline, gate accuracy, refresh on request.

Kept apart from the measuring so the rules are in one place: a regression fails the test only
through a verdict (outside the band, significant, beyond the minimum effect); a missing baseline
warns locally and fails in CI mode; a baseline from other hardware is not compared unless asked;
a refresh never writes from a partial, failed or quick run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_moeperf.baseline import Baseline, BaselineKey, BaselineStore, Provenance
from pytest_moeperf.baseline.calibration import DRIFT_SPAN
from pytest_moeperf.errors import UsageError
from pytest_moeperf.markers import AccuracyGate
from pytest_moeperf.verdict import Verdict
from pytest_moeperf.verdict.machine_drift import drift_note, speed_note
from pytest_moeperf.verdict.server_cost import confounded, server_cost_notes

REFRESH_HINT = "pytest {target} --moeperf-refresh-baselines --moeperf-reason '...'"


@dataclass
class BaselineOutcome:
    status: str  # "compared" | "missing" | "other-hardware" | "other-setup" | "uncalibrated"
    #              | "unreadable"
    path: str | None
    verdicts: list[Verdict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    accuracy: dict[str, Any] | None = None
    baseline: Baseline | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "path": self.path,
                "other": self.warnings}  # fmt: skip


def compare(
    store: BaselineStore, test_id: str, key: BaselineKey, candidate: Mapping[str, Sequence[float]],
    *, allow_other_hardware: bool, ci_mode: bool, target: str,
    accuracy: dict[str, Any] | None = None, accuracy_gate: AccuracyGate | None = None,
    refreshing: bool = False, candidate_runs: Sequence[Mapping[str, Any]] = (),
) -> BaselineOutcome:  # fmt: skip
    """Compare ``candidate`` (per-run metric values) with the stored baseline of this key.

    ``candidate_runs`` are the runs as recorded: with the baseline's, they give the SLO search
    bracket that searched metrics are known to within (``verdict.search_resolution``)."""
    from pytest_moeperf.verdict import judge_all, search_resolution

    hint = REFRESH_HINT.format(target=target)
    path = str(store.first_path(test_id, key))  # named if no file can be read
    try:  # every file read is here: a corrupt baseline of another setup is unreadable too
        found, baseline = store.find(test_id, key)  # this machine's file (or the closest)
        path = str(found)
        others = [] if baseline is not None else store.find_other_keys(test_id, exclude=key)
        if baseline is None and others and allow_other_hardware:
            found, baseline = store.find(test_id, others[0])
            path = str(found)
    except UsageError as exc:
        out = BaselineOutcome("unreadable", path)
        out.failures.append(str(exc))
        return out
    if baseline is None:
        usable = [o for o in others if not o.hardware_mismatches(key)]
        if others and not allow_other_hardware:
            text = (
                key.describe_mismatches(others[0])
                if not usable
                else ("software differs: " + ", ".join(usable[0].software_mismatches(key)))
            )
            out = BaselineOutcome("other-hardware", str(store.path_for(test_id, others[0])))
            msg = (
                f"baseline for {test_id} exists only for another setup ({text}); not compared. "
                f"Record one here with `{hint}` or pass --moeperf-allow-other-hardware"
            )
            (out.failures if ci_mode else out.warnings).append(msg)
            return out
        if baseline is None:
            out = BaselineOutcome("missing", path)
            if refreshing:  # this run is about to create it: nothing to warn about
                return out
            msg = f"no baseline for {test_id} at {path}; create it with `{hint}`"
            (out.failures if ci_mode else out.warnings).append(msg)
            return out
    assert baseline is not None
    other = None if allow_other_hardware else other_machine(test_id, key, baseline, path, hint)
    if other is not None:  # a refresh records this machine's: say so, never fail the run that does
        out = BaselineOutcome(other[0], path, baseline=baseline)
        msg = other[1]
        if refreshing:  # an uncalibrated file is re-recorded; another machine's is kept
            msg += (" (this refresh replaces it)" if other[0] == "uncalibrated"
                    else " (this refresh records this machine's baseline beside it)")  # fmt: skip
        (out.failures if ci_mode and not refreshing else out.warnings).append(msg)
        return out
    out = BaselineOutcome("compared", path, baseline=baseline)
    names = [n for n in candidate if n in baseline.metrics and candidate[n] and baseline.metrics[n]]
    resolution = max(search_resolution(baseline.runs), search_resolution(candidate_runs))
    out.verdicts = judge_all(baseline.metrics, {n: candidate[n] for n in names},
                             source=f"baseline {path}", resolution=resolution)  # fmt: skip
    speed = calibration_speed(key, baseline.key)
    out.verdicts = confounded(out.verdicts, baseline.runs, candidate_runs, speed)
    measured = [n for n in candidate if candidate[n]]
    if measured and not any(v.gating for v in out.verdicts):  # compared nothing: no gate
        out.failures.append(f"baseline {path} shares no gated metric with this run (baseline: "
                            f"{', '.join(sorted(baseline.metrics))}; this run: "
                            f"{', '.join(measured)}), so nothing was compared. Fix: re-record "
                            f"it with `{hint}`")  # fmt: skip
    for v in out.verdicts:
        if v.fails:
            out.failures.append(f"{v.metric} regressed vs baseline: {v.reason}")
        elif v.outcome == "inconclusive" and v.gating:
            out.warnings.append(f"{v.metric} inconclusive: {v.reason}; {v.advice}")
    out.warnings += server_cost_notes(baseline.runs, candidate_runs)
    if (drift := drift_note(baseline.runs, candidate_runs)) is not None:
        out.warnings.append(drift)
    if (moved := speed_note(speed, DRIFT_SPAN)) is not None:
        out.warnings.append(moved)
    if accuracy is not None and accuracy_gate is not None:
        out.accuracy = _accuracy_verdict(baseline, accuracy, accuracy_gate, path, out)
    return out


def calibration_speed(here: BaselineKey, there: BaselineKey) -> tuple[float, str] | None:
    """How far this session's calibration moved from the baseline's, where beyond the drift
    tolerance (``calibration.speed_drift``); None where either side has none."""
    from pytest_moeperf.baseline.calibration import speed_drift

    if here.calibration is None or there.calibration is None:
        return None
    return speed_drift(here.calibration, there.calibration)


def other_machine(test_id: str, key: BaselineKey, baseline: Baseline, path: str,
                   hint: str) -> tuple[str, str] | None:  # fmt: skip
    """("other-setup" | "uncalibrated", one line) where the names match but the machine may not:
    never a regression verdict from a machine that is not the baseline's (docs/verdicts.md)."""
    from pytest_moeperf.baseline.calibration import TOLERANCE, differences

    here, there = key.calibration, baseline.key.calibration
    if here is None:  # a remote server: this machine's speed says nothing; names only
        return None
    if there is None:
        return ("uncalibrated",
                f"baseline {path} has no machine calibration (recorded before calibrations "
                f"existed), so nothing says this machine ({here.summary()}) is the one it was "
                f"measured on; not compared. Re-record it here with `{hint}` "
                "or pass --moeperf-allow-other-hardware")  # fmt: skip
    diffs = differences(here, there)
    if not diffs:
        return None
    return ("other-setup",
            f"no baseline for {test_id} on this machine: {path} was recorded on another machine "
            f"(calibration {'; '.join(diffs)}, here vs baseline; tolerance x{1 + TOLERANCE:g}); "
            f"not compared. Record one with `{hint}` "
            "or pass --moeperf-allow-other-hardware")  # fmt: skip


def _accuracy_verdict(baseline: Baseline, candidate: dict[str, Any], gate: AccuracyGate,
                      path: str, out: BaselineOutcome) -> dict[str, Any] | None:  # fmt: skip
    from pytest_moeperf.accuracy import AccuracyResult, compare_results

    if baseline.accuracy is None:
        out.warnings.append(f"baseline {path} has no accuracy results; accuracy not gated")
        return None
    verdict = compare_results(
        AccuracyResult.from_dict(baseline.accuracy, source=path),
        AccuracyResult.from_dict(candidate, source="this run"),
        max_drop_points=gate.max_drop, baseline_source=path, candidate_source="this run",
    )  # fmt: skip
    if verdict.passed and not verdict.informative:  # passes only where the marker says so
        from dataclasses import replace

        from pytest_moeperf.accuracy.health import ALLOW_HINT

        verdict = (replace(verdict, reason=f"{verdict.reason}; allowed by {ALLOW_HINT}")
                   if gate.allow_uninformative else replace(
                       verdict, passed=False, reason=f"{verdict.reason}. Fix: find why both "
                       f"runs score near zero, or pass {ALLOW_HINT} to the marker for a model "
                       "that cannot do gsm8k"))  # fmt: skip
    if not verdict.passed:
        out.failures.append(f"accuracy gate ({gate.source}): {verdict.reason}")
    return verdict.to_dict()


def json_safe(value: Any) -> Any:
    """Strict JSON for stored files: a non-finite float (a p99 over failed requests) -> None."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def refresh(
    store: BaselineStore,
    test_id: str,
    key: BaselineKey,
    metrics: Mapping[str, Sequence[float]],
    runs: list[dict[str, Any]],
    *,
    accuracy: dict[str, Any] | None,
    reason: str,
    complete: bool,
    why_incomplete: str | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Write the baseline (atomically, via the store) or say why it was not written."""
    if not complete:
        return f"not-written: {why_incomplete or 'partial run'}"
    path = store.write(candidate(test_id, key, metrics, runs, accuracy=accuracy, reason=reason,
                                 extra=extra), complete=True)  # fmt: skip
    return f"written: {path}"


def candidate(test_id: str, key: BaselineKey, metrics: Mapping[str, Sequence[float]],
              runs: list[dict[str, Any]], *, accuracy: dict[str, Any] | None, reason: str,
              extra: dict[str, Any] | None = None) -> Baseline:  # fmt: skip
    """The baseline a refresh would write; checked now (``to_json``), written by the caller
    once the test body has passed (pytest_moeperf.pending)."""
    kept = {k: [float(x) for x in v] for k, v in metrics.items() if v and all(
        x is not None for x in v)}  # fmt: skip
    baseline = Baseline(
        test_id=test_id, key=key, metrics=kept, runs=json_safe(runs), accuracy=accuracy,
        provenance=Provenance.collect(reason or "refreshed (no reason given: --moeperf-reason)"),
    )  # fmt: skip
    if extra:
        baseline.extra.update(extra)
    baseline.to_json()  # a value JSON cannot hold fails here, in the test, not after it
    return baseline
