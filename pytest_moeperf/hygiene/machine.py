"""How much of the machine a run had: the CPU time it lost to steal and to other processes.

Why: a baseline and the run compared with it are measured minutes or days apart, and the
machine can change in between without a line of code changing: a compile job beside a
developer's run, a CI runner sharing the host, a cloud neighbour taking the hypervisor's time.
The session's calibration (``baseline/calibration.py``) cannot see that: it is read once,
before the server starts, and its best-of-many is the machine's own speed, on purpose blind
to contention. So each run records, from /proc/stat and the process table at its start and
end, two shares of all CPU time over the run:

- ``steal``: the time the hypervisor gave to other guests (exact where it reports steal);
- ``others``: the busy time of processes that are not this run's (not this pytest process
  or anything it started: the server, its engine, the load workers).

Neither reads the code under test (vLLM, the kernels, the config files), so a real regression
stays one. What was tried and left out: a pure-Python loop sampled through the run, as a
reading of the CPU's own speed. On the 2-vCPU CI VM, idle, one vCPU's loop speed flipped
between ~7.5 and ~13 M steps/s every few seconds with no steal reported, and under load it
read our own server's work (even at nice -20, as two vCPUs sharing one host core would): it
cannot tell a slower machine from a slower server. ``verdict/machine_drift.py`` compares the
two sides' shares. On a machine without /proc the shares are None and nothing is compared.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Ticks:
    """One reading of the CPU clock ticks: all CPUs' busy, steal and total, and this run's."""

    busy: int
    steal: int
    total: int
    ours: int


def read_ticks(root: Path = Path("/"), pid: int | None = None) -> Ticks | None:
    """The machine's and this process tree's CPU ticks; None where /proc cannot say."""
    from pytest_moeperf.hygiene.host import descendants, process_table, read_text

    line = (read_text(root / "proc" / "stat") or "").split("\n", 1)[0].split()
    if len(line) < 9 or line[0] != "cpu":
        return None
    try:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in line[1:9])
    except ValueError:
        return None
    busy = user + nice + system + irq + softirq  # steal is counted apart, idle and iowait not
    total = busy + idle + iowait + steal
    me = os.getpid() if pid is None else pid
    table = process_table(root)
    ours = sum(table[p].cpu_ticks for p in descendants(table, [me]) if p in table)
    if me in table:  # children that ended during the run count too
        ours += table[me].child_ticks
    return Ticks(busy, steal, total, ours)


@dataclass(frozen=True)
class MachineDuring:
    """The CPU time one run lost, as shares of all CPU time over the run (0..1)."""

    steal: float
    others: float  # busy time of processes not this run's
    seconds: float

    @property
    def left(self) -> float:
        """The share of the CPUs neither the hypervisor nor other processes took."""
        return max(0.0, 1.0 - self.steal - self.others)

    def to_dict(self) -> dict[str, Any]:
        return {"steal": self.steal, "others": self.others, "seconds": self.seconds}

    def text(self) -> str:
        """ "steal 0 %, other processes 3 % of the CPUs" """
        return f"steal {100 * self.steal:.0f} %, other processes {100 * self.others:.0f} % " \
               "of the CPUs"  # fmt: skip


class MachineWatch:
    """The CPU ticks at a run's start and end."""

    def __init__(self, root: Path = Path("/"), clock: Callable[[], float] = time.monotonic,
                 pid: int | None = None) -> None:  # fmt: skip
        """``pid``: the process whose tree is this run's (default: this one)."""
        self.root, self.clock, self.pid = root, clock, pid
        self._start: tuple[float, Ticks | None] | None = None

    def start(self) -> None:
        self._start = (self.clock(), read_ticks(self.root, self.pid))

    def stop(self) -> MachineDuring | None:
        """The run's shares; None before ``start`` or where /proc could not be read."""
        if self._start is None:
            return None
        t0, before = self._start
        self._start = None
        after = read_ticks(self.root, self.pid)
        if before is None or after is None or after.total <= before.total:
            return None
        total = after.total - before.total
        busy = (after.busy - before.busy) - max(0, after.ours - before.ours)
        return MachineDuring(steal=max(0.0, (after.steal - before.steal) / total),
                             others=min(1.0, max(0.0, busy / total)),
                             seconds=self.clock() - t0)  # fmt: skip
