"""Machine hygiene, checked once per measurement after the server is up and before load.

Why: a perf number from a machine with a second job, a power cap or a throttling GPU is a wrong
number that looks right. These checks only read (NVML getters, /proc, /sys), record what they
found in the result, and turn what would spoil the numbers into one "noisy machine" warning.
They never fail a test: a check that cannot read something says "unknown" and why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from pytest_moeperf.hygiene.model import (
    NOISY_PREFIX,
    OK,
    UNKNOWN,
    WARN,
    HygieneCheck,
    HygieneReport,
)

__all__ = [
    "OK",
    "UNKNOWN",
    "WARN",
    "HygieneCheck",
    "HygieneReport",
    "check_before_load",
    "noisy_line",
    "run_checks",
]


class _Server(Protocol):
    @property
    def pgid(self) -> int | None: ...


def run_checks(
    *,
    gpu_indices: Sequence[int] | None = None,
    server_pgid: int | Sequence[int] | None = None,
    external: str | None = None,
    gpu_skip: str | None = None,
    sample_s: float = 1.0,
    root: Path = Path("/"),
    cores: int | None = None,
) -> HygieneReport:
    """Every check. ``server_pgid``: the server's process group (its processes are ours, not
    "other"). ``external``: the URL of a server this session did not start; when it points at
    a server on this machine, that server's processes count as the server's too."""
    from pytest_moeperf.hygiene import gpu, host

    table = host.process_table(root)
    me = os.getpid()
    pgids = [server_pgid] if isinstance(server_pgid, int) else list(server_pgid or ())
    server: set[int] = set()
    for pgid in pgids:  # an A/B gate runs two servers of its own side by side
        server |= host.descendants(table, host.group_members(table, pgid) | {pgid})
    notes = []
    target = host.local_server_for(table, external) if external else None
    if target is not None:  # an "external" server that runs here: judge it like our own
        lead = {target} | (
            host.group_members(table, target) if table[target].pgid == target else set()
        )
        server |= host.descendants(table, lead)
        notes.append(f"external server {external} is pid {target} on this machine")
    elif external:
        notes.append(
            f"remote server {external}: host checks are of the load generator's "
            "machine; GPU checks, if any, are of this machine's GPUs"
        )
    session = host.descendants(table, {me}) | server
    checks: list[HygieneCheck] = []
    server_pids = None if external and target is None else server | {me}
    checks += _guarded(
        "gpu", lambda: gpu.gpu_checks(gpu_indices, server_pids, table, skip=gpu_skip)
    )
    checks += _guarded("host.other_servers", lambda: [host.other_servers_check(table, session)])
    smp = host.sample(root, session, sample_s) if sample_s > 0 else None
    n = cores or _usable_cores()
    checks += _guarded("host.cpu_load", lambda: [host.cpu_load_check(root, n, smp)])
    checks += _guarded("host.cpu_governor", lambda: [host.governor_check(root)])
    checks += _guarded("host.memory", lambda: host.memory_checks(root, smp))
    return HygieneReport(checks, time.time(), 0.0 if smp is None else smp.seconds, notes)


def _servers(server: _Server | Sequence[_Server] | None) -> list[_Server]:
    if server is None:
        return []
    return list(server) if isinstance(server, Sequence) else [server]


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _guarded(name: str, fn: Any) -> list[HygieneCheck]:
    """A bug in one check is recorded as that check's "unknown", not a failed measurement."""
    try:
        out: list[HygieneCheck] = fn()
        return out
    except Exception as e:
        return [HygieneCheck(name, UNKNOWN, None, f"check failed: {type(e).__name__}: {e}")]


def noisy_line(report: HygieneReport) -> str | None:
    """The session warning for a noisy machine, or None when nothing would spoil the numbers."""
    if not report.noisy:
        return None
    return NOISY_PREFIX + "; ".join(report.noisy)


def check_before_load(
    server: _Server | Sequence[_Server] | None,
    gpu_indices: Sequence[int],
    *,
    backend: str,
    server_url: str | None = None,
    sample_s: float = 1.0,
) -> tuple[dict[str, Any], str | None]:
    """For ``PerfTest.run()``: (the result's "hygiene" block, the noisy-machine line or None).

    ``backend`` is the environment's ("cpu", "cuda", "external"): a CPU-backend server's GPUs
    are not checked, though NVML is still asked whether there are any.
    """
    skip = "server runs on the CPU backend: GPU checks skipped" if backend == "cpu" else None
    report = run_checks(
        gpu_indices=tuple(gpu_indices) or None,
        server_pgid=[p for s in _servers(server) if (p := s.pgid) is not None],
        external=server_url,
        gpu_skip=skip,
        sample_s=sample_s,
    )
    return report.to_dict(), noisy_line(report)
