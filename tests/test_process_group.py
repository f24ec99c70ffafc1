"""Process-group teardown, without vLLM: what keeps a CI runner free of orphan servers.

A real vLLM server is an API process plus an engine core plus workers. These tests stand the
same shape up with bash and sleep (a leader and its children in one new session) so every
teardown path runs in well under a second; ``tests/test_server_real.py`` and
``tests/test_faults_server.py`` do the same against the real server.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf.server import process
from pytest_moeperf.server.process import (
    ServerConfig,
    VllmServer,
    group_alive,
    live_server_pids,
    stop_all_servers,
)

#: A leader with two children, like the API server with its engine core and worker.
FAMILY = "sleep 300 & sleep 300 & wait"
#: The same, but every member ignores SIGTERM: only SIGKILL ends it.
STUBBORN = "trap '' TERM; (trap '' TERM; sleep 300) & sleep 300 & wait"


def _spawn(tmp_path: Path, script: str) -> VllmServer:
    """A VllmServer whose process is a bash family in its own session, registered as live."""
    server = VllmServer(ServerConfig(model="none", log_path=tmp_path / "server.log"))
    server.proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    process._LIVE[server.proc.pid] = server
    deadline = time.monotonic() + 5
    while len(_members(server.proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(_members(server.proc.pid)) >= 3, "the family did not start"
    return server


def _members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[list[VllmServer]]:
    """Servers a test spawns; whatever survives the test is killed here."""
    servers: list[VllmServer] = []
    yield servers
    for s in servers:
        assert s.proc is not None
        process._LIVE.pop(s.proc.pid, None)
        if group_alive(s.proc.pid):
            os.killpg(s.proc.pid, 9)
        s.proc.wait(timeout=5)


def test_stop_ends_the_whole_group_not_just_the_leader(
    tmp_path: Path, spawned: list[VllmServer]
) -> None:
    server = _spawn(tmp_path, FAMILY)
    spawned.append(server)
    assert server.proc is not None
    pgid = server.proc.pid
    server.stop(grace_s=2.0)
    assert _members(pgid) == [] and not group_alive(pgid)
    assert pgid not in live_server_pids()


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, spawned: list[VllmServer]
) -> None:
    server = _spawn(tmp_path, STUBBORN)
    spawned.append(server)
    assert server.proc is not None
    pgid = server.proc.pid
    t0 = time.monotonic()
    server.stop(grace_s=0.5)
    assert not group_alive(pgid), _members(pgid)
    assert time.monotonic() - t0 < 10  # the grace, then SIGKILL: never the 300 s of sleep


def test_stop_twice_and_stop_of_a_never_started_server_are_harmless(
    tmp_path: Path, spawned: list[VllmServer]
) -> None:
    VllmServer(ServerConfig(model="none")).stop()  # no process: nothing to do
    server = _spawn(tmp_path, FAMILY)
    spawned.append(server)
    server.stop(grace_s=2.0)
    server.stop(grace_s=2.0)  # the group is gone: no ProcessLookupError escapes


def test_stop_all_servers_keeps_the_ones_it_is_told_to(
    tmp_path: Path, spawned: list[VllmServer]
) -> None:
    """The nested-session rule at the process level: the outer session's server lives on."""
    session = live_server_pids()  # this test session's own servers (cpu_server): never touched
    outer = _spawn(tmp_path, FAMILY)
    spawned.append(outer)
    keep = live_server_pids()
    inner = _spawn(tmp_path, FAMILY)
    spawned.append(inner)
    assert outer.proc is not None and inner.proc is not None
    stop_all_servers(keep=keep)
    assert not group_alive(inner.proc.pid)
    assert group_alive(outer.proc.pid) and outer.proc.pid in live_server_pids()
    stop_all_servers(keep=session)
    assert not group_alive(outer.proc.pid) and live_server_pids() == session


def test_group_alive_ignores_our_own_zombie(tmp_path: Path) -> None:
    """A leader that exited but was not reaped yet is a zombie: the group is gone for us."""
    proc = subprocess.Popen(["true"], start_new_session=True)
    deadline = time.monotonic() + 5
    while _state(proc.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _state(proc.pid) == "Z"
    assert not group_alive(proc.pid)
    proc.wait(timeout=5)
    assert not group_alive(proc.pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
