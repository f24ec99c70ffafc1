"""Machine hygiene checks: NVML paths against a fake ``pynvml`` (a test double of NVML alone),
host paths against a fake /proc and /sys, and the real machine (no GPU here) end to end.

The fake pynvml mirrors nvidia-ml-py's names and error classes; it logs every call so a test can
prove that no setter is ever called.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf import hygiene
from pytest_moeperf.errors import UsageError
from pytest_moeperf.hygiene import gpu, host
from pytest_moeperf.hygiene.model import HygieneCheck, HygieneReport

# -- a fake pynvml ------------------------------------------------------------------------------


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3, "Not Supported")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(12, "NVML Shared Library Not Found")


class NVMLError_FunctionNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(13, "Function Not Found")


class NVMLLibraryMismatchError(Exception):
    pass


@dataclass
class FakeGpu:
    """An idle, healthy H200 as NVML would describe it (what a quiet machine reads)."""

    clocks: dict[tuple[str, int], int] = field(
        default_factory=lambda: {
            ("now", 1): 345,
            ("max", 1): 1980,
            ("app", 1): 1980,
            ("appdef", 1): 1980,
            ("now", 2): 3201,
            ("max", 2): 3201,
            ("app", 2): 3201,
            ("appdef", 2): 3201,
        }
    )
    reasons: int = 0x1  # gpu_idle
    enforced_mw: int = 700_000
    limit_mw: int = 700_000
    default_mw: int = 700_000
    constraints_mw: tuple[int, int] = (200_000, 700_000)
    usage_mw: int = 74_000
    temp_c: int = 31
    slowdown_c: int = 87
    persistence: int = 1
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    ecc: tuple[int, int] = (1, 1)
    ecc_uncorrected: int = 0
    retired: dict[int, list[int]] | None = None  # None: NotSupported (Hopper)
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    util: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])


class FakeNvml(types.ModuleType):
    """Enough of pynvml for the hygiene checks, with a log of every call."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        unsupported: set[str] | None = None,
        missing: set[str] | None = None,
        init_error: Exception | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.unsupported = unsupported or set()
        self.init_error = init_error
        self.calls: list[str] = []
        self.util_calls = 0
        for cls in (
            NVMLError,
            NVMLError_NotSupported,
            NVMLError_LibraryNotFound,
            NVMLError_FunctionNotFound,
            NVMLLibraryMismatchError,
        ):
            setattr(self, cls.__name__, cls)
        fns = {name[4:]: getattr(self, name) for name in dir(type(self)) if name.startswith("_fn_")}
        for name, fn in fns.items():
            if name not in (missing or set()):
                setattr(self, name, self._logged(name, fn))

    def _logged(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            if name in self.unsupported:
                raise NVMLError_NotSupported()
            return fn(*args)

        return call

    # every pynvml function the fake offers (setters included, to prove they are never called)
    def _fn_nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def _fn_nvmlShutdown(self) -> None:
        pass

    def _fn_nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def _fn_nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def _fn_nvmlDeviceGetClockInfo(self, g: FakeGpu, kind: int) -> int:
        return g.clocks[("now", kind)]

    def _fn_nvmlDeviceGetMaxClockInfo(self, g: FakeGpu, kind: int) -> int:
        return g.clocks[("max", kind)]

    def _fn_nvmlDeviceGetApplicationsClock(self, g: FakeGpu, kind: int) -> int:
        return g.clocks[("app", kind)]

    def _fn_nvmlDeviceGetDefaultApplicationsClock(self, g: FakeGpu, kind: int) -> int:
        return g.clocks[("appdef", kind)]

    def _fn_nvmlDeviceGetCurrentClocksEventReasons(self, g: FakeGpu) -> int:
        return g.reasons

    def _fn_nvmlDeviceGetCurrentClocksThrottleReasons(self, g: FakeGpu) -> int:
        return g.reasons

    def _fn_nvmlDeviceGetEnforcedPowerLimit(self, g: FakeGpu) -> int:
        return g.enforced_mw

    def _fn_nvmlDeviceGetPowerManagementLimit(self, g: FakeGpu) -> int:
        return g.limit_mw

    def _fn_nvmlDeviceGetPowerManagementDefaultLimit(self, g: FakeGpu) -> int:
        return g.default_mw

    def _fn_nvmlDeviceGetPowerManagementLimitConstraints(self, g: FakeGpu) -> list[int]:
        return list(g.constraints_mw)

    def _fn_nvmlDeviceGetPowerUsage(self, g: FakeGpu) -> int:
        return g.usage_mw

    def _fn_nvmlDeviceGetTemperatureV(self, g: FakeGpu, sensor: int) -> int:
        assert sensor == 0
        return g.temp_c

    def _fn_nvmlDeviceGetTemperature(self, g: FakeGpu, sensor: int) -> int:
        assert sensor == 0
        return g.temp_c

    def _fn_nvmlDeviceGetTemperatureThreshold(self, g: FakeGpu, threshold: int) -> int:
        assert threshold == 1  # slowdown
        return g.slowdown_c

    def _fn_nvmlDeviceGetPersistenceMode(self, g: FakeGpu) -> int:
        return g.persistence

    def _fn_nvmlDeviceGetComputeRunningProcesses(self, g: FakeGpu) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.procs]

    def _fn_nvmlDeviceGetEccMode(self, g: FakeGpu) -> list[int]:
        return list(g.ecc)

    def _fn_nvmlDeviceGetTotalEccErrors(self, g: FakeGpu, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)  # uncorrected, volatile
        return g.ecc_uncorrected

    def _fn_nvmlDeviceGetRetiredPages(self, g: FakeGpu, cause: int) -> list[int]:
        if g.retired is None:
            raise NVMLError_NotSupported()
        return g.retired.get(cause, [])

    def _fn_nvmlDeviceGetRetiredPagesPendingStatus(self, g: FakeGpu) -> int:
        if g.retired is None:
            raise NVMLError_NotSupported()
        return g.retired_pending

    def _fn_nvmlDeviceGetRemappedRows(self, g: FakeGpu) -> tuple[int, int, int, int]:
        return g.remapped

    def _fn_nvmlDeviceGetUtilizationRates(self, g: FakeGpu) -> Any:
        gpu_pct, mem_pct = g.util[min(self.util_calls, len(g.util) - 1)]
        self.util_calls += 1
        return types.SimpleNamespace(gpu=gpu_pct, memory=mem_pct)

    def _fn_nvmlDeviceSetPowerManagementLimit(self, g: FakeGpu, mw: int) -> None:
        raise AssertionError("a setter was called")

    def _fn_nvmlDeviceSetApplicationsClocks(self, g: FakeGpu, mem: int, sm: int) -> None:
        raise AssertionError("a setter was called")

    def _fn_nvmlDeviceSetPersistenceMode(self, g: FakeGpu, mode: int) -> None:
        raise AssertionError("a setter was called")

    def _fn_nvmlDeviceResetApplicationsClocks(self, g: FakeGpu) -> None:
        raise AssertionError("a setter was called")


@pytest.fixture
def use_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """Install a FakeNvml as ``pynvml`` (the real import path in metrics.hardware runs)."""

    def install(*gpus: FakeGpu, **kw: Any) -> FakeNvml:
        fake = FakeNvml(list(gpus) or [FakeGpu()], **kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def checks_of(out: list[HygieneCheck]) -> dict[str, HygieneCheck]:
    return {c.name: c for c in out}


def run_gpu(
    server_pids: set[int] | None = None,
    table: dict[int, host.Proc] | None = None,
    indices: list[int] | None = None,
    **kw: Any,
) -> dict[str, HygieneCheck]:
    out = gpu.gpu_checks(
        indices,
        server_pids if server_pids is not None else set(),
        table or {},
        util_interval_s=0.0,
        **kw,
    )
    return checks_of(out)


GPU_CHECKS = [
    "clocks",
    "throttle",
    "power_limit",
    "temperature",
    "persistence",
    "processes",
    "ecc",
    "retired_pages",
    "remapped_rows",
    "utilization",
]


# -- GPU: the quiet machine, and NVML absent or refusing ---------------------------------------


def test_quiet_h200_reads_ok_everywhere(use_nvml: Callable[..., FakeNvml]) -> None:
    fake = use_nvml(FakeGpu())
    c = run_gpu()
    assert list(c) == [f"gpu0.{n}" for n in GPU_CHECKS]
    assert {n: x.status for n, x in c.items() if x.status != "ok"} == {
        "gpu0.retired_pages": "unknown"  # Hopper: NotSupported, rows are remapped instead
    }
    assert "Not Supported" in c["gpu0.retired_pages"].detail
    assert "remap rows instead" in c["gpu0.retired_pages"].detail
    assert c["gpu0.power_limit"].value["default_w"] == 700.0
    assert c["gpu0.power_limit"].detail == "700 W (default 700 W, range 200-700 W)"
    assert c["gpu0.clocks"].value["sm_mhz"] == 345 and c["gpu0.clocks"].value["sm_max_mhz"] == 1980
    assert "not a warning" in c["gpu0.clocks"].detail
    assert c["gpu0.throttle"].value == {"bits": 1, "reasons": ["gpu_idle"]}
    assert c["gpu0.ecc"].detail == "ECC on, 0 volatile uncorrected error(s)"
    assert c["gpu0.processes"].detail == "no compute process on the GPU"
    assert not any(x.noisy for x in c.values())
    assert fake.calls[0] == "nvmlInit" and fake.calls[-1] == "nvmlShutdown"


def test_never_calls_a_setter(use_nvml: Callable[..., FakeNvml]) -> None:
    fake = use_nvml(FakeGpu(reasons=0x4, enforced_mw=300_000, persistence=0))
    run_gpu()
    assert fake.calls and not [n for n in fake.calls if "Set" in n or "Reset" in n]
    src = Path(gpu.__file__).read_text()
    assert "nvmlDeviceSet" not in src and "nvmlDeviceReset" not in src and "Clear" not in src


def test_not_supported_everywhere_is_unknown_not_a_crash(
    use_nvml: Callable[..., FakeNvml],
) -> None:
    names = {n[4:] for n in dir(FakeNvml) if n.startswith("_fn_nvmlDeviceGet")}
    names -= {"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"}
    use_nvml(FakeGpu(), unsupported=names)
    c = run_gpu()
    assert list(c) == [f"gpu0.{n}" for n in GPU_CHECKS]
    for x in c.values():
        assert x.status == "unknown", x
        assert "Not Supported" in x.detail, x


def test_nvml_init_failure_says_no_gpu(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(init_error=NVMLError_LibraryNotFound())
    c = run_gpu()
    assert list(c) == ["gpu"]
    assert c["gpu"].status == "unknown"
    assert c["gpu"].detail.startswith("no NVIDIA GPU / NVML not available: NVML library not found")


def test_pynvml_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    c = run_gpu()
    assert c["gpu"].status == "unknown" and "pynvml (package nvidia-ml-py)" in c["gpu"].detail


def test_handle_failure_is_unknown_for_that_gpu(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(), unsupported={"nvmlDeviceGetHandleByIndex"})
    c = run_gpu()
    assert list(c) == ["gpu0"] and "no handle: nvmlDeviceGetHandleByIndex: Not Supported" in (
        c["gpu0"].detail
    )


def test_older_pynvml_names_are_the_fallback(use_nvml: Callable[..., FakeNvml]) -> None:
    fake = use_nvml(
        FakeGpu(reasons=0x40, temp_c=40),
        missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"},
    )
    c = run_gpu()
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls
    assert c["gpu0.throttle"].status == "warn" and c["gpu0.temperature"].value["celsius"] == 40


def test_a_driver_without_the_function_falls_back(use_nvml: Callable[..., FakeNvml]) -> None:
    fake = use_nvml(FakeGpu())

    def not_in_driver(*a: Any) -> Any:
        raise NVMLError_FunctionNotFound()

    fake.nvmlDeviceGetTemperatureV = not_in_driver  # type: ignore[attr-defined]
    c = run_gpu()
    assert c["gpu0.temperature"].status == "ok" and "nvmlDeviceGetTemperature" in fake.calls


def test_library_mismatch_on_processes_is_unknown(use_nvml: Callable[..., FakeNvml]) -> None:
    fake = use_nvml(FakeGpu())

    def mismatch(*a: Any) -> Any:
        raise NVMLLibraryMismatchError("Unversioned function called ...")

    fake.nvmlDeviceGetComputeRunningProcesses = mismatch  # type: ignore[attr-defined]
    c = run_gpu()
    assert c["gpu0.processes"].status == "unknown"
    assert "Unversioned function called" in c["gpu0.processes"].detail


def test_only_the_servers_gpus_are_checked(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(), FakeGpu(reasons=0x4), FakeGpu())
    c = run_gpu(indices=[0, 2])
    assert {n.split(".")[0] for n in c} == {"gpu0", "gpu2"}
    assert not any(x.noisy for x in c.values())


def test_cpu_backend_skips_gpu_checks_but_counts_gpus(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(), FakeGpu())
    c = run_gpu(skip="server runs on the CPU backend: GPU checks skipped")
    assert list(c) == ["gpu"] and c["gpu"].value == {"gpus_seen": 2}
    assert c["gpu"].status == "unknown" and "CPU backend" in c["gpu"].detail


# -- GPU: each warning ---------------------------------------------------------------------------


def test_throttled_gpu_spoils_the_numbers(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(reasons=0x4 | 0x40 | 0x1 | 0x800))
    t = run_gpu()["gpu0.throttle"]
    assert t.status == "warn" and t.noisy
    assert t.detail == "clocks held down by sw_power_cap, hw_thermal_slowdown before any load"
    assert t.value["reasons"] == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown", "0x800"]


@pytest.mark.parametrize("bits", [0x0, 0x1, 0x2, 0x10, 0x100])
def test_harmless_clock_reasons_are_ok(use_nvml: Callable[..., FakeNvml], bits: int) -> None:
    use_nvml(FakeGpu(reasons=bits))
    assert run_gpu()["gpu0.throttle"].status == "ok"


def test_power_limit_below_default_spoils(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(enforced_mw=500_000, limit_mw=500_000))
    p = run_gpu()["gpu0.power_limit"]
    assert p.status == "warn" and p.noisy
    assert p.detail.startswith("power limit 500 W (default 700 W, range 200-700 W) is below")
    assert p.value["enforced_w"] == 500.0 and p.value["usage_w"] == 74.0


def test_power_limit_without_default_is_unknown(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(), unsupported={"nvmlDeviceGetPowerManagementDefaultLimit"})
    p = run_gpu()["gpu0.power_limit"]
    assert p.status == "unknown" and "DefaultLimit: Not Supported" in p.detail


def test_application_clocks_below_default_spoil(use_nvml: Callable[..., FakeNvml]) -> None:
    g = FakeGpu()
    g.clocks[("app", 1)] = 1410
    use_nvml(g)
    c = run_gpu()["gpu0.clocks"]
    assert c.status == "warn" and c.noisy and "SM 1410 < default 1980 MHz" in c.detail


def test_hot_idle_gpu_warns(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(temp_c=80, slowdown_c=87))
    t = run_gpu()["gpu0.temperature"]
    assert t.status == "warn" and t.noisy and t.detail.startswith("80 C (slowdown at 87 C)")


def test_persistence_off_warns_without_spoiling(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(persistence=0))
    p = run_gpu()["gpu0.persistence"]
    assert p.status == "warn" and not p.noisy and p.value == "disabled"


def test_ecc_errors_and_pending_mode(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(ecc_uncorrected=2), FakeGpu(ecc=(0, 1)), FakeGpu(ecc=(0, 0)))
    c = run_gpu()
    assert c["gpu0.ecc"].status == "warn" and "2 volatile uncorrected" in c["gpu0.ecc"].detail
    assert not c["gpu0.ecc"].noisy
    assert c["gpu1.ecc"].status == "warn" and "waits for reboot" in c["gpu1.ecc"].detail
    assert c["gpu2.ecc"].status == "ok" and c["gpu2.ecc"].detail == "ECC off"


def test_retired_pages_and_remapped_rows(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(
        FakeGpu(retired={0: [1, 2], 1: []}, retired_pending=1, remapped=(3, 0, 1, 0)),
        FakeGpu(retired={0: [], 1: [7]}, remapped=(0, 1, 0, 1)),
    )
    c = run_gpu()
    assert c["gpu0.retired_pages"].status == "warn"
    assert c["gpu0.retired_pages"].value == {"single_bit": 2, "double_bit": 0, "pending": True}
    assert c["gpu0.remapped_rows"].status == "warn" and "pending" in c["gpu0.remapped_rows"].detail
    assert c["gpu1.retired_pages"].status == "ok"
    assert "FAILED" in c["gpu1.remapped_rows"].detail


def test_busy_gpu_before_load_spoils(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(util=[(97, 40), (95, 38), (99, 41)]))
    u = run_gpu()["gpu0.utilization"]
    assert (
        u.status == "warn"
        and u.noisy
        and u.value == {"gpu_pct": 95, "memory_pct": 38, "samples": 3}
    )


def test_one_late_kernel_is_not_busy(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(util=[(60, 5), (0, 0), (0, 0)]))
    assert run_gpu()["gpu0.utilization"].status == "ok"


# -- GPU: whose processes ------------------------------------------------------------------------


def proc(
    pid: int,
    ppid: int = 1,
    pgid: int | None = None,
    argv: tuple[str, ...] = ("python",),
    ticks: int = 0,
    state: str = "S",
) -> host.Proc:
    return host.Proc(pid, ppid, pid if pgid is None else pgid, state, ticks, argv)


def test_another_process_on_the_gpu_is_flagged(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(procs=[(100, 70 * 2**30), (555, 30 * 2**30)]))
    table = {100: proc(100), 555: proc(555, argv=("python", "train.py"))}
    p = run_gpu(server_pids={100}, table=table)["gpu0.processes"]
    assert p.status == "warn" and p.noisy
    assert "pid 555 (30.0 GiB, python train.py)" in p.detail and "pid 100" not in p.detail
    kinds = {r["pid"]: r["kind"] for r in p.value["processes"]}
    assert kinds == {100: "server", 555: "other"}


def test_the_servers_own_processes_are_not_flagged(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(procs=[(100, 2**30), (101, 60 * 2**30)]))
    p = run_gpu(server_pids={100, 101}, table={100: proc(100), 101: proc(101, 100)})
    assert p["gpu0.processes"].status == "ok"
    assert p["gpu0.processes"].detail == "only the server's 2 process(es) on the GPU"


def test_pids_from_another_namespace(use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(FakeGpu(procs=[(4242, None)]))
    alone = run_gpu(server_pids={100}, table={100: proc(100)})["gpu0.processes"]
    assert alone.status == "unknown" and "another PID namespace" in alone.detail
    assert "pid 4242 (memory n/a)" in alone.detail
    use_nvml(FakeGpu(procs=[(100, 2**30), (4242, None)]))
    beside = run_gpu(server_pids={100}, table={100: proc(100)})["gpu0.processes"]
    assert beside.status == "warn" and beside.noisy  # ours are visible, so 4242 is not ours


def test_external_server_processes_are_listed_not_judged(
    use_nvml: Callable[..., FakeNvml],
) -> None:
    use_nvml(FakeGpu(procs=[(7, 2**30)]))
    out = gpu.gpu_checks(None, None, {7: proc(7)}, util_interval_s=0.0)
    p = checks_of(out)["gpu0.processes"]
    assert p.status == "unknown" and "external server" in p.detail and "pid 7" in p.detail


# -- host: a fake /proc and /sys -----------------------------------------------------------------


def write_proc(
    root: Path,
    pid: int,
    *,
    ppid: int = 1,
    pgid: int | None = None,
    argv: tuple[str, ...] = ("sleep", "1"),
    ticks: tuple[int, int] = (0, 0),
    state: str = "S",
    comm: str = "x",
) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = [
        state,
        str(ppid),
        str(pgid if pgid is not None else pid),
        "0",
        "0",
        "0",
        "0",
        "0",
        "0",
        "0",
        "0",
        str(ticks[0]),
        str(ticks[1]),
        "0",
        "0",
    ]
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_process_table_parses_odd_names(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, ppid=3, pgid=9, comm="a) b (c", ticks=(5, 7), argv=("x", "y z"))
    (tmp_path / "proc" / "11").mkdir()  # exited while read: no stat
    (tmp_path / "proc" / "self").mkdir()
    t = host.process_table(tmp_path)
    assert list(t) == [10]
    assert t[10] == host.Proc(10, 3, 9, "S", 12, ("x", "y z"))


VLLM = (
    "/v/bin/python",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "m",
    "--port",
    "8000",
)


def test_other_vllm_server_is_flagged_and_ours_is_not(tmp_path: Path) -> None:
    write_proc(tmp_path, 50, argv=VLLM)  # someone else's
    write_proc(tmp_path, 60, ppid=1, argv=("flock", "/tmp/l", *VLLM))  # a wrapper...
    write_proc(tmp_path, 61, ppid=60, argv=VLLM)  # ...and its server: one entry
    write_proc(tmp_path, 70, ppid=1, argv=("/usr/bin/python3", "/usr/local/bin/vllm", "serve"))
    write_proc(tmp_path, 80, ppid=2, argv=VLLM)  # ours
    write_proc(tmp_path, 90, argv=("pytest", "-k", "api_server or vllm serve"))
    write_proc(tmp_path, 91, argv=VLLM, state="Z")
    t = host.process_table(tmp_path)
    c = host.other_servers_check(t, mine=host.descendants(t, {2}) | {2})
    assert c.status == "warn" and c.noisy
    assert [o["pid"] for o in c.value["others"]] == [50, 60, 70]
    assert c.value["this_session"] == [80]
    assert "pid 50: vllm.entrypoints.openai.api_server --port 8000" in c.detail
    assert "pid 70: vllm" in c.detail
    quiet = host.other_servers_check(t, mine={50, 60, 61, 70, 80})
    assert quiet.status == "ok" and quiet.detail.endswith("4 server(s) of this session are up")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("python", "-m", "sglang.launch_server"), True),
        (("/opt/bin/text-generation-launcher", "--port", "1"), True),
        (("trtllm-serve", "m"), True),
        (("vllm", "bench", "serve"), False),
        (("python", "my_api_server.py"), False),
        ((), False),
    ],
)
def test_is_server(argv: tuple[str, ...], expected: bool) -> None:
    assert host.is_server(argv) is expected


def write_cpu(root: Path, busy: int, idle: int, loadavg: str = "0.10 0.20 0.30 1/100 5") -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (root / "proc" / "loadavg").write_text(loadavg + "\n")


def test_sample_counts_cpu_outside_this_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_cpu(tmp_path, busy=1000, idle=5000)
    write_proc(tmp_path, 2, ticks=(100, 0))
    (tmp_path / "proc" / "vmstat").write_text("pswpin 10\npswpout 5\n")
    clock = iter([0.0, 1.0])

    def sleep(s: float) -> None:  # one second passes: 3 CPUs busy, 1 of them ours
        write_cpu(tmp_path, busy=1300, idle=5100)
        write_proc(tmp_path, 2, ticks=(180, 20))
        (tmp_path / "proc" / "vmstat").write_text("pswpin 10\npswpout 9\n")

    monkeypatch.setattr(
        host, "time", types.SimpleNamespace(sleep=sleep, monotonic=lambda: next(clock))
    )
    monkeypatch.setattr(host.os, "sysconf", lambda name: 100)
    smp = host.sample(tmp_path, {2}, 1.0)
    assert smp.seconds == 1.0 and smp.swapped_pages == 4
    assert smp.other_cores == pytest.approx(2.0) and smp.own_cores == pytest.approx(1.0)
    load = host.cpu_load_check(tmp_path, 4, smp)
    assert load.status == "warn" and load.noisy
    assert load.detail.startswith("processes outside this session used 2.00 of 4 CPU(s)")
    swap = {c.name: c for c in host.memory_checks(tmp_path, smp)}["host.swap"]
    assert swap.status == "warn" and swap.noisy and "4 page(s) swapped" in swap.detail


def test_cpu_load_quiet_and_fallbacks(tmp_path: Path) -> None:
    write_cpu(tmp_path, 1, 1, loadavg="3.50 1.00 0.50 2/100 9")
    ok = host.cpu_load_check(tmp_path, 16, host.Sample(1.0, 0.3, 0))
    assert ok.status == "ok" and ok.value["loadavg"] == [3.5, 1.0, 0.5]
    busy = host.cpu_load_check(tmp_path, 4, None)  # no sample: the load average decides
    assert busy.status == "warn" and "this session's own included" in busy.detail
    assert host.cpu_load_check(tmp_path, 8, None).status == "ok"
    assert host.cpu_load_check(tmp_path / "none", 8, None).status == "unknown"


def test_governor(tmp_path: Path) -> None:
    assert host.governor_check(tmp_path).status == "unknown"
    cpus = tmp_path / "sys" / "devices" / "system" / "cpu"
    for i, g in enumerate(["performance", "performance", "powersave"]):
        (cpus / f"cpu{i}" / "cpufreq").mkdir(parents=True)
        (cpus / f"cpu{i}" / "cpufreq" / "scaling_governor").write_text(g + "\n")
    (cpus / "cpu0" / "cpufreq" / "scaling_driver").write_text("intel_pstate\n")
    c = host.governor_check(tmp_path)
    assert c.status == "warn" and c.noisy
    assert c.value == {"governors": {"performance": 2, "powersave": 1}, "driver": "intel_pstate"}
    assert c.detail.startswith("performance on 2 CPU(s), powersave on 1 CPU(s) (driver intel_")
    (cpus / "cpu2" / "cpufreq" / "scaling_governor").write_text("schedutil\n")
    assert host.governor_check(tmp_path).status == "ok"


def test_memory_and_swap(tmp_path: Path) -> None:
    assert {c.status for c in host.memory_checks(tmp_path, None)} == {"unknown"}
    (tmp_path / "proc").mkdir()
    meminfo = "MemTotal: 33554432 kB\nMemAvailable: 1048576 kB\nSwapTotal: 2097152 kB\n"
    (tmp_path / "proc" / "meminfo").write_text(meminfo + "SwapFree: 1048576 kB\n")
    mem, swap = host.memory_checks(tmp_path, host.Sample(1.0, 0.0, 0))
    assert mem.status == "warn" and not mem.noisy and mem.detail.startswith("1.0 of 32.0 GiB")
    assert swap.status == "ok" and swap.detail == "1.00 GiB in swap, no swapping during the check"
    assert swap.value == {"used_bytes": 2**30, "pages_swapped_in_sample": 0}


# -- the report object ---------------------------------------------------------------------------


def sample_report() -> HygieneReport:
    return HygieneReport(
        [
            HygieneCheck("gpu0.power_limit", "warn", {"enforced_w": 500.0}, "below default", True),
            HygieneCheck("gpu0.persistence", "warn", "disabled", "persistence mode off"),
            HygieneCheck("host.swap", "ok", {"used_bytes": 0}, "no swap"),
        ],
        taken_at=1.5,
        sample_s=1.0,
        notes=["remote server x"],
    )


def test_report_round_trip_and_verdict() -> None:
    r = sample_report()
    d = json.loads(json.dumps(r.to_dict()))
    assert d["verdict"] == "noisy" and d["noisy"] == ["gpu0.power_limit: below default"]
    assert d["counts"] == {"ok": 1, "warn": 2, "unknown": 0}
    back = HygieneReport.from_dict(d)
    assert back == r and back.check("host.swap") == r.checks[2]
    assert (
        hygiene.noisy_line(r) == "noisy machine before measuring: gpu0.power_limit: below default"
    )
    quiet = HygieneReport(r.checks[1:], 0.0, 0.0)
    assert quiet.verdict == "quiet" and hygiene.noisy_line(quiet) is None


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(checks="x"), "r.json: results[0].hygiene.checks = 'x': must be a list"),
        (
            lambda d: d["checks"][1].update(status="bad"),
            "hygiene.checks[1].status = 'bad': must be one of ok, warn, unknown",
        ),
        (lambda d: d["checks"][0].pop("name"), "hygiene.checks[0].name = None: must be a non-"),
        (lambda d: d.update(notes=[1]), "hygiene.notes = [1]: must be a list of strings"),
        (lambda d: d.update(taken_at="now"), "hygiene.taken_at = 'now': must be a number"),
    ],
)
def test_from_dict_names_the_bad_field(
    mutate: Callable[[dict[str, Any]], Any], message: str
) -> None:
    d = sample_report().to_dict()
    mutate(d)
    with pytest.raises(UsageError) as e:
        HygieneReport.from_dict(d, "r.json", "results[0].hygiene")
    assert message in str(e.value)


def test_a_failing_check_is_recorded_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(root: Path) -> Any:
        raise RuntimeError("sysfs exploded")

    monkeypatch.setattr(host, "governor_check", boom)
    r = hygiene.run_checks(root=tmp_path, sample_s=0.0, cores=2)
    g = r.check("host.cpu_governor")
    assert g is not None and g.status == "unknown"
    assert g.detail == "check failed: RuntimeError: sysfs exploded"


def test_run_checks_on_a_fake_machine(tmp_path: Path, use_nvml: Callable[..., FakeNvml]) -> None:
    """Server group 300 (leader + an engine child in another group) on GPU 0, an other job."""
    use_nvml(FakeGpu(procs=[(300, 2**30), (301, 2**30), (900, 2**30)]))
    write_cpu(tmp_path, 1, 1, loadavg="9.0 9.0 9.0 1/1 1")
    write_proc(tmp_path, 300, argv=VLLM)
    write_proc(tmp_path, 301, ppid=300, pgid=42, argv=("VLLM::EngineCore",))
    write_proc(tmp_path, 900, argv=("python", "other_job.py"))
    write_proc(tmp_path, 950, argv=VLLM)
    r = hygiene.run_checks(gpu_indices=[0], server_pgid=300, root=tmp_path, sample_s=0.0, cores=4)
    names = [c.name for c in r.checks]
    assert names == [
        *(f"gpu0.{n}" for n in GPU_CHECKS),
        "host.other_servers",
        "host.cpu_load",
        "host.cpu_governor",
        "host.memory",
        "host.swap",
    ]
    procs = r.check("gpu0.processes")
    assert procs is not None and {p["pid"]: p["kind"] for p in procs.value["processes"]} == {
        300: "server",
        301: "server",
        900: "other",
    }
    assert [n.split(":")[0] for n in r.noisy] == [
        "gpu0.processes",
        "host.other_servers",
        "host.cpu_load",
    ]
    other = r.check("host.other_servers")
    assert other is not None and [o["pid"] for o in other.value["others"]] == [950]


def test_external_mode_says_whose_host(tmp_path: Path, use_nvml: Callable[..., FakeNvml]) -> None:
    use_nvml(init_error=NVMLError_LibraryNotFound())
    r = hygiene.run_checks(external="http://gpu-box:8000", root=tmp_path, sample_s=0.0, cores=2)
    assert r.notes == [
        "remote server http://gpu-box:8000: host checks are of the load "
        "generator's machine; GPU checks, if any, are of this machine's GPUs"
    ]
    gpu_check = r.check("gpu")
    assert gpu_check is not None and gpu_check.detail.startswith("no NVIDIA GPU")


@pytest.mark.parametrize(
    "argv, port",
    [
        (VLLM, 8000),
        (("python", "-m", "vllm.entrypoints.openai.api_server", "--port=9001"), 9001),
        (("vllm", "serve", "m"), 8000),  # vLLM's default
        (("python", "-m", "sglang.launch_server", "--port", "30000"), 30000),
        (("python", "-m", "sglang.launch_server"), None),
        (("x", "--port"), None),
    ],
)
def test_port_of(argv: tuple[str, ...], port: int | None) -> None:
    assert host.port_of(argv) == port


def test_local_external_server_is_found_by_port(tmp_path: Path) -> None:
    write_proc(tmp_path, 50, argv=VLLM)
    write_proc(tmp_path, 51, argv=(*VLLM[:-1], "8001"))
    t = host.process_table(tmp_path)
    assert host.local_server_for(t, "http://127.0.0.1:8001/v1") == 51
    assert host.local_server_for(t, "localhost:8000") == 50
    assert host.local_server_for(t, "http://gpu-box:8000") is None
    assert host.local_server_for(t, "http://localhost:9999") is None
    assert host.local_server_for(t, "http://localhost:port") is None


def test_external_server_on_this_machine_is_judged_as_the_server(
    tmp_path: Path, use_nvml: Callable[..., FakeNvml]
) -> None:
    use_nvml(FakeGpu(procs=[(51, 2**30), (52, 2**30)]))
    write_proc(tmp_path, 50, argv=VLLM)  # another server
    write_proc(tmp_path, 51, argv=(*VLLM[:-1], "8001"))  # the one under test
    write_proc(tmp_path, 52, ppid=51, pgid=52, argv=("VLLM::EngineCore",))
    r = hygiene.run_checks(external="http://localhost:8001", root=tmp_path, sample_s=0.0, cores=64)
    assert r.notes == ["external server http://localhost:8001 is pid 51 on this machine"]
    procs = r.check("gpu0.processes")
    assert procs is not None and procs.status == "ok"
    other = r.check("host.other_servers")
    assert other is not None and [o["pid"] for o in other.value["others"]] == [50]
    assert other.value["this_session"] == [51]


# -- this machine, for real ----------------------------------------------------------------------


def test_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real /proc, /sys and pynvml: host checks read real values; no GPU here says so."""
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    d, _line = hygiene.check_before_load(None, (), backend="cpu", sample_s=0.2)
    checks = {c["name"]: c for c in d["checks"]}
    assert {
        "host.other_servers",
        "host.cpu_load",
        "host.cpu_governor",
        "host.memory",
        "host.swap",
    } <= set(checks)
    assert checks["host.memory"]["status"] != "unknown"
    assert checks["host.cpu_load"]["value"]["other_cores"] is not None
    assert d["sample_s"] >= 0.2 and d["verdict"] in ("quiet", "noisy")
    gpu_names = [n for n in checks if n.startswith("gpu")]
    if gpu_names == ["gpu"] and checks["gpu"]["detail"].startswith("no NVIDIA GPU"):
        assert checks["gpu"]["status"] == "unknown"
    else:  # a machine with NVML: the CPU-backend skip or per-GPU checks
        assert gpu_names


def test_busy_process_outside_the_session_is_counted() -> None:
    """A real busy loop, re-parented away from this process (double fork): not in this
    session's tree, and the CPU it burns is measured from its real /proc ticks."""
    code = "import time\nt=time.time()\nwhile time.time()-t<30: pass"
    sh = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "{code}" >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(sh.stdout.strip())
    try:
        deadline = time.monotonic() + 20
        while host.process_table().get(pid, host.Proc(pid, 0, 0, "S", 0, ())).cpu_ticks < 5:
            assert time.monotonic() < deadline, "the busy loop never ran"
            time.sleep(0.1)
        table = host.process_table()
        mine = host.descendants(table, {os.getpid()})
        assert pid in table and table[pid].ppid != os.getpid() and pid not in mine
        smp = host.sample(Path("/"), {pid}, 0.5)
        assert smp.own_cores is not None and smp.other_cores is not None
        # a share of a core however busy the machine is (8 runnable jobs on 2 cores: ~0.2)
        assert smp.own_cores >= 0.05
        assert host.sample(Path("/"), set(), 0.1).own_cores == 0.0
    finally:
        os.kill(pid, 15)


# -- in the report -------------------------------------------------------------------------------

DATA = Path(__file__).parent / "data"


def payload(name: str) -> dict[str, Any]:
    """A recorded results payload without probes and sweeps (no curve charts to draw)."""
    d: dict[str, Any] = json.loads((DATA / name).read_text())
    for r in d["results"]:
        r["search_runs"], r["sweep"] = [], None
    return d


def test_report_setup_shows_hygiene_per_config() -> None:
    from pytest_moeperf.report import provenance
    from pytest_moeperf.report.model import parse_payload

    results = list(parse_payload(payload("results_ab_h200.json"), "ab.json").results)
    rows = {r[0]: r[1:] for r in provenance.setup_table(results).rows}
    assert rows["machine hygiene"] == ("quiet: 14 ok, 0 warn, 1 unknown",) * 2
    t = provenance.hygiene_table(results)
    assert t.headers == ("config", "check", "status", "found before load")
    assert ("all configs", "gpu0.power_limit", "ok", "700 W (default 700 W, range 200-700 W)") in (
        t.rows
    )
    assert [r[1] for r in t.rows][:2] == ["gpu0.clocks", "gpu0.throttle"]


def test_report_accepts_results_without_hygiene() -> None:
    """The CPU sample's second result predates hygiene checks: "not recorded", not an error."""
    from pytest_moeperf.report import provenance
    from pytest_moeperf.report.model import parse_payload

    results = list(parse_payload(payload("results_sample.json"), "cpu.json").results)
    assert results[0].hygiene is not None and results[1].hygiene is None
    rows = {r[0]: r[1:] for r in provenance.setup_table(results).rows}
    assert rows["machine hygiene"][1] == "not recorded (results from before hygiene checks)"
    t = provenance.hygiene_table(results)
    assert t.rows[0][:3] == ("in-tree (test_embedded_goodput)", "gpu", "unknown")
    assert t.rows[-1] == (
        "in-tree (test_embedded_long_prompts)",
        "(none)",
        "n/a",
        "not recorded: these results predate hygiene checks",
    )


def test_noisy_machine_in_html_markdown_and_not_covered(tmp_path: Path) -> None:
    from pytest_moeperf.report.render import write_report

    d = payload("results_sample.json")
    d["results"] = d["results"][:1]
    checks = d["results"][0]["hygiene"]["checks"]
    load = next(c for c in checks if c["name"] == "host.cpu_load")
    load.update(
        status="warn",
        spoils=True,
        detail="processes outside this session used 1.90 "
        "of 2 CPU(s) over 1.0 s: another job is running",
    )
    d["results"][0]["hygiene"]["notes"] = ["remote server http://h:8000: host checks are ..."]
    d["warnings"].append("perf_tests/x.py::test_x: " + hygiene.noisy_line(
        HygieneReport.from_dict(d["results"][0]["hygiene"])))  # fmt: skip
    html, md = write_report([d], tmp_path / "r", title="t")
    h, m = html.read_text(), md.read_text()
    assert '<table id="hygiene-table">' in h
    assert '<td class="bad">noisy: 1 warning(s) that spoil the numbers (see below)</td>' in h
    assert '<td class="bad">warn (spoils the numbers)</td>' in h
    assert '<td class="good">ok</td>' in h
    assert "remote server http://h:8000" in h
    noisy = (
        "was measured on a noisy machine: host.cpu_load: processes outside this session "
        "used 1.90 of 2 CPU(s) over 1.0 s: another job is running."
    )
    assert noisy in h and noisy.replace("_", "\\_") in m  # Markdown escapes "_"
    assert h.count("another job is running") == 2  # the table, Not covered; not the warning too
    setup = m.split("## Setup")[1].split("## Not covered")[0]
    assert "| config | check | status | found before load |" in setup
    assert "| all configs | host.cpu\\_load | warn (spoils the numbers) |" in setup


def test_report_names_a_bad_hygiene_block() -> None:
    from pytest_moeperf.report.model import parse_payload

    d = payload("results_sample.json")
    d["results"][0]["hygiene"] = "x"
    with pytest.raises(UsageError, match=r"^cpu\.json: results\[0\]\.hygiene = 'x': must be an"):
        parse_payload(d, "cpu.json")
    d["results"][0]["hygiene"] = {"checks": [{"name": "gpu", "status": "fine"}]}
    with pytest.raises(UsageError, match=r"results\[0\]\.hygiene\.checks\[0\]\.status = 'fine'"):
        parse_payload(d, "cpu.json")


# -- with the shared real vLLM CPU server ----------------------------------------------------------


def test_real_server_is_ours_not_another_server(
    cpu_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What PerfTest.run() records, taken beside a real running server: its processes (API
    server and engine core) are this session's, never "another inference server"."""
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    d, line = hygiene.check_before_load(cpu_server, (), backend="cpu", sample_s=0.5)
    checks = {c["name"]: c for c in d["checks"]}
    servers = checks["host.other_servers"]["value"]
    assert cpu_server.pgid in servers["this_session"]
    assert cpu_server.pgid not in [o["pid"] for o in servers["others"]]
    table = host.process_table()
    group = host.group_members(table, cpu_server.pgid)
    assert len(group) >= 2, "API server and engine core"  # vLLM's V1 engine runs apart
    assert checks["gpu"]["status"] == "unknown"  # no GPU here, or a CPU-backend server
    assert (line is None) == (d["verdict"] == "quiet")
