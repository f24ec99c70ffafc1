"""GPU checks through NVML, read only: clocks, clock-event (throttle) reasons, power limit,
temperature, persistence, utilization (and, from ``gpu_health``, compute processes, ECC, retired
pages, remapped rows).

Why read only: clocks and power limits are the operator's settings; a test that changed them
would measure a machine nobody runs. So these are only reported, and a setting that would spoil
the numbers (a power cap under the default, application clocks under the default) is a warning.
No NVML setter is ever called. Each call that NVML refuses (NotSupported on this board, a
function this driver lacks) makes that check "unknown" with NVML's reason, never a crash.

NVML functions used (nvidia-ml-py >= 12; the newer name first where one was renamed):
nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetClockInfo,
nvmlDeviceGetMaxClockInfo, nvmlDeviceGetApplicationsClock,
nvmlDeviceGetDefaultApplicationsClock, nvmlDeviceGetCurrentClocksEventReasons (else
nvmlDeviceGetCurrentClocksThrottleReasons), nvmlDeviceGetEnforcedPowerLimit,
nvmlDeviceGetPowerManagementLimit, nvmlDeviceGetPowerManagementDefaultLimit,
nvmlDeviceGetPowerManagementLimitConstraints, nvmlDeviceGetPowerUsage,
nvmlDeviceGetTemperatureV (else nvmlDeviceGetTemperature), nvmlDeviceGetTemperatureThreshold,
nvmlDeviceGetPersistenceMode, nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetEccMode,
nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRetiredPages, nvmlDeviceGetRetiredPagesPendingStatus,
nvmlDeviceGetRemappedRows, nvmlDeviceGetUtilizationRates.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pytest_moeperf.hygiene.gpu_health import ecc, processes, remapped_rows, retired_pages
from pytest_moeperf.hygiene.host import Proc
from pytest_moeperf.hygiene.model import OK, UNKNOWN, WARN, HygieneCheck
from pytest_moeperf.hygiene.nvml import NO_GPU, Nvml
from pytest_moeperf.metrics.hardware import import_pynvml, init_nvml, shutdown_nvml

CLOCK_SM, CLOCK_MEM = 1, 2  # NVML_CLOCK_SM, NVML_CLOCK_MEM
TEMPERATURE_GPU, THRESHOLD_SLOWDOWN = 0, 1  # NVML_TEMPERATURE_GPU, ..._THRESHOLD_SLOWDOWN
# nvmlClocksEventReason* bits (same values as the older nvmlClocksThrottleReason*)
EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
SPOILING_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
BUSY_PCT = 10  # GPU utilization before load above this: something else is computing


def gpu_checks(
    indices: Sequence[int] | None,
    server_pids: set[int] | None,
    table: dict[int, Proc],
    *,
    skip: str | None = None,
    util_samples: int = 3,
    util_interval_s: float = 0.2,
) -> list[HygieneCheck]:
    """Checks of the GPUs ``indices`` (None: every GPU NVML sees).

    ``server_pids`` are the server's processes (not flagged on the GPU); None when they are not
    known (an external server): processes are then listed, not judged. ``skip`` names why the
    GPUs are not checked although NVML works (a CPU-backend server).
    """
    module, why = import_pynvml()
    if module is None:
        return [HygieneCheck("gpu", UNKNOWN, None, f"{NO_GPU}: {why}")]
    failed = init_nvml(module)
    if failed is not None:
        return [HygieneCheck("gpu", UNKNOWN, None, f"{NO_GPU}: {failed}")]
    nv = Nvml(module)
    try:
        count, err = nv.get("nvmlDeviceGetCount")
        if count is None:
            return [HygieneCheck("gpu", UNKNOWN, None, f"nvmlDeviceGetCount failed: {err}")]
        if skip is not None:
            return [HygieneCheck("gpu", UNKNOWN, {"gpus_seen": int(count)}, skip)]
        wanted = range(int(count)) if indices is None else indices
        out: list[HygieneCheck] = []
        for i in wanted:
            h, err = nv.get("nvmlDeviceGetHandleByIndex", i)
            if h is None:
                out.append(HygieneCheck(f"gpu{i}", UNKNOWN, None, f"no handle: {err}"))
                continue
            p = f"gpu{i}"
            out += [
                clocks(nv, h, p),
                throttle(nv, h, p),
                power_limit(nv, h, p),
                temperature(nv, h, p),
                persistence(nv, h, p),
                processes(nv, h, p, server_pids, table),
                ecc(nv, h, p),
                retired_pages(nv, h, p),
                remapped_rows(nv, h, p),
                utilization(nv, h, p, util_samples, util_interval_s),
            ]
        return out
    finally:
        shutdown_nvml(module)


def clocks(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    """Clocks as found; application clocks under their default would cap the SMs under load."""
    v: dict[str, Any] = {}
    errs = []
    for label, kind in (("sm", CLOCK_SM), ("mem", CLOCK_MEM)):
        for key, fn in (
            ("mhz", "nvmlDeviceGetClockInfo"),
            ("max_mhz", "nvmlDeviceGetMaxClockInfo"),
            ("app_mhz", "nvmlDeviceGetApplicationsClock"),
            ("app_default_mhz", "nvmlDeviceGetDefaultApplicationsClock"),
        ):
            v[f"{label}_{key}"], err = nv.get(fn, h, kind)
            if err:
                errs.append(err)
    if all(x is None for x in v.values()):
        return HygieneCheck(f"{p}.clocks", UNKNOWN, v, "; ".join(errs[:2]))
    capped = [
        f"{label} {v[f'{k}_app_mhz']} < default {v[f'{k}_app_default_mhz']} MHz"
        for k, label in (("sm", "SM"), ("mem", "memory"))
        if v[f"{k}_app_mhz"] is not None
        and v[f"{k}_app_default_mhz"] is not None
        and v[f"{k}_app_mhz"] < v[f"{k}_app_default_mhz"]
    ]
    now = (
        f"SM {_n(v['sm_mhz'])}/{_n(v['sm_max_mhz'])} MHz, memory "
        f"{_n(v['mem_mhz'])}/{_n(v['mem_max_mhz'])} MHz now/max"
    )
    if capped:
        return HygieneCheck(
            f"{p}.clocks",
            WARN,
            v,
            f"application clocks set below their default ({', '.join(capped)}; "
            "`nvidia-smi -rac` resets them); " + now,
            spoils=True,
        )
    return HygieneCheck(f"{p}.clocks", OK, v, now + " (an idle GPU clocks down: not a warning)")


def _n(x: object) -> str:
    return "?" if x is None else str(x)


def throttle(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    """Clock-event reasons now: power cap, thermal or hardware slowdown spoil the numbers."""
    bits, err = nv.get(
        ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"], h
    )
    if bits is None:
        return HygieneCheck(f"{p}.throttle", UNKNOWN, None, str(err))
    bits = int(bits)
    names = [n for b, n in EVENT_REASONS.items() if bits & b]
    unknown = bits & ~sum(EVENT_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    value = {"bits": bits, "reasons": names}
    bad = [EVENT_REASONS[b] for b in EVENT_REASONS if bits & b & SPOILING_REASONS]
    if bad:
        return HygieneCheck(
            f"{p}.throttle",
            WARN,
            value,
            f"clocks held down by {', '.join(bad)} before any load",
            spoils=True,
        )
    return HygieneCheck(
        f"{p}.throttle", OK, value, "clock-event reasons: " + (", ".join(names) or "none")
    )


def power_limit(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    """The enforced power limit against the board's default: a cap lowers throughput and tok/J."""
    enforced, e1 = nv.get("nvmlDeviceGetEnforcedPowerLimit", h)
    limit, _ = nv.get("nvmlDeviceGetPowerManagementLimit", h)
    default, e2 = nv.get("nvmlDeviceGetPowerManagementDefaultLimit", h)
    rng, _ = nv.get("nvmlDeviceGetPowerManagementLimitConstraints", h)
    usage, _ = nv.get("nvmlDeviceGetPowerUsage", h)

    def w(mw: Any) -> float | None:
        return None if mw is None else float(mw) / 1000.0

    now = w(enforced if enforced is not None else limit)
    value = {
        "enforced_w": w(enforced),
        "limit_w": w(limit),
        "default_w": w(default),
        "min_w": w(rng[0]) if rng else None,
        "max_w": w(rng[1]) if rng else None,
        "usage_w": w(usage),
    }
    if now is None or value["default_w"] is None:
        return HygieneCheck(
            f"{p}.power_limit",
            UNKNOWN,
            value,
            "; ".join(e for e in (e1, e2) if e) or "power limit not reported",
        )
    text = f"{now:g} W (default {value['default_w']:g} W"
    text += f", range {value['min_w']:g}-{value['max_w']:g} W)" if rng else ")"
    if now < 0.99 * value["default_w"]:
        return HygieneCheck(
            f"{p}.power_limit",
            WARN,
            value,
            f"power limit {text} is below the default: throughput and tok/J "
            "are not comparable with a default board",
            spoils=True,
        )
    return HygieneCheck(f"{p}.power_limit", OK, value, text)


def temperature(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    """A GPU already near its slowdown temperature before load will throttle under load."""
    temp, err = nv.get(
        ["nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"], h, TEMPERATURE_GPU
    )
    slow, _ = nv.get("nvmlDeviceGetTemperatureThreshold", h, THRESHOLD_SLOWDOWN)
    value = {"celsius": temp, "slowdown_celsius": slow}
    if temp is None:
        return HygieneCheck(f"{p}.temperature", UNKNOWN, value, str(err))
    limit = (slow - 10) if slow else 80
    text = f"{temp} C" + (f" (slowdown at {slow} C)" if slow else "")
    if temp >= limit:
        return HygieneCheck(
            f"{p}.temperature",
            WARN,
            value,
            f"{text} before load: it will throttle under load (another job "
            "just ran, or cooling is poor)",
            spoils=True,
        )
    return HygieneCheck(f"{p}.temperature", OK, value, text)


def persistence(nv: Nvml, h: Any, p: str) -> HygieneCheck:
    mode, err = nv.get("nvmlDeviceGetPersistenceMode", h)
    if mode is None:
        return HygieneCheck(f"{p}.persistence", UNKNOWN, None, str(err))
    if int(mode) == 1:
        return HygieneCheck(f"{p}.persistence", OK, "enabled", "persistence mode on")
    return HygieneCheck(
        f"{p}.persistence",
        WARN,
        "disabled",
        "persistence mode off: the driver re-initialises the GPU when no process "
        "holds it (slower starts, state reset between runs); `nvidia-smi -pm 1`",
    )


def utilization(nv: Nvml, h: Any, p: str, samples: int, interval_s: float) -> HygieneCheck:
    """GPU busy before load (the least of a few samples, so one late kernel does not count)."""
    seen = []
    err = None
    for k in range(max(1, samples)):
        if k:
            time.sleep(interval_s)
        u, err = nv.get("nvmlDeviceGetUtilizationRates", h)
        if u is not None:
            seen.append((int(u.gpu), int(u.memory)))
    if not seen:
        return HygieneCheck(f"{p}.utilization", UNKNOWN, None, str(err))
    gpu, mem = min(s[0] for s in seen), min(s[1] for s in seen)
    value = {"gpu_pct": gpu, "memory_pct": mem, "samples": len(seen)}
    text = f"GPU {gpu} %, memory {mem} % busy before load"
    if gpu > BUSY_PCT:
        return HygieneCheck(
            f"{p}.utilization",
            WARN,
            value,
            text + ": something else is computing on it",
            spoils=True,
        )
    return HygieneCheck(f"{p}.utilization", OK, value, text)
