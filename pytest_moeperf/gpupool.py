"""GPU pool for pytest-xdist: every server leases a disjoint set of GPUs through file locks.

Why file locks: xdist workers are separate processes with nothing shared but the disk.
``fcntl.flock`` on one lock file per GPU, in a folder every worker sees, is atomic, needs no
daemon, and the kernel drops it when a worker dies: a crashed worker never strands a GPU.

Protocol (all locks are taken without blocking, polled until the lease deadline):

- ``acquire.lock`` is held while one lease is being assembled, *including while it waits* for
  busy GPUs. Nobody else starts taking GPUs meanwhile, so a large lease (an exclusive test that
  needs every GPU) is not starved by small ones, and since releasing never takes it, the holders
  it waits for can always finish. A process that already holds a lease (a test starting its
  second server) does not queue: the waiting lease may be waiting for exactly that test to end.
- ``node.lock``: every lease holds it shared, an exclusive lease holds it exclusively. So an
  exclusive test also serialises against servers that use no GPU (the CPU servers here).
- ``gpu-<id>.lock``: holding it exclusively owns that GPU. The holder writes pid, xdist worker
  and test into it, so a lease that times out says who holds what.

Inside one process, leases taken while an exclusive lease is held are carved out of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pytest_moeperf.errors import MoePerfError, UsageError

if TYPE_CHECKING:
    import pytest

POLL_S = 0.1
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")


class GpuLeaseTimeout(MoePerfError):
    """Waited the whole ``--moeperf-gpu-wait`` for GPUs other workers still hold."""


class MoePerfExclusiveNotice(UserWarning):
    """A ``moeperf_exclusive`` test holds the whole node: other workers' servers wait for it."""


@dataclass(frozen=True)
class Universe:
    """The GPUs the pool hands out, as CUDA_VISIBLE_DEVICES entries, and where they came from."""

    devices: tuple[str, ...]
    source: str


def parse_devices(text: str, source: str) -> tuple[str, ...]:
    """'0,1,2' or 'GPU-<uuid>,...' -> entries; one clear error for anything else."""
    parts = [p.strip() for p in text.split(",")]
    fix = "give GPU indices or UUIDs separated by commas, e.g. --moeperf-gpus 0,1,2,3"
    for p in parts:
        if not (p.isdigit() or _UUID_RE.match(p)):
            raise UsageError(source, "GPU list", text, f"entry {p!r} is not a GPU index or UUID",
                             fix)  # fmt: skip
    dupes = sorted({p for p in parts if parts.count(p) > 1})
    if dupes:
        raise UsageError(source, "GPU list", text, f"{', '.join(dupes)} listed twice",
                         "name each GPU once")  # fmt: skip
    return tuple(parts)


def discover_universe(option: str | None, option_source: str) -> Universe:
    """The option's list, else an existing CUDA_VISIBLE_DEVICES, else every GPU NVML sees."""
    if option is not None:
        return Universe(parse_devices(option, option_source), option_source)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        src = "environment variable CUDA_VISIBLE_DEVICES"
        if visible.strip() in ("", "-1"):
            return Universe((), src + " (empty: no GPU)")
        return Universe(parse_devices(visible, src), src)
    from pytest_moeperf.metrics.hardware import visible_gpus

    gpus = visible_gpus()
    return Universe(tuple(str(g.index) for g in gpus), "NVML" if gpus else "NVML (no GPU)")


@dataclass
class GpuLease:
    """GPUs one server owns until ``release()``; ``env`` is what its process gets."""

    devices: tuple[str, ...]
    exclusive: bool = False
    waited_s: float = 0.0
    _release: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """CUDA_VISIBLE_DEVICES for the server; PCI bus order so indices are NVML's too."""
        if not self.devices:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> GpuLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Locks:
    """Open lock files of one lease; closing a file drops its flock."""

    def __init__(self) -> None:
        self.files: list[IO[str]] = []

    def try_lock(self, path: Path, *, shared: bool = False, note: str | None = None) -> bool:
        f = open(path, "a+")  # noqa: SIM115 - kept open: the lock lives as long as the file
        try:
            fcntl.flock(f, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        if note is not None:
            f.seek(0)
            f.truncate()
            f.write(note)
            f.flush()
        self.files.append(f)
        return True

    def close(self) -> None:
        for f in reversed(self.files):
            f.close()
        self.files.clear()


class GpuPool:
    """One per pytest process; all processes with the same ``lock_dir`` share the GPUs."""

    def __init__(self, universe: Callable[[], Universe], lock_dir: Path, wait_s: float,
                 wait_source: str = "default") -> None:  # fmt: skip
        self._universe_fn = universe
        self._universe: Universe | None = None
        self.lock_dir = lock_dir
        self.wait_s = wait_s
        self.wait_source = wait_source
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self._held: list[str] = []  # GPUs this process holds through its own locks
        self._open: list[_Locks] = []  # lock files of the leases not yet released
        self._exclusive: GpuLease | None = None
        self._carved: list[str] = []  # GPUs of the exclusive lease given to servers

    @property
    def universe(self) -> Universe:
        if self._universe is None:
            self._universe = self._universe_fn()
        return self._universe

    def _path(self, name: str) -> Path:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        return self.lock_dir / name

    def _gpu_path(self, device: str) -> Path:
        return self._path("gpu-" + re.sub(r"[^A-Za-z0-9_.-]", "_", device) + ".lock")

    def _note(self, who: str) -> str:
        return f"pid {os.getpid()} worker {self.worker} test {who} since {time.strftime('%X')}"

    def holders(self) -> str:
        """Who holds which GPU, read from the lock files (for error messages)."""
        out = []
        for d in self.universe.devices:
            p = self._gpu_path(d)
            probe = _Locks()
            with contextlib.suppress(OSError):
                text = p.read_text().strip()
                if text and not probe.try_lock(p):  # still held
                    out.append(f"GPU {d}: {text}")
            probe.close()
        return "; ".join(out) or "nobody now (freed just at the deadline)"

    # -- leasing -------------------------------------------------------------------------------
    def lease(self, n: int, who: str, purpose: str = "") -> GpuLease:
        """``n`` GPUs no other lease holds, waiting up to ``wait_s``; ``n == 0`` takes none."""
        devices = self.universe.devices
        if not devices:
            n = 0  # no GPU here (a CPU server): nothing to hand out, the node lock still applies
        if self._exclusive is not None:
            return self._carve(n, who, purpose)
        mine = len(self._held)
        if n > len(devices) - mine:
            held = f"; this test already holds {mine} for another server" if mine else ""
            raise UsageError(f"test {who}", "GPUs needed", n,
                             f"the server needs {n} GPUs{_paren(purpose)} but the pool has "
                             f"{len(devices)}: [{','.join(devices)}] from "
                             f"{self.universe.source}{held}",
                             "run it on a node with more GPUs, lower the spec's parallelism, "
                             "or widen the pool with --moeperf-gpus / CUDA_VISIBLE_DEVICES"
                             )  # fmt: skip
        return self._acquire(n, who, exclusive=False)

    def exclusive(self, who: str) -> GpuLease:
        """Every GPU and the node, for a test whose measurement must not share the node."""
        if self._open or self._exclusive is not None:
            raise UsageError(f"test {who}", "moeperf_exclusive", True,
                             "this process already holds a lease from the pool",
                             "take the exclusive lease before starting any server")  # fmt: skip
        lease = self._acquire(len(self.universe.devices), who, exclusive=True)
        self._exclusive, self._carved = lease, []
        inner = lease._release

        def release() -> None:
            self._exclusive, self._carved = None, []
            if inner is not None:
                inner()

        lease._release = release
        return lease

    def _carve(self, n: int, who: str, purpose: str) -> GpuLease:
        assert self._exclusive is not None
        free = [d for d in self._exclusive.devices if d not in self._carved]
        if n > len(free):
            raise UsageError(f"test {who}", "GPUs needed", n,
                             f"the server needs {n} GPUs{_paren(purpose)} but only {len(free)} "
                             f"of the exclusive lease [{','.join(self._exclusive.devices)}] "
                             "are still free",
                             "stop a server of this test first, or lower the parallelism"
                             )  # fmt: skip
        got = tuple(free[:n])
        self._carved.extend(got)

        def release() -> None:
            self._carved = [d for d in self._carved if d not in got]

        return GpuLease(got, _release=release)

    def _acquire(self, n: int, who: str, *, exclusive: bool) -> GpuLease:
        t0 = time.monotonic()
        deadline = t0 + self.wait_s
        gate = _Locks()
        # A process that already holds a lease (the second server of an A/B test) skips the
        # queue: a waiting exclusive lease needs that process to finish, not to queue behind it.
        while not (self._open and not exclusive) and not gate.try_lock(
            self._path("acquire.lock"), note=self._note(who)
        ):
            self._wait_or_fail(deadline, n, who, "another worker is assembling its lease")
        locks = _Locks()
        got: list[str] = []
        try:
            while not locks.try_lock(self._path("node.lock"), shared=not exclusive):
                self._wait_or_fail(deadline, n, who, "a moeperf_exclusive test holds the node"
                                   if not exclusive else "other servers are running")  # fmt: skip
            while len(got) < n:
                for d in self.universe.devices:
                    if len(got) == n or d in got or d in self._held:
                        continue
                    if locks.try_lock(self._gpu_path(d), note=self._note(who)):
                        got.append(d)
                if len(got) < n:
                    self._wait_or_fail(deadline, n, who, f"{n - len(got)} more GPUs are busy")
        except BaseException:
            locks.close()
            raise
        finally:
            gate.close()
        self._held.extend(got)
        self._open.append(locks)  # a dropped lease object must not free its GPUs
        kept = tuple(got)

        def release() -> None:
            locks.close()
            self._open.remove(locks)
            self._held = [d for d in self._held if d not in kept]

        return GpuLease(kept, exclusive, time.monotonic() - t0, release)

    def _wait_or_fail(self, deadline: float, n: int, who: str, why: str) -> None:
        if time.monotonic() >= deadline:
            raise GpuLeaseTimeout(
                f"test {who}: no lease of {n} GPUs from [{','.join(self.universe.devices)}] "
                f"({self.universe.source}) after waiting {self.wait_s:g} s ({why}); held by: "
                f"{self.holders()}. Fix: raise --moeperf-gpu-wait (now {self.wait_s:g} s from "
                f"{self.wait_source}) or run fewer xdist workers (-n)"
            )
        time.sleep(POLL_S)


def _paren(text: str) -> str:
    return f" ({text})" if text else ""


# -- what a server asks for ----------------------------------------------------------------------
_SIZE_FLAGS = {
    "--tensor-parallel-size": "tensor", "-tp": "tensor",
    "--pipeline-parallel-size": "pipeline", "-pp": "pipeline",
    "--data-parallel-size": "data", "-dp": "data",
    "--data-parallel-size-local": "data_local", "-dpl": "data_local",
}  # fmt: skip


def gpus_from_args(args: list[str], env: Mapping[str, str]) -> tuple[int, str]:
    """(GPUs this node gives the server, why) from vLLM's own flags; the last value wins.

    tensor x pipeline x data, with ``--data-parallel-size-local`` for the ranks on this node.
    A Ray cluster (``--distributed-executor-backend ray`` and a RAY_ADDRESS) places the
    workers itself: nothing is leased here.
    """
    sizes = {"tensor": 1, "pipeline": 1, "data": 1}
    backend = None
    for i, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")  # vLLM accepts either spelling
        value = inline or (args[i + 1] if i + 1 < len(args) else "")
        if flag in _SIZE_FLAGS and value.isdigit():
            sizes[_SIZE_FLAGS[flag]] = int(value)
        elif flag == "--distributed-executor-backend":
            backend = value
    if backend == "ray" and (env.get("RAY_ADDRESS") or os.environ.get("RAY_ADDRESS")):
        return 0, "GPUs placed by the Ray cluster at RAY_ADDRESS"
    data = sizes.get("data_local", sizes["data"])
    why = f"tensor {sizes['tensor']} x pipeline {sizes['pipeline']} x data {data}"
    return sizes["tensor"] * sizes["pipeline"] * data, why


# -- CUDA_VISIBLE_DEVICES entries -> NVML indices -------------------------------------------------
def nvml_indices(devices: tuple[str, ...], uuids: Mapping[int, str | None]) -> tuple[int, ...]:
    """NVML indices of CUDA_VISIBLE_DEVICES entries, for the energy meter and MBU.

    NVML always counts in PCI bus order; CUDA does too under CUDA_DEVICE_ORDER=PCI_BUS_ID, which
    every leased server gets, so an index entry is the NVML index (vLLM assumes the same). A UUID
    entry (or a unique prefix of one, as CUDA accepts) is looked up. A MIG instance is left out:
    NVML's energy counter is the whole board's, shared with other instances.
    """
    out: list[int] = []
    for d in devices:
        if d.isdigit():
            out.append(int(d))
        elif d.startswith("GPU-"):
            hits = [i for i, u in uuids.items() if u and u.startswith(d)]
            if len(hits) == 1:
                out.append(hits[0])
    return tuple(out)


def take_exclusive(pool: GpuPool, who: str) -> GpuLease:
    """The ``moeperf_exclusive`` lease of one test, with a notice that it serialises the run."""
    lease = pool.exclusive(who)
    if pool.worker != "main":
        warnings.warn(MoePerfExclusiveNotice(
            f"{who} is marked moeperf_exclusive: it holds all {len(lease.devices)} GPUs and the "
            f"node while it runs (it waited {lease.waited_s:.1f} s for them); the other xdist "
            "workers' servers wait meanwhile, so this part of the run is serialised"),
            stacklevel=2)  # fmt: skip
    return lease


# -- pytest side -----------------------------------------------------------------------------------
class TestGpus:
    """What the ``moeperf_gpus`` fixture gives a test: its pool, leases released at teardown."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, pool: GpuPool, who: str) -> None:
        self.pool = pool
        self.who = who
        self.exclusive_lease: GpuLease | None = None
        self._leases: list[GpuLease] = []

    @property
    def universe(self) -> Universe:
        return self.pool.universe

    def lease(self, n: int, purpose: str = "") -> GpuLease:
        """``n`` GPUs for one server (``with moeperf_gpus.lease(2) as lease: lease.env``)."""
        lease = self.pool.lease(n, self.who, purpose)
        self._leases.append(lease)
        return lease

    def release_all(self) -> None:
        for lease in reversed(self._leases):
            lease.release()
        self._leases.clear()


def pool_from_config(config: pytest.Config, temp_root: Path) -> GpuPool:
    """The process's pool from the options; the lock folder defaults to the run's temp root."""
    from pytest_moeperf import options

    gpus = options.resolve(config, "moeperf_gpus")
    wait = options.resolve(config, "moeperf_gpu_wait")
    lock_dir = options.resolve_path(config, "moeperf_gpu_lock_dir")
    option = None if gpus.value is None else str(gpus.value)
    return GpuPool(lambda: discover_universe(option, gpus.source),
                   lock_dir or temp_root / "moeperf-gpu-locks", float(wait.value),
                   wait.source)  # fmt: skip
