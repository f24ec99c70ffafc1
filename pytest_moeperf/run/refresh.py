"""Whether a refresh may write its runs as the new baseline: nothing wrong becomes a baseline.

Apart from ``measure`` because this is the rule a reviewer of a baseline change reads: a
partial run, quick mode, a failed test (a regression included), an unfinished search, a run
measured while the machine stalled, or too few runs never replace a baseline that was good.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_moeperf.run.probe import RunMeasurement


@dataclass(frozen=True)
class Refusal:
    """Why the runs are not written (None: they are), and a note to keep when they are."""

    why: str | None
    note: str | None = None


def why_not_written(*, runs: Sequence[RunMeasurement], planned_runs: int, quick: bool,
                    partial: str | None, reasons: Sequence[str], status: str,
                    path: str | None, had_runs: int) -> Refusal:  # fmt: skip
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
