"""The machine each run had (hygiene/machine.py) and the verdicts it explains
(verdict/machine_drift.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.hygiene.machine import MachineDuring, MachineWatch, Ticks, read_ticks
from pytest_moeperf.verdict import judge_all
from pytest_moeperf.verdict.machine_drift import (
    EXPLAINS,
    TOLERANCE,
    RunShares,
    drift_note,
    drifted_verdicts,
    from_run,
    machine_ratio,
)
from pytest_moeperf.verdict.server_cost import confounded

# -- reading the machine ----------------------------------------------------------------------


def _proc(root: Path, cpu: tuple[int, ...], procs: dict[int, tuple[int, int, int]]) -> None:
    """A fake /proc: the cpu line and processes pid -> (ppid, utime+stime, cutime)."""
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + " 0 0\ncpu0 1\n")
    for pid, (ppid, ticks, child) in procs.items():
        d = root / "proc" / str(pid)
        d.mkdir(exist_ok=True)
        fields = ["S", str(ppid), str(pid)] + ["0"] * 8 + [str(ticks), "0", str(child), "0"]
        (d / "stat").write_text(f"{pid} (python) " + " ".join(fields + ["0"] * 10))
        (d / "cmdline").write_bytes(b"python\0")


def test_ticks_split_steal_ours_and_the_rest(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal
    _proc(tmp_path, (100, 0, 20, 500, 0, 0, 0, 30),
          {10: (1, 40, 5), 11: (10, 30, 0), 99: (1, 50, 0)})  # fmt: skip
    t = read_ticks(tmp_path, pid=10)
    # ours: pid 10 and its child 11 (70) plus 10's reaped children (5); 99 is another's
    assert t == Ticks(busy=120, steal=30, total=650, ours=75)
    assert read_ticks(tmp_path / "nothing", pid=10) is None


def test_a_watch_reads_the_shares_over_the_run(tmp_path: Path) -> None:
    _proc(tmp_path, (100, 0, 0, 100, 0, 0, 0, 0), {10: (1, 50, 0)})
    watch = MachineWatch(root=tmp_path, pid=10)
    assert watch.stop() is None  # not started
    watch.start()
    # over the run: 200 ticks in all, 40 of them steal, 120 busy of which ours 60
    _proc(tmp_path, (220, 0, 0, 140, 0, 0, 0, 40), {10: (1, 110, 0)})
    got = watch.stop()
    assert got is not None
    assert got.steal == pytest.approx(40 / 200)
    assert got.others == pytest.approx((120 - 60) / 200)
    assert got.left == pytest.approx(0.5)
    assert got.text() == "steal 20 %, other processes 30 % of the CPUs"
    assert watch.stop() is None  # once


def test_a_watch_without_proc_reads_nothing(tmp_path: Path) -> None:
    watch = MachineWatch(root=tmp_path)
    watch.start()
    assert watch.stop() is None


def test_the_real_machine_is_read() -> None:
    """This process burns CPU between start and stop: ours, so not another's."""
    watch = MachineWatch()
    watch.start()
    x = 0
    for i in range(3_000_000):
        x += i
    got = watch.stop()
    if got is None:
        pytest.skip("no /proc/stat here")
    assert 0 <= got.steal <= 1 and 0 <= got.others <= 1 and got.seconds > 0


def test_a_recorded_run_reads_back_and_rejects_nonsense() -> None:
    m = MachineDuring(0.0, 0.02, 30.0)
    assert from_run({"machine": m.to_dict()}) == RunShares(0.0, 0.02)
    assert from_run({}) is None
    assert from_run({"machine": {"steal": "none", "others": 0.1}}) is None
    assert from_run({"machine": {"steal": 0.1, "others": 1.5}}) is None  # a share above 1
    assert from_run({"machine": {"steal": True, "others": 0.1}}) is None
    assert from_run({"machine": {"steal": 0, "others": 0, "seconds": -3}}) == RunShares(0, 0)


# -- verdicts ---------------------------------------------------------------------------------


def _runs(others: float = 0.0, steal: float = 0.0, n: int = 3) -> list[dict[str, Any]]:
    return [{"machine": MachineDuring(steal, others, 40.0).to_dict()} for _ in range(n)]


# The tutorial's A/A comparison that failed official CI on 2026-12-06 (same code, minutes apart):
# p99 TPOT 8.5 -> 12.6 ms "regressed", p = 0.007, SLO goodput -18.5 % inconclusive.
BASE = {"tpot_p99_ms": [8.0, 8.5, 9.0], "slo_goodput_tok_s": [2000.0, 2050.0, 2100.0]}
SLOW = {"tpot_p99_ms": [12.2, 12.6, 13.0], "slo_goodput_tok_s": [1640.0, 1670.0, 1690.0]}


def _judged() -> list[Any]:
    return judge_all(BASE, SLOW, source="test")


def test_without_machine_figures_the_verdicts_stand() -> None:
    verdicts = _judged()
    assert {v.metric: v.outcome for v in verdicts}["tpot_p99_ms"] == "regressed"
    assert drifted_verdicts(verdicts, [{}] * 3, _runs(0.5)) == verdicts  # an older baseline
    assert machine_ratio([{}], _runs(0.5)) is None
    assert machine_ratio([*_runs(), {}], _runs(0.5)) is None  # one run without: not compared


def test_a_machine_with_less_cpu_makes_a_regression_it_explains_inconclusive() -> None:
    verdicts = _judged()
    out = {v.metric: v for v in drifted_verdicts(verdicts, _runs(0.02), _runs(0.35))}
    tpot = out["tpot_p99_ms"]
    assert tpot.outcome == "inconclusive"
    assert "the machine left this run 34 % less of its CPUs than the baseline's runs" in tpot.reason
    assert "this run: steal 0 %, other processes 35 %" in tpot.reason
    assert "baseline: steal 0 %, other processes 2 %" in tpot.reason
    assert "A/B gate" in tpot.advice
    assert not tpot.fails


def test_a_regression_far_beyond_the_machines_change_stands() -> None:
    much = {"tpot_p99_ms": [80.0, 85.0, 90.0], "slo_goodput_tok_s": [300.0, 310.0, 320.0]}
    verdicts = judge_all(BASE, much, source="test")
    assert all(v.outcome == "regressed" for v in verdicts)
    assert math.log(10) > EXPLAINS * abs(math.log(0.65))  # +900 % is beyond what -35 % explains
    assert drifted_verdicts(verdicts, _runs(0.0), _runs(0.35)) == verdicts


def test_steal_counts_as_less_cpu() -> None:
    out = drifted_verdicts(_judged(), _runs(0.0), _runs(0.1, steal=0.2))
    tpot = next(v for v in out if v.metric == "tpot_p99_ms")
    assert tpot.outcome == "inconclusive"
    assert "steal 20 %, other processes 10 %" in tpot.reason


def test_a_machine_within_tolerance_changes_nothing() -> None:
    verdicts = _judged()
    inside = 1 - 1 / (1 + TOLERANCE) - 0.005  # just short of the tolerance
    assert drifted_verdicts(verdicts, _runs(0.0), _runs(inside)) == verdicts
    assert drift_note(_runs(0.0), _runs(inside)) is None


def test_a_busier_baseline_makes_small_improvements_inconclusive_not_regressions() -> None:
    improved = judge_all(SLOW, BASE, source="test")  # the mirror: candidate better
    assert {v.outcome for v in improved} >= {"improved"}
    out = drifted_verdicts(improved, _runs(0.4), _runs(0.0))
    tpot = next(v for v in out if v.metric == "tpot_p99_ms")
    assert tpot.outcome == "inconclusive" and "67 % more of its CPUs" in tpot.reason
    # a regression on a machine that left more of its CPUs is only more certain: it stands
    regressed = _judged()
    assert drifted_verdicts(regressed, _runs(0.4), _runs(0.0)) == regressed


def test_the_note_names_both_sides_and_the_gate_chain_applies_the_rule() -> None:
    note = drift_note(_runs(0.0), _runs(0.4))
    assert note is not None and note.startswith("the machine left this run 40 % less of its CPUs")
    assert "other processes 40 %" in note and f"x{1 + TOLERANCE:g}" in note
    chained = confounded(_judged(), _runs(0.0), _runs(0.4))
    assert not any(v.fails for v in chained)
