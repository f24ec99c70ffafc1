"""Verdicts that the machine itself explains: one side's runs had less of the CPUs.

Every run records the shares of all CPU time it lost to steal and to other processes
(``hygiene/machine.py``); what is left, ``1 - steal - others``, is the run's *capacity*, and a
side's is the geometric mean over its runs. When the candidate's capacity is below the
baseline's by more than ``TOLERANCE``, a *regressed* verdict whose change is no more than
``EXPLAINS`` times the machine's loss (in log terms) is reported inconclusive with both sides'
figures: the same code given a quarter less of the CPUs is slower, and the verdict cannot say
which of the two moved. A larger change keeps its verdict, and so does an *improved* one (it
came despite the machine). The mirror case, a baseline recorded on a busier machine, makes
small *improved* verdicts inconclusive. A baseline recorded before these figures existed (no
``machine`` in its runs) is judged as before.

The session's calibration (``baseline/calibration.py``) says the same of the whole machine:
where its host figures moved beyond x1.5 from the baseline's (but not x2, another machine),
``speed_verdicts`` reads inconclusive every verdict that speed change explains, *unchanged*
ones too: a machine 1.6x slower can hide a real change as well as fake one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

#: Capacity ratio beyond which the two sides did not have the same machine (x1.15 either way):
#: other processes or steal taking 13 % or more of the CPUs on one side than on the other.
TOLERANCE = 0.15
#: A change up to this many times the machine's own change (log ratio) is one it explains:
#: near the SLO boundary, p99 latency answers a capacity loss with a larger rise (queueing).
EXPLAINS = 3.0


@dataclass(frozen=True)
class RunShares:
    """One run's ``machine`` record (written by ``hygiene/machine.py``)."""

    steal: float
    others: float

    @property
    def left(self) -> float:
        return max(0.0, 1.0 - self.steal - self.others)


def from_run(run: Mapping[str, Any]) -> RunShares | None:
    """A recorded run's shares (``search_runs`` entries, baseline runs); None if absent or
    not two shares in 0..1 (written by hand, or broken: not evidence of anything)."""
    m = run.get("machine")
    if not isinstance(m, Mapping):
        return None
    got = [m.get(k) for k in ("steal", "others")]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1
               for v in got):  # fmt: skip
        return None
    return RunShares(float(got[0]), float(got[1]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class SideMachine:
    """One side's runs' shares, summarized."""

    capacity: float  # geometric mean over the runs of 1 - steal - others
    steal: float  # mean share
    others: float  # mean share

    def text(self) -> str:
        return f"steal {100 * self.steal:.0f} %, other processes {100 * self.others:.0f} %"


def side_machine(runs: Sequence[Mapping[str, Any]]) -> SideMachine | None:
    """The side's shares; None unless every run recorded them (an older baseline)."""
    got = [from_run(r) for r in runs]
    if not got or any(m is None for m in got):
        return None
    ms = [m for m in got if m is not None]
    caps = [max(m.left, 0.01) for m in ms]
    cap = math.exp(math.fsum(math.log(x) for x in caps) / len(caps))
    return SideMachine(cap, math.fsum(m.steal for m in ms) / len(ms),
                       math.fsum(m.others for m in ms) / len(ms))  # fmt: skip


def machine_ratio(baseline_runs: Sequence[Mapping[str, Any]],
                  candidate_runs: Sequence[Mapping[str, Any]],
                  ) -> tuple[float, SideMachine, SideMachine] | None:  # fmt: skip
    """(candidate capacity / baseline capacity, both sides), or None where a side lacks them."""
    b, c = side_machine(baseline_runs), side_machine(candidate_runs)
    if b is None or c is None:
        return None
    return c.capacity / b.capacity, b, c


def _beyond(baseline_runs: Sequence[Mapping[str, Any]],
            candidate_runs: Sequence[Mapping[str, Any]],
            ) -> tuple[float, str, str] | None:  # fmt: skip
    """(capacity ratio, "the machine left this run ...", "this run: ...; baseline: ...") when
    the sides differ beyond ``TOLERANCE``; None when they do not, or a side lacks figures."""
    got = machine_ratio(baseline_runs, candidate_runs)
    if got is None or abs(math.log(got[0])) <= math.log1p(TOLERANCE):
        return None
    ratio, b, c = got
    more = "more" if ratio > 1 else "less"
    said = (f"the machine left this run {100 * abs(ratio - 1):.0f} % {more} of its CPUs than "
            "the baseline's runs had")  # fmt: skip
    return ratio, said, f"this run: {c.text()}; baseline: {b.text()}"


def drift_note(baseline_runs: Sequence[Mapping[str, Any]],
               candidate_runs: Sequence[Mapping[str, Any]]) -> str | None:  # fmt: skip
    """One line when the two sides had different machines (beyond ``TOLERANCE``), else None."""
    got = _beyond(baseline_runs, candidate_runs)
    if got is None:
        return None
    _, said, sides = got
    return (f"{said} ({sides}; tolerance x{1 + TOLERANCE:g}): changes of the size this "
            "explains read inconclusive")  # fmt: skip


def drifted_verdicts(verdicts: Sequence[Any], baseline_runs: Sequence[Mapping[str, Any]],
                     candidate_runs: Sequence[Mapping[str, Any]]) -> list[Any]:  # fmt: skip
    """Verdicts the machine's own change explains, made inconclusive with both figures."""
    got = _beyond(baseline_runs, candidate_runs)
    if got is None:
        return list(verdicts)
    ratio, said, sides = got
    slower = ratio < 1
    reach = EXPLAINS * abs(math.log(ratio))
    why = f"{said} ({sides}), which explains a change this size"
    advice = ("measure both on a quiet machine, or compare interleaved (the A/B gate: "
              "docs/ab-gate.md), where both sides share the machine's drift")  # fmt: skip
    hit = "regressed" if slower else "improved"
    return _explained(verdicts, (hit,), reach, why, advice)


def _explained(verdicts: Sequence[Any], outcomes: tuple[str, ...], reach: float, why: str,
               advice: str) -> list[Any]:  # fmt: skip
    """``verdicts`` with each one of ``outcomes`` whose change is within ``reach`` (log ratio
    of the centres) made inconclusive, ``why`` added to its reason."""
    out = []
    for v in verdicts:
        moved = v.candidate_center / v.baseline_center if v.baseline_center > 0 else math.nan
        if v.outcome in outcomes and moved > 0 and abs(math.log(moved)) <= reach:
            v = replace(v, outcome="inconclusive", reason=f"{v.reason}; but {why}",
                        advice=advice)  # fmt: skip
        out.append(v)
    return out


def speed_note(speed: tuple[float, str] | None, span: str) -> str | None:
    """One line when the session's calibration moved beyond its drift tolerance, else None;
    ``span`` says how far that is (``baseline.calibration.DRIFT_SPAN``)."""
    if speed is None:
        return None
    return (f"this machine's calibration moved since the baseline ({speed[1]}, here vs "
            f"baseline; {span}): the same machine running slower or faster (a "
            "neighbour on its cores) or a similar machine; changes of the size this explains "
            "read inconclusive")  # fmt: skip


def speed_verdicts(verdicts: Sequence[Any], speed: tuple[float, str] | None) -> list[Any]:
    """Verdicts a calibration change of ``speed`` (here / baseline, text) explains, made
    inconclusive: the loss's direction (regressed on a slower machine, improved on a faster
    one) and *unchanged*, within ``EXPLAINS`` times the change in log terms."""
    if speed is None:
        return list(verdicts)
    ratio, said = speed
    reach = EXPLAINS * abs(math.log(ratio))
    hit = "regressed" if ratio < 1 else "improved"
    why = (f"the machine's calibration ran {100 * abs(ratio - 1):.0f} % "
           f"{'slower' if ratio < 1 else 'faster'} than at the baseline ({said}), which "
           "explains a change this size")  # fmt: skip
    advice = ("compare on the machine in the baseline's state (a quiet one), or interleaved "
              "(the A/B gate: docs/ab-gate.md), where both sides share the machine")  # fmt: skip
    return _explained(verdicts, (hit, "unchanged"), reach, why, advice)
