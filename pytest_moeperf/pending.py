"""A result's outcome, and a refreshed baseline, wait for the test's own body.

``moeperf.run()`` returns to the test body, and the body's asserts come after it: a baseline
written inside ``run()`` was stored, and results.json said "passed", for tests that then failed.
So ``run()`` only prepares its result (and the candidate file, on a refresh: ``defer``); the
plugin's makereport hook writes the file once the call phase passed (``settle``), or records the
test's real outcome and says in its table that the baseline was NOT written, and why. A result
with no file to write gets the body's outcome all the same.

Two refreshes of one test can run at once (two CI jobs on one checkout): the write is atomic
under the store's lock, and a refresh that finds the file changed since its own run started says
so in one line, naming the other run and which file stands (its own: it is the later write).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_moeperf.baseline import Baseline, BaselineStore
from pytest_moeperf.errors import UsageError
from pytest_moeperf.session import MoePerfSession, PerfResult

if TYPE_CHECKING:
    from pytest_moeperf.report.schema import BaselineEntry, ResultRecord


@dataclass
class PendingBaseline:
    """What ``run()`` prepared: the result record to finish and, on a refresh, the file."""

    result: PerfResult
    render: Callable[[ResultRecord], str]  # the result's terminal table, drawn again
    store: BaselineStore | None = None  # None: no file to write (not a refresh, or refused)
    baseline: Baseline | None = None
    seen: dict[str, str] = field(default_factory=dict)  # baseline files (name -> digest) then


PENDING_KEY = pytest.StashKey[list[PendingBaseline]]()


def snapshot(store: BaselineStore, test_id: str) -> dict[str, str]:
    """Name -> digest of every baseline file of ``test_id``, taken as its run starts."""
    folder = store.dir_for(test_id)
    found = {p.name: _digest(p) for p in folder.glob("*.json")} if folder.is_dir() else {}
    return {name: d for name, d in found.items() if d is not None}


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _baseline_block(p: PendingBaseline) -> BaselineEntry:
    """The record's baseline block, which every perf test's record has (``run()`` sets it)."""
    from pytest_moeperf.report.schema import BaselineEntry

    if p.result.data.baseline is None:
        p.result.data.baseline = BaselineEntry()
    return p.result.data.baseline


def defer(item: pytest.Item, pending: PendingBaseline) -> None:
    item.stash.setdefault(PENDING_KEY, []).append(pending)


def settle(item: pytest.Item, session: MoePerfSession, report: pytest.TestReport,
           excinfo: Any) -> None:  # fmt: skip
    """The call phase's report is made: write what ``run()`` prepared if the body passed."""
    pendings = item.stash.get(PENDING_KEY, None)
    if not pendings:
        return
    del item.stash[PENDING_KEY]
    for p in pendings:
        if report.passed and p.store is not None and p.baseline is not None:
            try:
                _write(p, p.store, p.baseline, session)
            except (UsageError, OSError) as exc:  # the refresh asked for a file: fail, say why
                report.outcome = "failed"
                report.longrepr = f"{item.nodeid}: baseline NOT written: {exc}"
                _not_written(item, p, session, f"it could not be written: {exc}", "failed")
        elif not report.passed:
            first = excinfo.exconly().strip().splitlines()[0] if excinfo else report.outcome
            did = "failed" if report.failed else "was skipped"
            why = f"the test {did} after moeperf.run() ({first})"
            if p.baseline is not None:
                _not_written(item, p, session, why, report.outcome)
            else:
                _body_outcome(item, p, why, report.outcome)
        p.result.table = p.render(p.result.data)
        session.notify(p.result)


def _write(p: PendingBaseline, store: BaselineStore, baseline: Baseline,
           session: MoePerfSession) -> None:  # fmt: skip
    notes: list[str] = []

    def check(path: Path) -> None:  # under the store's lock, before the rename
        now = _digest(path) if path.exists() else None
        if now != p.seen.get(path.name):
            notes.append(_changed(path, p.seen.get(path.name), now))

    path = store.write(baseline, complete=True, before_replace=check)
    block = _baseline_block(p)
    block.status, block.refresh = "written", f"written: {path}"
    for note in notes:
        block.concurrent = note
        session.warn(f"{p.result.nodeid}: baseline {note}")


def _changed(path: Path, before: str | None, now: str | None) -> str:
    """One line: another refresh wrote (or removed) the file while this run measured."""
    if now is None:
        return (f"{path} was removed since this run started; this run's file is written "
                "and stands")  # fmt: skip
    from pytest_moeperf.baseline import read_baseline_file

    try:
        prov = read_baseline_file(path).provenance
        who = (f"host {prov.host}, {prov.date}, commit {prov.commit}, reason "
               f"{prov.reason!r}")  # fmt: skip
    except UsageError:
        who = "an unreadable file"
    done = "wrote" if before is None else "rewrote"
    return (f"{path} changed since this run started: another run {done} it meanwhile ({who}); "
            "this run's file replaced it and stands (rerun the other refresh to keep its "
            "numbers instead)")  # fmt: skip


def _not_written(item: pytest.Item, p: PendingBaseline, session: MoePerfSession, why: str,
                 outcome: str) -> None:  # fmt: skip
    block = _baseline_block(p)
    block.status, block.refresh = "not-written", f"not-written: {why}"
    _body_outcome(item, p, why, outcome)
    session.warn(f"{p.result.nodeid}: baseline not-written: {why}")


def _body_outcome(item: pytest.Item, p: PendingBaseline, why: str, outcome: str) -> None:
    """The result says what the test said: a body that failed after a passing ``run()`` fails
    its result (a run that failed by itself already says why)."""
    if outcome == "passed" or p.result.outcome != "passed":
        return
    p.result.outcome = outcome
    p.result.reasons.append(why)
    item.user_properties[:] = [(k, outcome if k == "moeperf.outcome" else v)
                               for k, v in item.user_properties]  # fmt: skip
