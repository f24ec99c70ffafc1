"""Machine facts that key baselines: CPU model and cores, the GPUs a server uses, the commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_moeperf.environment import (
    collect,
    cpu_model,
    git_commit,
    server_gpu_indices,
    usable_cpus,
)
from pytest_moeperf.metrics import hardware
from pytest_moeperf.metrics.hardware import GpuInfo


def test_cpu_model_reads_the_model_name(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 9554   64-Core Processor\nflags\t: fpu\n")  # fmt: skip
    assert cpu_model(info) == "AMD EPYC 9554 64-Core Processor"


def test_cpu_model_without_cpuinfo_falls_back_to_the_platform(tmp_path: Path) -> None:
    assert cpu_model(tmp_path / "missing")  # e.g. "x86_64": never empty


def test_usable_cpus_is_positive() -> None:
    assert usable_cpus() >= 1


# -- which GPUs a server uses, and what the setup record says


def _gpu(index: int, uuid: str) -> GpuInfo:
    return GpuInfo(index=index, name="NVIDIA H200", uuid=uuid, driver_version="580.65.06",
                   cuda_driver_version="13.0", memory_total_bytes=143 << 30, power_limit_w=700.0,
                   sm_clock_max_mhz=1980, mem_clock_max_mhz=3201, sm_clock_app_mhz=1980,
                   mem_clock_app_mhz=3201)  # fmt: skip


@pytest.mark.parametrize(
    ("visible", "needed", "expected"),
    [
        (None, 2, (0, 1)),
        ("", 1, (0,)),
        ("3,5", 1, (3,)),
        ("3,5", 2, (3, 5)),
        (" 4 , 6 ", 2, (4, 6)),
        ("GPU-abc,2", 2, (2,)),  # a UUID is resolved later, against NVML's list
    ],
)
def test_server_gpu_indices_follow_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, needed: int, expected: tuple[int, ...]
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert server_gpu_indices(needed) == expected


def test_collect_on_the_cpu_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The CPU default: no NVML is asked, the accelerator is "cpu", the engine version is the
    one the server's log gave."""
    monkeypatch.setattr(hardware, "visible_gpus", lambda: pytest.fail("NVML asked on the CPU"))
    env = collect(engine_version="0.32.0", backend_hint="cpu", gpus_needed=0, cwd=tmp_path)
    assert (env.accelerator, env.backend, env.gpu_count, env.gpu_indices) == ("cpu", "cpu", 0, ())
    assert (env.driver, env.cuda, env.engine, env.vllm_version) == (
        "none", "none", "vllm 0.32.0", "0.32.0")  # fmt: skip
    assert env.commit is None  # tmp_path is no git checkout
    d = env.to_dict()
    assert d["gpu_indices"] == [] and d["gpus"] == [] and d["cpu"] == env.cpu


def test_collect_on_gpus_takes_the_ones_the_server_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "visible_gpus",
                        lambda: [_gpu(i, f"GPU-{i}aaa") for i in range(4)])  # fmt: skip
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    env = collect(engine_version="0.24.0", backend_hint="cuda", gpus_needed=2)
    assert (env.backend, env.accelerator, env.gpu_count, env.gpu_indices) == (
        "cuda", "NVIDIA H200", 2, (2, 3))  # fmt: skip
    assert (env.driver, env.cuda) == ("580.65.06", "13.0")
    assert [g["index"] for g in env.gpus] == [2, 3]


def test_collect_with_leased_devices_resolves_uuids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU pool hands out CUDA_VISIBLE_DEVICES entries; a UUID prefix names one NVML index."""
    monkeypatch.setattr(hardware, "visible_gpus",
                        lambda: [_gpu(i, f"GPU-{i}aaa") for i in range(4)])  # fmt: skip
    env = collect(engine_version=None, backend_hint="cuda", gpus_needed=2,
                  devices=["GPU-1a", "3"])  # fmt: skip
    assert env.gpu_indices == (1, 3)
    assert env.vllm_version != ""  # the installed version, or "unknown"


def test_collect_for_an_external_server_stays_external(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without local GPUs an external server's accelerator is unknown, never "cpu"."""
    monkeypatch.setattr(hardware, "visible_gpus", lambda: [])
    env = collect(engine_version="0.24.0", backend_hint="external", gpus_needed=1)
    assert (env.backend, env.accelerator, env.gpu_count) == ("external", "unknown", 0)
    monkeypatch.setattr(hardware, "visible_gpus", lambda: [_gpu(0, "GPU-0")])
    env = collect(engine_version="0.24.0", backend_hint="external", gpus_needed=1, devices=["0"])
    assert (env.backend, env.accelerator, env.gpu_count) == ("external", "NVIDIA H200", 1)


def test_git_commit_of_a_checkout(tmp_path: Path) -> None:
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert git_commit(tmp_path) is None  # no commit yet
    (tmp_path / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "m"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    assert git_commit(tmp_path) == head[:12]


def test_git_commit_without_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_git(*a: object, **kw: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert git_commit(tmp_path) is None


def test_the_runners_commit_beats_a_stale_git(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:  # fmt: skip
    """On the H200 the tree's .git was older than the tree: MOEPERF_GIT_COMMIT wins, and the
    baseline's provenance keeps what git said beside it."""
    from pytest_moeperf.baseline.storage import _git_commit

    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "m"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    monkeypatch.delenv("MOEPERF_GIT_COMMIT", raising=False)
    assert _git_commit(tmp_path) == head
    (tmp_path / "f").write_text("y")
    assert _git_commit(tmp_path) == head + "-dirty"
    monkeypatch.setenv("MOEPERF_GIT_COMMIT", "a460962a1052")
    assert git_commit(tmp_path) == "a460962a1052"
    assert _git_commit(tmp_path) == (
        f"a460962a1052 (MOEPERF_GIT_COMMIT; the tree's .git said {head}-dirty)"
    )
    monkeypatch.setenv("MOEPERF_GIT_COMMIT", head + "-dirty")
    assert _git_commit(tmp_path) == head + "-dirty"  # they agree: no note
