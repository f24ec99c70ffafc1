"""A machine's calibration: says whether two machines with the same names really compare.

Why: two cloud VMs with the same CPU model name and core count ran the embedded default 3-5x
apart (issue 17), so a baseline from one gave a false "regressed" on the other. The names in the
key cannot tell them apart; a fixed micro-benchmark can. It never touches the code under test
(vLLM, the MoE kernels, the config files): a real regression there must stay a regression, not
become "another machine". So the host part is a torch CPU GEMM at about vLLM's thread count and
a memory copy, median of a few repeats (~1 s), measured once per session before the first
server starts. On a GPU the device's identity (power limit, maximum clocks, memory size, ECC
mode) is added: read, never measured, so it is exact. The tolerance and its measurement are in
docs/verdicts.md ("Which machine") and benchmarks/calibration_spread.py.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_moeperf.baseline.schema import CalibrationEntry

#: Bumped whenever the micro-benchmark changes: figures of another method do not compare.
METHOD_VERSION = 1
#: Ratio of a host figure beyond which the machine is "another setup" (either way: x2 or /2).
#: Session-to-session on one machine (benchmarks/calibration_spread.py) the best-of figures
#: moved up to +37 % max/min on a quiet 16-core host and +36 % on the shared 2-core VM, and
#: +55 % on the CI VM minutes apart (a neighbour on the host's cores: a pure-Python loop there
#: flipped between 7.5 and 13 M steps/s); the VMs of issue 17 differed 3-5x, two H100 hosts
#: 2.8x. Numbers in docs/verdicts.md ("Which machine").
TOLERANCE = 1.0
#: Ratio beyond which the same machine ran in another state (x1.5 to x2): compared, but
#: verdicts of the size that state explains read inconclusive (``speed_drift``).
DRIFT = 0.50
#: How a moved calibration's range reads in a note: "beyond x1.5, not x2".
DRIFT_SPAN = f"beyond x{1 + DRIFT:g}, not x{1 + TOLERANCE:g}"
#: Power limits are set in whole watts; anything closer is the same setting.
POWER_LIMIT_TOLERANCE_W = 1.0
HOST_FIGURES = {"gemm_gflops": ("GEMM", "GFLOP/s"), "copy_gb_s": ("copy", "GB/s")}
#: GPU identity fields that must match exactly (power limit: within POWER_LIMIT_TOLERANCE_W).
GPU_FIELDS = ("memory_total_bytes", "power_limit_w", "sm_clock_max_mhz", "mem_clock_max_mhz",
              "ecc")  # fmt: skip
GEMM_N = 1024
COPY_BYTES = 64 * 2**20
REPEATS = 30
MIN_REPEAT_S = 0.01
#: (best rates, best-over-median spreads, threads) of one session's host measurement
_HostFigures = tuple[dict[str, float], dict[str, float], int]


@dataclass(frozen=True)
class Calibration:
    """Host figures (higher is faster), the threads they ran on, and each used GPU's identity."""

    figures: dict[str, float]
    threads: int
    gpus: tuple[dict[str, Any], ...] = ()
    spread: dict[str, float] = field(default_factory=dict)  # (best - median) / best, to read
    version: int = METHOD_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "figures": dict(self.figures), "threads": self.threads,
                "gpus": [dict(g) for g in self.gpus], "spread": dict(self.spread)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: object, *, source: str) -> Calibration:
        """Validate the ``key.calibration`` object of a baseline file."""
        from pytest_moeperf.baseline.schema import CalibrationEntry, validate

        return cls.from_entry(validate(CalibrationEntry, d, source))

    @classmethod
    def from_entry(cls, e: CalibrationEntry) -> Calibration:
        return cls(dict(e.figures), e.threads, tuple(e.gpus), dict(e.spread), e.version)

    def summary(self) -> str:
        """ "GEMM 41.2 GFLOP/s, copy 9.81 GB/s (1 thread)" (plus the GPU's power limit)."""
        parts = [f"{label} {_num(self.figures[k])} {unit}"
                 for k, (label, unit) in HOST_FIGURES.items() if k in self.figures]  # fmt: skip
        text = ", ".join(parts) or "no host figures"
        text += f" ({self.threads} thread{'s' if self.threads != 1 else ''})"
        limits = [g.get("power_limit_w") for g in self.gpus]
        if limits and all(isinstance(x, int | float) for x in limits):
            text += f", GPU power limit {'/'.join(_num(float(x or 0)) for x in limits)} W"
        return text


def _num(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def differences(here: Calibration, there: Calibration, tolerance: float = TOLERANCE) -> list[str]:
    """What makes ``there`` another machine than ``here``; empty: the same, within tolerance.

    Each entry names both figures ("GEMM 12.1 vs 41.2 GFLOP/s (-71 %)"). A figure only one side
    has is not a difference (an older plugin measured less); a method change is one.
    """
    if here.version != there.version:
        return [f"calibration method v{here.version} vs v{there.version}"]
    out = [text for _, text in _moved_figures(here, there, tolerance)]
    if here.threads != there.threads:
        out.append(f"threads {here.threads} vs {there.threads}")
    if len(here.gpus) != len(there.gpus):
        out.append(f"GPUs {len(here.gpus)} vs {len(there.gpus)}")
    for i, (g, h) in enumerate(zip(here.gpus, there.gpus, strict=False)):
        for f in GPU_FIELDS:
            a, b = g.get(f), h.get(f)
            if a is None or b is None:
                continue  # unknown on one side (NVML refused): not evidence of a difference
            same = (abs(float(a) - float(b)) <= POWER_LIMIT_TOLERANCE_W
                    if f == "power_limit_w" else a == b)  # fmt: skip
            if not same:
                out.append(f"gpu{i} {f} {a!r} vs {b!r}")
    return out


def _moved_figures(here: Calibration, there: Calibration,
                   tolerance: float) -> list[tuple[float, str]]:  # fmt: skip
    """(here / there, "GEMM 12.1 vs 41.2 GFLOP/s (-71 %)") of each host figure both sides have
    that moved beyond ``tolerance`` either way."""
    out = []
    for k, (label, unit) in HOST_FIGURES.items():
        a, b = here.figures.get(k), there.figures.get(k)
        if a is None or b is None or a <= 0 or b <= 0:
            continue  # a figure only one side has is not a difference
        if abs(math.log(a / b)) > math.log1p(tolerance):
            out.append((a / b, f"{label} {_num(a)} vs {_num(b)} {unit} "
                               f"({100 * (a / b - 1):+.0f} %)"))  # fmt: skip
    return out


def speed_drift(here: Calibration, there: Calibration) -> tuple[float, str] | None:
    """(here / there, "GEMM 159 vs 103 GFLOP/s (+55 %)") where a host figure moved beyond
    ``DRIFT`` but not beyond ``TOLERANCE``: the machine the baseline's was, running slower or
    faster (a neighbour on its cores, another boost state). The ratio is the figure that moved
    most. None within ``DRIFT``, and for another machine (``differences``: judged raw only
    where the user passed --moeperf-allow-other-hardware)."""
    if differences(here, there):  # another machine: that check decides, or the user's flag
        return None
    moved = _moved_figures(here, there, DRIFT)
    if not moved:
        return None
    ratio = max((r for r, _ in moved), key=lambda r: abs(math.log(r)))
    return ratio, ", ".join(text for _, text in moved)


# -- measuring --------------------------------------------------------------------------------


def vllm_threads(cpus: Sequence[int] | None = None, sysfs: Path = Path("/sys/devices/system/cpu"),
                 environ: Mapping[str, str] = os.environ) -> int:  # fmt: skip
    """About the OpenMP threads vLLM's CPU worker uses: one per physical core, one core left to
    its scheduler (vLLM's "auto" binding); OMP_NUM_THREADS wins where set."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
            range(os.cpu_count() or 1))  # fmt: skip
    cores = set()
    for c in cpus:
        topo = sysfs / f"cpu{c}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(),
                       (topo / "core_id").read_text().strip()))  # fmt: skip
        except OSError:
            cores.add(("?", str(c)))
    return max(1, len(cores) - 1)


def _rate(work: Callable[[], object], amount: float) -> float:
    """amount / seconds of ``work`` repeated until MIN_REPEAT_S has passed."""
    n, t0 = 0, time.perf_counter()
    while True:
        work()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= MIN_REPEAT_S:
            return n * amount / dt


def measure_host(threads: int | None = None, repeats: int = REPEATS) -> _HostFigures:
    """(best rates, spreads, threads) of the GEMM and the copy; ImportError without torch.

    The best of many short repeats, not their median: another process on the machine only ever
    slows a repeat down, so the fastest is the machine's own speed, and moves far less than the
    median when the machine is shared (benchmarks/calibration_spread.py: docs/verdicts.md).
    """
    import torch

    threads = threads or vllm_threads()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.rand(GEMM_N, GEMM_N, generator=g) for _ in range(2))
        src = torch.ones(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        samples: dict[str, list[float]] = {k: [] for k in HOST_FIGURES}
        torch.mm(a, b)
        dst.copy_(src)  # first touch of the pages, outside the timing
        for _ in range(repeats):
            samples["gemm_gflops"].append(_rate(lambda: torch.mm(a, b), 2 * GEMM_N**3 / 1e9))
            samples["copy_gb_s"].append(_rate(lambda: dst.copy_(src), 2 * COPY_BYTES / 1e9))
    finally:
        torch.set_num_threads(before)
    best = {k: max(v) for k, v in samples.items()}
    spread = {k: (best[k] - statistics.median(v)) / best[k] for k, v in samples.items()}
    return best, spread, threads


def gpu_identity(gpus: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The identity fields of each used GPU (from the environment's NVML reading) plus ECC mode."""
    ecc = _ecc_modes([int(g["index"]) for g in gpus if isinstance(g.get("index"), int)])
    return tuple({**{f: g.get(f) for f in GPU_FIELDS if f != "ecc"},
                  "ecc": ecc.get(g.get("index"))} for g in gpus)  # fmt: skip


def _ecc_modes(indices: Sequence[int]) -> dict[Any, bool | None]:
    """Current ECC mode per NVML index; None where NVML cannot say (not a difference then)."""
    from pytest_moeperf.hygiene.nvml import Nvml
    from pytest_moeperf.metrics.hardware import import_pynvml, init_nvml, shutdown_nvml

    module, _ = import_pynvml()
    if module is None or not indices or init_nvml(module) is not None:
        return {}
    nv, out = Nvml(module), {}
    try:
        for i in indices:
            h, _ = nv.get("nvmlDeviceGetHandleByIndex", i)
            mode, _ = nv.get("nvmlDeviceGetEccMode", h) if h is not None else (None, None)
            out[i] = None if mode is None else bool(int(mode[0]))
    finally:
        shutdown_nvml(module)
    return out


# -- once per session -------------------------------------------------------------------------

SESSION_KEY = pytest.StashKey["_HostFigures | str"]()


def on_this_machine(server_url: str | None) -> bool:
    """Whether the server runs here: one we start, or an external one on a loopback address."""
    if not server_url:
        return True
    from urllib.parse import urlsplit

    host = (urlsplit(server_url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def measure_for_session(config: pytest.Config) -> None:
    """Measure the host figures once per pytest session (call before the first server starts:
    a running server would slow them). A failure is kept as its reason, never raised."""
    if SESSION_KEY in config.stash:
        return
    try:
        config.stash[SESSION_KEY] = measure_host()
    except ImportError as exc:
        config.stash[SESSION_KEY] = f"not measured: torch is not importable ({exc})"


def for_key(config: pytest.Config, gpus: Sequence[Mapping[str, Any]]) -> Calibration | None:
    """This session's calibration for a baseline key; None where the host was not measured
    (a remote external server: this machine says nothing about that one)."""
    host = config.stash.get(SESSION_KEY, None)
    if not isinstance(host, tuple):
        return None
    figures, spread, threads = host
    return Calibration(figures, threads, gpu_identity(gpus), spread)
