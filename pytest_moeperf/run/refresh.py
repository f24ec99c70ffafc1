"""Whether a refresh may write its runs as the new baseline: nothing wrong becomes a baseline.

Apart from ``measure`` because this is the rule a reviewer of a baseline change reads: a
partial run, quick mode, a failed test (a regression included), a result that may be a
regression, an unfinished search, a run measured while the machine stalled, or too few runs
never replace a baseline that was good.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_moeperf.run.probe import RunMeasurement

if TYPE_CHECKING:
    from pytest_moeperf.verdict import Verdict


@dataclass(frozen=True)
class Refusal:
    """Why the runs are not written (None: they are), and a note to keep when they are."""

    why: str | None
    note: str | None = None


def why_not_written(*, runs: Sequence[RunMeasurement], planned_runs: int, quick: bool,
                    partial: str | None, reasons: Sequence[str], status: str,
                    path: str | None, had_runs: int,
                    verdicts: Sequence[Verdict] = ()) -> Refusal:  # fmt: skip
    """The first reason, in order, that these runs may not become the baseline.

    A failed test never overwrites a baseline, a regression included: to accept a slower
    result on purpose, remove the old file in the same commit, then refresh. ``status`` and
    ``path`` are the comparison's (``compared``: a baseline exists), ``had_runs`` how many runs
    the compared baseline had."""
    why = (
        partial
        or ("quick mode" if quick else None)
        or stalled_replacement(status, path, runs)
        or (("the test failed: " + "; ".join(reasons)) if reasons else None)
        or suspect_replacement(status, path, verdicts, had_runs)
        or (
            None
            if len(runs) == planned_runs and all(r.complete for r in runs)
            else "not every run completed with an SLO boundary"
        )
    )
    return Refusal(why) if why is not None else few_runs(status, path, len(runs), had_runs)


def few_runs(status: str, path: str | None, n: int, had: int) -> Refusal:
    """Fewer runs than a verdict needs: every comparison with such a baseline reads
    inconclusive. It never replaces a compared baseline that had enough (the gate would lose
    its teeth); otherwise it is written with a warning (a look, never a gate)."""
    from pytest_moeperf.verdict.stats import VerdictConfig

    need = VerdictConfig().min_runs
    if n >= need:
        return Refusal(None)
    few = f"{n} run{'s' * (n != 1)}, fewer than the {need} a verdict needs"
    if status == "compared" and had >= need:
        return Refusal(f"this run has {few}, so it does not replace the baseline it was "
                       f"compared with ({path}, {had} runs); refresh with --moeperf-runs "
                       f"{need} or more")  # fmt: skip
    return Refusal(None, f"this baseline has {few}: every comparison with it reads "
                         f"inconclusive until it is recorded with --moeperf-runs {need} or "
                         "more")  # fmt: skip


def stalled_replacement(status: str, path: str | None, runs: Sequence[Any]) -> str | None:
    """Why runs recorded while the machine stalled do not replace a compared baseline: their
    boundary and latencies move with the stalls (a slowed server then reads inconclusive,
    passes, and would become the baseline). A first baseline is written, with a warning."""
    from pytest_moeperf.verdict.server_cost import stalled_recording

    if status != "compared":
        return None
    stalled = stalled_recording([r.to_dict() for r in runs])
    if stalled is None:
        return None
    return (f"this run was {stalled.split(':')[0]}, so it does not replace the baseline "
            f"it was compared with ({path}); to accept it anyway, remove that file and "
            "refresh again")  # fmt: skip


def suspect_replacement(status: str, path: str | None, verdicts: Sequence[Verdict],
                        had_runs: int) -> str | None:  # fmt: skip
    """Why a result that may be a regression does not replace the baseline it was compared
    with: a gating verdict read *inconclusive* (the stall or calibration rules, or a wide band,
    kept it from reading regressed) while its candidate lies beyond the baseline's band on the
    worse side. Nightly CPU job, 2026-12-07: a server slowed 50 ms a step, judged against a
    baseline recorded while the machine stalled, read SLO goodput -82 % and p99 TPOT +215 %
    *inconclusive*, passed, and its refresh replaced the baseline. A weak baseline (fewer runs
    than a verdict needs) is left to ``few_runs``; an inconclusive change inside the band, or
    one for the better, is written as before."""
    from pytest_moeperf.verdict.stats import VerdictConfig

    if status != "compared" or had_runs < VerdictConfig().min_runs:
        return None
    worse = [v for v in verdicts if v.gating and v.outcome == "inconclusive" and (
        v.candidate_center < v.band[0] if v.direction == "higher"
        else v.candidate_center > v.band[1])]  # fmt: skip
    if not worse:
        return None
    shown = "; ".join(f"{v.metric} {100 * v.delta_rel:+.1f} % ({v.candidate_center:,.4g} "
                      f"{v.unit}, beyond the band {v.band[0]:,.4g} to {v.band[1]:,.4g})"
                      for v in worse)  # fmt: skip
    return (
        f"{shown} read inconclusive, worse than the baseline's runs: a result that may be a "
        f"regression does not replace the baseline it was compared with ({path}); measure "
        "again on a quiet machine, or, to accept it, remove that file and refresh again"
    )
