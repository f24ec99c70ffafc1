"""GPU checks of who else is on the GPU and of its memory's health: compute processes, ECC,
retired pages (before Ampere) and remapped rows (Ampere on).

Why apart from the clock and power checks: these judge the machine's state rather than its
settings, and a process check needs to know the server's own processes (from /proc).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf.hygiene.host import Proc
from pytest_moeperf.hygiene.model import OK, UNKNOWN, WARN, HygieneCheck
from pytest_moeperf.hygiene.nvml import GIB, Nvml

ECC_UNCORRECTED, ECC_VOLATILE = 1, 0  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    kind: str  # "server" | "other" | "not_visible" (a pid of another PID namespace)
    cmdline: str | None

    def text(self) -> str:
        mem = "memory n/a" if self.used_bytes is None else f"{self.used_bytes / GIB:.1f} GiB"
        return f"pid {self.pid} ({mem}" + (f", {self.cmdline[:60]}" if self.cmdline else "") + ")"


def processes(
    nv: Nvml, h: Any, p: str, server_pids: set[int] | None, table: dict[int, Proc]
) -> HygieneCheck:
    """Compute processes on the GPU other than the server's; pids NVML gives from another PID
    namespace (a container) cannot be told apart, and say so."""
    procs, err = nv.get("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None:
        return HygieneCheck(f"{p}.processes", UNKNOWN, None, str(err))
    rows = []
    for x in procs:
        pid, mem = int(x.pid), getattr(x, "usedGpuMemory", None)
        seen = table.get(pid)
        if server_pids is not None and pid in server_pids:
            kind = "server"
        else:
            kind = "other" if seen is not None else "not_visible"
        cmd = " ".join(seen.argv)[:160] if seen else None
        rows.append(GpuProcess(pid, None if mem is None else int(mem), kind, cmd))
    value = {"processes": [asdict(r) for r in rows]}
    if not rows:
        return HygieneCheck(f"{p}.processes", OK, value, "no compute process on the GPU")
    n_server = sum(r.kind == "server" for r in rows)
    listing = "; ".join(r.text() for r in rows if r.kind != "server")
    if server_pids is None:
        why = f"server processes unknown (external server): {listing}"
        return HygieneCheck(f"{p}.processes", UNKNOWN, value, why)
    n_other = sum(r.kind == "other" for r in rows)
    n_hidden = sum(r.kind == "not_visible" for r in rows)
    if n_other or (n_hidden and n_server):  # ours are visible here, so hidden ones are not ours
        why = f"{n_other + n_hidden} compute process(es) besides the server's on the GPU: {listing}"
        return HygieneCheck(f"{p}.processes", WARN, value, why, spoils=True)
    if n_hidden:
        why = (
            "pids not visible here (another PID namespace?), so whether they are the "
            f"server's is unknown: {listing}"
        )
        return HygieneCheck(f"{p}.processes", UNKNOWN, value, why)
    why = f"only the server's {n_server} process(es) on the GPU"
    return HygieneCheck(f"{p}.processes", OK, value, why)


def ecc(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    mode, err = nv.get("nvmlDeviceGetEccMode", h)
    if mode is None:
        return HygieneCheck(f"{p}.ecc", UNKNOWN, None, str(err))
    cur, pending = int(mode[0]), int(mode[1])
    unc, err2 = nv.get("nvmlDeviceGetTotalEccErrors", h, ECC_UNCORRECTED, ECC_VOLATILE)
    value = {"enabled": bool(cur), "pending": bool(pending), "volatile_uncorrected": unc}
    text = f"ECC {'on' if cur else 'off'}"
    if cur and unc is None:
        text += f", uncorrected errors unknown ({err2})"
    elif cur:
        text += f", {unc} volatile uncorrected error(s)"
    if cur and unc:
        return HygieneCheck(
            f"{p}.ecc",
            WARN,
            value,
            text + " since the driver loaded: the GPU memory is failing; its results may be wrong",
        )
    if pending != cur:
        return HygieneCheck(
            f"{p}.ecc",
            WARN,
            value,
            text + f"; a change to {'on' if pending else 'off'} waits for reboot",
        )
    if cur and unc is None:  # ECC on but its error count unread: not a clean bill of health
        return HygieneCheck(f"{p}.ecc", UNKNOWN, value, text)
    return HygieneCheck(f"{p}.ecc", OK, value, text)


def retired_pages(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    """Page retirement (before Ampere); newer GPUs remap rows instead and report NotSupported."""
    sbe, err = nv.get("nvmlDeviceGetRetiredPages", h, 0)  # multiple single-bit ECC errors
    dbe, err2 = nv.get("nvmlDeviceGetRetiredPages", h, 1)  # double-bit ECC error
    pending, err3 = nv.get("nvmlDeviceGetRetiredPagesPendingStatus", h)
    if sbe is None and dbe is None:
        return HygieneCheck(
            f"{p}.retired_pages", UNKNOWN, None, f"{err} (GPUs from Ampere on remap rows instead)"
        )
    value = {  # None: not read (never a made-up 0)
        "single_bit": None if sbe is None else len(sbe),
        "double_bit": None if dbe is None else len(dbe),
        "pending": None if pending is None else bool(pending),
    }
    n1, n2 = ("?" if n is None else n for n in (value["single_bit"], value["double_bit"]))
    text = f"{n1} single-bit, {n2} double-bit retired page(s)"
    if pending:
        return HygieneCheck(
            f"{p}.retired_pages", WARN, value, text + "; a retirement is pending: reset the GPU"
        )
    unread = [e for e in (err, err2, err3) if e]
    if unread:
        return HygieneCheck(f"{p}.retired_pages", UNKNOWN, value, f"{text}; {'; '.join(unread)}")
    return HygieneCheck(f"{p}.retired_pages", OK, value, text)


def remapped_rows(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    rows, err = nv.get("nvmlDeviceGetRemappedRows", h)
    if rows is None:
        return HygieneCheck(f"{p}.remapped_rows", UNKNOWN, None, str(err))
    corr, unc, pending, failure = (int(x) for x in rows)
    value = {
        "correctable": corr,
        "uncorrectable": unc,
        "pending": bool(pending),
        "failure": bool(failure),
    }
    text = f"{corr} correctable, {unc} uncorrectable remapped row(s)"
    if failure:
        return HygieneCheck(
            f"{p}.remapped_rows", WARN, value, text + "; a remapping FAILED: the GPU needs service"
        )
    if pending:
        return HygieneCheck(
            f"{p}.remapped_rows", WARN, value, text + "; a remapping is pending: reset the GPU"
        )
    return HygieneCheck(f"{p}.remapped_rows", OK, value, text)
