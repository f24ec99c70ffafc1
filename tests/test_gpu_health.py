"""GPU health checks (``hygiene.gpu_health``): compute processes, ECC, retired pages and remapped
rows, read through NVML before measuring.

There is no GPU here, so NVML is a fake ``pynvml`` module. Its error classes and constants are the
installed nvidia-ml-py's own (``NVMLError(NVML_ERROR_NOT_SUPPORTED)`` is the real
``NVMLError_NotSupported`` with the real message), and a test proves that every function it offers
exists in nvidia-ml-py with the same parameters: a check that passes here calls NVML the way the
real package is called.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as real_nvml  # the installed nvidia-ml-py (imports without a driver)
import pytest

from pytest_moeperf.hygiene import gpu, gpu_health
from pytest_moeperf.hygiene.gpu_health import (
    GpuProcess,
    ecc,
    processes,
    remapped_rows,
    retired_pages,
)
from pytest_moeperf.hygiene.host import Proc
from pytest_moeperf.hygiene.model import HygieneCheck, HygieneReport
from pytest_moeperf.hygiene.nvml import Nvml

NOT_SUPPORTED = real_nvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = real_nvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN_ERROR = real_nvml.NVML_ERROR_UNKNOWN
SBE = real_nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
DBE = real_nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
GIB = 2**30

# -- a fake pynvml with nvidia-ml-py's own errors and constants --------------------------------


@dataclass
class Board:
    """One GPU as NVML describes it; the defaults are an idle, healthy H200 (Hopper)."""

    persistence: int = real_nvml.NVML_FEATURE_ENABLED
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    ecc_mode: tuple[int, int] = (1, 1)  # (current, pending)
    ecc_uncorrected_volatile: int = 0
    ecc_other_counters: int = 1234  # corrected / aggregate: must never be the one read
    retired: dict[int, list[int]] | None = None  # None: NotSupported (Ampere on)
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # None: NotSupported (pre-Ampere)
    # a getter (or (getter, first argument after the handle)) -> the NVML error code it returns
    fail: dict[str | tuple[str, int], int] = field(default_factory=dict)


def pre_ampere(**kw: Any) -> Board:
    """A healthy V100-like board: pages are retired, rows are not remapped."""
    kw.setdefault("retired", {SBE: [], DBE: []})
    kw.setdefault("remapped", None)
    return Board(**kw)


class FakePynvml(types.ModuleType):
    """The pynvml functions the hygiene checks call, with a log of every call and its arguments."""

    def __init__(self, boards: list[Board], *, missing: tuple[str, ...] = ()) -> None:
        super().__init__("pynvml")
        for name in dir(real_nvml):
            if name.startswith(("NVML_", "NVMLError", "NVMLLibraryMismatchError")):
                setattr(self, name, getattr(real_nvml, name))
        self.boards = boards
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        for name, fn in fake_functions(self).items():
            if name not in missing:
                setattr(self, name, self._logged(name, fn))

    def _logged(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            if args and isinstance(args[0], Board):
                code = args[0].fail.get(name)
                if code is None and len(args) > 1:
                    code = args[0].fail.get((name, args[1]))
                if code is not None:
                    raise real_nvml.NVMLError(code)  # maps to the code's real subclass
            return fn(*args)

        return call

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == name]

    def _fn_nvmlInit(self) -> None:
        pass

    def _fn_nvmlShutdown(self) -> None:
        pass

    def _fn_nvmlDeviceGetCount(self) -> int:
        return len(self.boards)

    def _fn_nvmlDeviceGetHandleByIndex(self, index: int) -> Board:
        return self.boards[index]

    def _fn_nvmlDeviceGetClockInfo(self, b: Board, kind: int) -> int:
        return 1980

    def _fn_nvmlDeviceGetMaxClockInfo(self, b: Board, kind: int) -> int:
        return 1980

    def _fn_nvmlDeviceGetApplicationsClock(self, b: Board, kind: int) -> int:
        return 1980

    def _fn_nvmlDeviceGetDefaultApplicationsClock(self, b: Board, kind: int) -> int:
        return 1980

    def _fn_nvmlDeviceGetCurrentClocksEventReasons(self, b: Board) -> int:
        return 0x1  # gpu_idle

    def _fn_nvmlDeviceGetEnforcedPowerLimit(self, b: Board) -> int:
        return 700_000

    def _fn_nvmlDeviceGetPowerManagementLimit(self, b: Board) -> int:
        return 700_000

    def _fn_nvmlDeviceGetPowerManagementDefaultLimit(self, b: Board) -> int:
        return 700_000

    def _fn_nvmlDeviceGetPowerManagementLimitConstraints(self, b: Board) -> list[int]:
        return [200_000, 700_000]

    def _fn_nvmlDeviceGetPowerUsage(self, b: Board) -> int:
        return 74_000

    def _fn_nvmlDeviceGetTemperatureV(self, b: Board, sensor: int) -> int:
        return 31

    def _fn_nvmlDeviceGetTemperatureThreshold(self, b: Board, threshold: int) -> int:
        return 87

    def _fn_nvmlDeviceGetUtilizationRates(self, b: Board) -> Any:
        return types.SimpleNamespace(gpu=0, memory=0)

    def _fn_nvmlDeviceGetPersistenceMode(self, b: Board) -> int:
        return b.persistence

    def _fn_nvmlDeviceGetComputeRunningProcesses(self, b: Board) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in b.procs]

    def _fn_nvmlDeviceGetEccMode(self, b: Board) -> list[int]:
        return list(b.ecc_mode)

    def _fn_nvmlDeviceGetTotalEccErrors(self, b: Board, error_type: int, counter: int) -> int:
        if not b.ecc_mode[0]:  # the counters exist only while ECC is on
            raise real_nvml.NVMLError(NOT_SUPPORTED)
        wanted = (real_nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, real_nvml.NVML_VOLATILE_ECC)
        return (
            b.ecc_uncorrected_volatile if (error_type, counter) == wanted else b.ecc_other_counters
        )

    def _fn_nvmlDeviceGetRetiredPages(self, b: Board, cause: int) -> list[int]:
        if b.retired is None:
            raise real_nvml.NVMLError(NOT_SUPPORTED)
        return list(b.retired[cause])

    def _fn_nvmlDeviceGetRetiredPagesPendingStatus(self, b: Board) -> int:
        if b.retired is None:
            raise real_nvml.NVMLError(NOT_SUPPORTED)
        return b.retired_pending

    def _fn_nvmlDeviceGetRemappedRows(self, b: Board) -> tuple[int, int, int, int]:
        if b.remapped is None:
            raise real_nvml.NVMLError(NOT_SUPPORTED)
        return b.remapped


def fake_functions(fake: FakePynvml) -> dict[str, Callable[..., Any]]:
    return {n[4:]: getattr(fake, n) for n in dir(type(fake)) if n.startswith("_fn_")}


@pytest.fixture
def use_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakePynvml]]:
    """Install a FakePynvml as ``pynvml``, so ``gpu_checks`` imports it the real way."""

    def install(*boards: Board, **kw: Any) -> FakePynvml:
        fake = FakePynvml(list(boards) or [Board()], **kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    yield install


def on(board: Board, *, missing: tuple[str, ...] = ()) -> tuple[Nvml, Board, FakePynvml]:
    """One check function's arguments: an Nvml over a fake holding only ``board``."""
    fake = FakePynvml([board], missing=missing)
    return Nvml(fake), board, fake


def run_gpu(
    server_pids: set[int] | None = None,
    table: dict[int, Proc] | None = None,
    indices: list[int] | None = None,
) -> dict[str, HygieneCheck]:
    out = gpu.gpu_checks(indices, server_pids or set(), table or {}, util_interval_s=0.0)
    return {c.name: c for c in out}


HEALTH = ("processes", "ecc", "retired_pages", "remapped_rows")
ALL_GPU = (
    "clocks",
    "throttle",
    "power_limit",
    "temperature",
    "persistence",
    *HEALTH,
    "utilization",
)


def proc(pid: int, argv: tuple[str, ...] = ("python",)) -> Proc:
    return Proc(pid, 1, pid, "S", 0, argv)


# -- the fake is nvidia-ml-py's shape ----------------------------------------------------------


def test_fake_functions_exist_in_nvidia_ml_py_with_the_same_parameters() -> None:
    """A fake that took other arguments than the real pynvml would let a wrong call pass."""
    fake = FakePynvml([Board()])
    for name, fn in fake_functions(fake).items():
        real = getattr(real_nvml, name, None)
        assert callable(real), f"{name} is not in nvidia-ml-py"
        required = [p for p in inspect.signature(real).parameters.values() if p.default is p.empty]
        assert len(inspect.signature(fn).parameters) == len(required), name
    assert fake.NVMLError is real_nvml.NVMLError
    err = real_nvml.NVMLError(NOT_SUPPORTED)
    assert type(err) is real_nvml.NVMLError_NotSupported and str(err) == "Not Supported"


def test_every_nvml_name_gpu_health_calls_is_in_nvidia_ml_py() -> None:
    """A misspelt getter would read "not in this pynvml" (unknown) on every real GPU forever."""
    src = Path(gpu_health.__file__).read_text()
    names = set(re.findall(r'"(nvml\w+)"', src))
    assert names == {
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
    }
    assert all(callable(getattr(real_nvml, n, None)) for n in names)
    assert gpu_health.ECC_UNCORRECTED == real_nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert gpu_health.ECC_VOLATILE == real_nvml.NVML_VOLATILE_ECC


# -- a healthy GPU -------------------------------------------------------------------------------


def test_healthy_pre_ampere_gpu_is_ok_on_every_health_check() -> None:
    """The quiet case, read value by value: a check that warned or guessed here would cry wolf."""
    nv, h, fake = on(pre_ampere(remapped=(0, 0, 0, 0)))
    got = [
        processes(nv, h, "gpu0", {100}, {}),
        ecc(nv, h, "gpu0"),
        retired_pages(nv, h, "gpu0"),
        remapped_rows(nv, h, "gpu0"),
    ]
    assert [c.to_dict() for c in got] == [
        {
            "name": "gpu0.processes",
            "status": "ok",
            "value": {"processes": []},
            "detail": "no compute process on the GPU",
            "spoils": False,
        },
        {
            "name": "gpu0.ecc",
            "status": "ok",
            "value": {"enabled": True, "pending": True, "volatile_uncorrected": 0},
            "detail": "ECC on, 0 volatile uncorrected error(s)",
            "spoils": False,
        },
        {
            "name": "gpu0.retired_pages",
            "status": "ok",
            "value": {"single_bit": 0, "double_bit": 0, "pending": False},
            "detail": "0 single-bit, 0 double-bit retired page(s)",
            "spoils": False,
        },
        {
            "name": "gpu0.remapped_rows",
            "status": "ok",
            "value": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
            "detail": "0 correctable, 0 uncorrectable remapped row(s)",
            "spoils": False,
        },
    ]
    assert fake.called("nvmlDeviceGetTotalEccErrors") == [
        (h, real_nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, real_nvml.NVML_VOLATILE_ECC)
    ]
    assert sorted(a[1] for a in fake.called("nvmlDeviceGetRetiredPages")) == [SBE, DBE]


def test_healthy_h200_through_gpu_checks(use_nvml: Callable[..., FakePynvml]) -> None:
    """Every check name, in order; Hopper's NotSupported retired pages are unknown, not a fault."""
    fake = use_nvml(Board())
    c = run_gpu()
    assert list(c) == [f"gpu0.{n}" for n in ALL_GPU]
    assert {n: x.status for n, x in c.items() if x.status != "ok"} == {
        "gpu0.retired_pages": "unknown"
    }
    assert c["gpu0.retired_pages"].value is None
    assert c["gpu0.retired_pages"].detail == (
        "nvmlDeviceGetRetiredPages: Not Supported (GPUs from Ampere on remap rows instead)"
    )
    assert not any(x.noisy for x in c.values())
    assert fake.calls[0][0] == "nvmlInit" and fake.calls[-1][0] == "nvmlShutdown"


# -- ECC -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "errors", "status", "detail"),
    [
        ((1, 1), 0, "ok", "ECC on, 0 volatile uncorrected error(s)"),
        ((0, 0), 0, "ok", "ECC off"),
        (
            (1, 1),
            3,
            "warn",
            "ECC on, 3 volatile uncorrected error(s) since the driver loaded: the GPU memory "
            "is failing; its results may be wrong",
        ),
        ((0, 1), 0, "warn", "ECC off; a change to on waits for reboot"),
        (
            (1, 0),
            0,
            "warn",
            "ECC on, 0 volatile uncorrected error(s); a change to off waits for reboot",
        ),
        # failing memory outranks a pending mode change
        ((1, 0), 1, "warn", "ECC on, 1 volatile uncorrected error(s) since the driver loaded"),
    ],
)
def test_ecc_states(mode: tuple[int, int], errors: int, status: str, detail: str) -> None:
    """Each ECC reading on its own: the status, and the count in the words a reader sees."""
    nv, h, _ = on(Board(ecc_mode=mode, ecc_uncorrected_volatile=errors))
    c = ecc(nv, h, "gpu5")
    assert c.name == "gpu5.ecc" and c.status == status
    assert c.detail.startswith(detail)
    assert c.value == {
        "enabled": bool(mode[0]),
        "pending": bool(mode[1]),
        "volatile_uncorrected": errors if mode[0] else None,
    }
    assert {type(c.value[k]) for k in ("enabled", "pending")} == {bool}
    assert not c.spoils  # a memory fault is reported, not a "noisy machine"


def test_ecc_reads_only_the_volatile_uncorrected_counter() -> None:
    """Corrected or lifetime counts are large on a healthy board: reading one would cry wolf."""
    nv, h, _ = on(Board(ecc_uncorrected_volatile=0, ecc_other_counters=10_000))
    c = ecc(nv, h, "gpu0")
    assert c.status == "ok" and c.value["volatile_uncorrected"] == 0


def test_ecc_not_supported_is_unknown_with_nvmls_reason() -> None:
    """A board without ECC (GeForce) is not an unhealthy one."""
    nv, h, fake = on(Board(fail={"nvmlDeviceGetEccMode": NOT_SUPPORTED}))
    c = ecc(nv, h, "gpu1")
    assert (c.name, c.status, c.value) == ("gpu1.ecc", "unknown", None)
    assert c.detail == "nvmlDeviceGetEccMode: Not Supported"
    assert fake.called("nvmlDeviceGetTotalEccErrors") == []


def test_ecc_on_with_an_unreadable_count_is_unknown_not_ok() -> None:
    """ECC on but its error count refused: "ok" would vouch for memory nobody read."""
    nv, h, _ = on(Board(fail={"nvmlDeviceGetTotalEccErrors": UNKNOWN_ERROR}))
    c = ecc(nv, h, "gpu0")
    assert c.status == "unknown"
    assert c.value == {"enabled": True, "pending": True, "volatile_uncorrected": None}
    assert c.detail == (
        "ECC on, uncorrected errors unknown (nvmlDeviceGetTotalEccErrors: Unknown Error)"
    )


# -- retired pages (before Ampere) ---------------------------------------------------------------


def test_retired_pages_pending_warns_with_the_counts() -> None:
    """A pending retirement means the memory is in use with a bad page: reset before measuring."""
    nv, h, _ = on(pre_ampere(retired={SBE: [0x10, 0x20], DBE: [0x30]}, retired_pending=1))
    c = retired_pages(nv, h, "gpu2")
    assert (c.name, c.status, c.spoils) == ("gpu2.retired_pages", "warn", False)
    assert c.value == {"single_bit": 2, "double_bit": 1, "pending": True}
    assert c.detail == (
        "2 single-bit, 1 double-bit retired page(s); a retirement is pending: reset the GPU"
    )


def test_retired_pages_without_pending_are_ok_and_causes_are_not_swapped() -> None:
    """Retired pages are the mechanism working; the two causes must land in their own fields."""
    nv, h, _ = on(pre_ampere(retired={SBE: [1, 2, 3], DBE: []}))
    c = retired_pages(nv, h, "gpu0")
    assert c.status == "ok" and c.value == {"single_bit": 3, "double_bit": 0, "pending": False}
    assert c.detail == "3 single-bit, 0 double-bit retired page(s)"


def test_one_retired_page_read_failing_is_not_reported_as_zero() -> None:
    """An unread count must not become a made-up 0 that says "healthy"."""
    fail: dict[str | tuple[str, int], int] = {("nvmlDeviceGetRetiredPages", SBE): GPU_IS_LOST}
    nv, h, _ = on(pre_ampere(retired={SBE: [], DBE: [7, 8]}, fail=fail))
    c = retired_pages(nv, h, "gpu3")
    assert c.status == "unknown"
    assert c.value == {"single_bit": None, "double_bit": 2, "pending": False}
    assert c.detail == (
        "? single-bit, 2 double-bit retired page(s); nvmlDeviceGetRetiredPages: GPU is lost"
    )


def test_unreadable_pending_status_is_unknown() -> None:
    """The pending flag is the warning's whole basis: unread, the check cannot say "ok"."""
    fail: dict[str | tuple[str, int], int] = {
        "nvmlDeviceGetRetiredPagesPendingStatus": UNKNOWN_ERROR
    }
    nv, h, _ = on(pre_ampere(fail=fail))
    c = retired_pages(nv, h, "gpu0")
    assert c.status == "unknown"
    assert c.value == {"single_bit": 0, "double_bit": 0, "pending": None}
    assert c.detail.endswith("; nvmlDeviceGetRetiredPagesPendingStatus: Unknown Error")


def test_retired_pages_pending_still_warns_when_a_count_is_unread() -> None:
    """A known pending retirement outranks a count that could not be read."""
    fail: dict[str | tuple[str, int], int] = {("nvmlDeviceGetRetiredPages", DBE): UNKNOWN_ERROR}
    nv, h, _ = on(pre_ampere(retired={SBE: [1], DBE: []}, retired_pending=1, fail=fail))
    c = retired_pages(nv, h, "gpu0")
    assert c.status == "warn" and c.value["double_bit"] is None
    assert c.detail.startswith("1 single-bit, ? double-bit retired page(s); a retirement is")


# -- remapped rows (Ampere on) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "status", "tail"),
    [
        ((0, 0, 0, 0), "ok", ""),
        ((5, 2, 0, 0), "ok", ""),  # rows remapped and done: the mechanism working
        ((0, 1, 1, 0), "warn", "; a remapping is pending: reset the GPU"),
        ((0, 1, 0, 1), "warn", "; a remapping FAILED: the GPU needs service"),
        ((3, 4, 1, 1), "warn", "; a remapping FAILED: the GPU needs service"),  # failure first
    ],
)
def test_remapped_rows_states(rows: tuple[int, int, int, int], status: str, tail: str) -> None:
    """Each remapping state, with both counts in the detail and the flags in the value."""
    nv, h, _ = on(Board(remapped=rows))
    c = remapped_rows(nv, h, "gpu7")
    assert (c.name, c.status, c.spoils) == ("gpu7.remapped_rows", status, False)
    corr, unc, pending, failure = rows
    assert c.value == {
        "correctable": corr,
        "uncorrectable": unc,
        "pending": bool(pending),
        "failure": bool(failure),
    }
    assert {type(c.value[k]) for k in ("pending", "failure")} == {bool}  # JSON true, not 1
    assert c.detail == f"{corr} correctable, {unc} uncorrectable remapped row(s){tail}"


def test_remapped_rows_not_supported_before_ampere_is_unknown() -> None:
    nv, h, _ = on(pre_ampere())
    c = remapped_rows(nv, h, "gpu0")
    assert (c.status, c.value, c.detail) == (
        "unknown",
        None,
        "nvmlDeviceGetRemappedRows: Not Supported",
    )


def test_a_pynvml_without_the_getter_is_unknown_not_a_crash() -> None:
    """An older nvidia-ml-py lacks newer getters: say so rather than raise AttributeError."""
    nv, h, _ = on(Board(), missing=("nvmlDeviceGetRemappedRows",))
    c = remapped_rows(nv, h, "gpu0")
    assert c.status == "unknown" and c.detail == "nvmlDeviceGetRemappedRows: not in this pynvml"


# -- compute processes ---------------------------------------------------------------------------


def test_process_rows_have_every_field_and_a_foreign_one_spoils() -> None:
    """The recorded rows are the result's evidence: pid, memory, whose, and the command."""
    board = Board(procs=[(100, 2 * GIB), (555, None), (4242, 3 * GIB)])
    nv, h, _ = on(board)
    table = {100: proc(100), 555: proc(555, ("python", "train.py", "--big"))}
    c = processes(nv, h, "gpu1", {100}, table)
    assert (c.name, c.status, c.spoils, c.noisy) == ("gpu1.processes", "warn", True, True)
    assert c.value == {
        "processes": [
            {"pid": 100, "used_bytes": 2 * GIB, "kind": "server", "cmdline": "python"},
            {"pid": 555, "used_bytes": None, "kind": "other", "cmdline": "python train.py --big"},
            {"pid": 4242, "used_bytes": 3 * GIB, "kind": "not_visible", "cmdline": None},
        ]
    }
    assert c.detail == (
        "2 compute process(es) besides the server's on the GPU: "
        "pid 555 (memory n/a, python train.py --big); pid 4242 (3.0 GiB)"
    )


def test_processes_not_supported_is_unknown() -> None:
    nv, h, _ = on(Board(fail={"nvmlDeviceGetComputeRunningProcesses": NOT_SUPPORTED}))
    c = processes(nv, h, "gpu0", {1}, {})
    assert (c.status, c.value, c.noisy) == ("unknown", None, False)
    assert c.detail == "nvmlDeviceGetComputeRunningProcesses: Not Supported"


def test_long_command_lines_are_cut_in_the_value_and_the_text() -> None:
    """A 10 kB command line would swamp the report: 160 characters kept, 60 shown."""
    argv = ("python", "x" * 500)
    row = GpuProcess(9, GIB, "other", " ".join(argv)[:160])
    nv, h, _ = on(Board(procs=[(9, GIB)]))
    c = processes(nv, h, "gpu0", set(), {9: proc(9, argv)})
    assert c.value["processes"][0]["cmdline"] == row.cmdline and len(row.cmdline or "") == 160
    assert row.text() == f"pid 9 (1.0 GiB, python {'x' * 53})"
    assert row.text() in c.detail


# -- one call failing, several GPUs, the report --------------------------------------------------


def test_an_unexpected_nvml_error_loses_only_its_own_check(
    use_nvml: Callable[..., FakePynvml],
) -> None:
    """GPU-is-lost on the ECC read must not take the remapping failure down with it."""
    use_nvml(Board(remapped=(0, 1, 0, 1), fail={"nvmlDeviceGetEccMode": GPU_IS_LOST}))
    c = run_gpu()
    assert list(c) == [f"gpu0.{n}" for n in ALL_GPU]
    assert c["gpu0.ecc"].status == "unknown"
    assert c["gpu0.ecc"].detail == "nvmlDeviceGetEccMode: GPU is lost"
    assert c["gpu0.remapped_rows"].status == "warn" and "FAILED" in c["gpu0.remapped_rows"].detail
    assert c["gpu0.processes"].status == "ok" and c["gpu0.persistence"].status == "ok"


def test_several_gpus_each_report_their_own_fault(use_nvml: Callable[..., FakePynvml]) -> None:
    """A fault on one GPU is named by that GPU's index, and the others stay clean."""
    use_nvml(
        Board(ecc_uncorrected_volatile=4),
        Board(),
        Board(remapped=(1, 0, 1, 0), persistence=real_nvml.NVML_FEATURE_DISABLED),
        pre_ampere(retired={SBE: [], DBE: [1]}, retired_pending=1),
    )
    c = run_gpu()
    assert list(c) == [f"gpu{i}.{n}" for i in range(4) for n in ALL_GPU]
    warns = {n: x.detail for n, x in c.items() if x.status == "warn"}
    assert set(warns) == {
        "gpu0.ecc",
        "gpu2.remapped_rows",
        "gpu2.persistence",
        "gpu3.retired_pages",
    }
    assert "4 volatile uncorrected error(s)" in warns["gpu0.ecc"]
    assert warns["gpu2.remapped_rows"].startswith("1 correctable, 0 uncorrectable")
    assert warns["gpu2.persistence"].startswith("persistence mode off")
    assert warns["gpu3.retired_pages"].startswith("0 single-bit, 1 double-bit")
    assert c["gpu3.remapped_rows"].status == "unknown"  # pre-Ampere: NotSupported


def test_only_the_requested_gpus_in_the_requested_order(
    use_nvml: Callable[..., FakePynvml],
) -> None:
    """The server's GPUs only: a fault on a GPU it does not use is not its problem."""
    fake = use_nvml(Board(), Board(ecc_uncorrected_volatile=9), Board(remapped=(0, 0, 1, 0)))
    c = run_gpu(indices=[2, 0])
    assert [n.split(".")[0] for n in c][:: len(ALL_GPU)] == ["gpu2", "gpu0"]
    assert "gpu1.ecc" not in c and c["gpu2.remapped_rows"].status == "warn"
    assert [a for (a,) in fake.called("nvmlDeviceGetHandleByIndex")] == [2, 0]


def test_health_warnings_do_not_make_the_machine_noisy_but_a_stranger_does(
    use_nvml: Callable[..., FakePynvml],
) -> None:
    """Failing memory is reported; only a foreign process on the GPU spoils the numbers."""
    use_nvml(
        Board(ecc_mode=(1, 0), ecc_uncorrected_volatile=2, remapped=(0, 0, 1, 1)),
        Board(procs=[(555, GIB)]),
    )
    c = run_gpu(server_pids={100}, table={555: proc(555)})
    report = HygieneReport(list(c.values()), taken_at=1.0, sample_s=0.0)
    assert report.noisy == [f"gpu1.processes: {c['gpu1.processes'].detail}"]
    assert report.counts()["warn"] == 3  # gpu0.ecc, gpu0.remapped_rows, gpu1.processes
    back = HygieneReport.from_dict(report.to_dict())
    assert back.check("gpu0.ecc") == c["gpu0.ecc"]
    assert back.check("gpu0.remapped_rows") == c["gpu0.remapped_rows"]
