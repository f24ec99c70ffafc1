"""What hardware a run is on: the GPUs NVML sees and the rated HBM bandwidth of each kind.

Why a table: MBU needs the bandwidth the vendor rates, which no driver API reports. Names are
matched after normalisation because NVML and ROCm spell the same part many ways
("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "AMD Instinct MI300X").

NVML helpers live here (not in ``energy``) so both the energy meter and the hardware key share
one way of treating "no NVML" as a normal state. ``pynvml`` is imported inside functions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf.errors import UsageError

BANDWIDTH_OPTION = "--moeperf-hbm-bandwidth"

# (label, pattern on the normalised name, rated bytes/s). Most specific first: the first match wins.
_RATED: list[tuple[str, str, float]] = [
    ("GH200 144GB", r"\bGH200\b.*\b144GB\b", 4.9e12),
    ("GH200", r"\bGH200\b", 4.0e12),
    ("GB200", r"\bGB200\b", 8.0e12),
    ("B200", r"\bB200\b", 8.0e12),
    ("B100", r"\bB100\b", 8.0e12),
    ("H200", r"\bH200\b", 4.8e12),
    ("H100 PCIe", r"\bH100\b.*\bPCIE\b", 2.0e12),
    ("H100 NVL", r"\bH100\b.*\bNVL\b", 3.9e12),
    ("H100 SXM", r"\bH100\b", 3.35e12),
    ("H800 PCIe", r"\bH800\b.*\bPCIE\b", 2.0e12),
    ("H800 SXM", r"\bH800\b", 3.35e12),
    ("H20", r"\bH20\b", 4.0e12),
    ("A100 80GB PCIe", r"\bA100\b(?=.*\bPCIE\b)(?=.*\b80GB\b)", 1.935e12),
    ("A100 40GB", r"\bA100\b.*\b40GB\b", 1.555e12),
    ("A100 80GB (SXM)", r"\bA100\b.*\b80GB\b", 2.039e12),
    ("A800 80GB (SXM)", r"\bA800\b.*\b80GB\b", 2.039e12),
    ("L40S", r"\bL40S\b", 0.864e12),
    ("L40", r"\bL40\b", 0.864e12),
    ("L4", r"\bL4\b", 0.3e12),
    ("A10G", r"\bA10G\b", 0.6e12),
    ("A10", r"\bA10\b", 0.6e12),
    ("MI325X", r"\bMI325X\b", 6.0e12),
    ("MI300X", r"\bMI300X\b", 5.3e12),
    ("MI300A", r"\bMI300A\b", 5.3e12),
    ("MI250X", r"\bMI250X\b", 3.2768e12),
    ("MI250", r"\bMI250\b", 3.2768e12),
    ("MI210", r"\bMI210\b", 1.6384e12),
    ("RX 7900 XTX", r"\bRX 7900 XTX\b", 0.96e12),
    ("RX 7900 XT", r"\bRX 7900 XT\b", 0.8e12),
]


def normalise_device_name(name: str) -> str:
    """Upper case, '-' and '_' as spaces, single spaces: 'A100-SXM4-80GB' -> 'A100 SXM4 80GB'."""
    return " ".join(re.sub(r"[-_]", " ", name.upper()).split())


def match_device(name: str) -> tuple[str, float] | None:
    """(table label, rated bytes/s) for a driver-reported device name, or None if unknown."""
    norm = normalise_device_name(name)
    for label, pattern, bw in _RATED:
        if re.search(pattern, norm):
            return label, bw
    return None


def rated_bandwidth(name: str, override: float | None = None) -> tuple[float | None, str]:
    """(bytes/s, source) where source is 'table: <label>' or 'override'; (None, reason) if unknown.

    An override wins over the table (for a part missing from it or a clock-capped board).
    """
    if override is not None:
        _check_bandwidth(override, BANDWIDTH_OPTION)
        return float(override), "override"
    hit = match_device(name)
    if hit is None:
        return None, (
            f"rated HBM bandwidth of {name!r} is not in the table; "
            f"set {BANDWIDTH_OPTION}=<bytes/s, e.g. 4.8e12 or 4.8TB/s> to compute MBU"
        )
    label, bw = hit
    return bw, f"table: {label}"


def _check_bandwidth(value: float, source: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(
            source, "HBM bandwidth", value, "not a number", "give bytes/s, e.g. 4.8e12 or 4.8TB/s"
        )
    if not math.isfinite(value) or value <= 0:
        raise UsageError(
            source,
            "HBM bandwidth",
            value,
            "bandwidth must be a positive finite number of bytes/s",
            "give bytes/s, e.g. 4.8e12 or 4.8TB/s",
        )


_UNITS = {"": 1.0, "B/S": 1.0, "GB/S": 1e9, "TB/S": 1e12, "GIB/S": 2.0**30, "TIB/S": 2.0**40}


def parse_bandwidth(text: str, source: str = BANDWIDTH_OPTION) -> float:
    """'4.8e12', '4.8TB/s', '4800 GB/s' -> bytes/s; for the command-line option."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z/]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise UsageError(
            source,
            "HBM bandwidth",
            text,
            "not a number of bytes/s with an optional unit (GB/s, TB/s, GiB/s, TiB/s)",
            "write e.g. 4.8e12 or 4.8TB/s",
        )
    try:
        value = float(m.group(1)) * _UNITS[unit]
    except ValueError:
        raise UsageError(
            source, "HBM bandwidth", text, "the number does not parse", "write e.g. 4.8TB/s"
        ) from None
    _check_bandwidth(value, source)
    return value


# ---- NVML access shared with the energy meter --------------------------------------------------


class _NeverRaised(Exception):
    """Stands in for an NVMLError subclass that this pynvml version does not define."""


def import_pynvml() -> tuple[Any, str | None]:
    """(module, None) or (None, reason); NVML missing is a normal state, not an error."""
    try:
        import pynvml
    except ImportError as e:
        return None, f"pynvml (package nvidia-ml-py) is not importable: {e}"
    return pynvml, None


def nvml_error(nvml: Any, name: str = "NVMLError") -> type[BaseException]:
    """The pynvml exception class ``name``, or one that is never raised if it does not exist."""
    cls = getattr(nvml, name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls
    return _NeverRaised


def init_nvml(nvml: Any) -> str | None:
    """nvmlInit(); None on success, else the reason NVML cannot be used."""
    try:
        nvml.nvmlInit()
    except nvml_error(nvml, "NVMLError_LibraryNotFound") as e:
        return f"NVML library not found (no NVIDIA driver on this machine): {e}"
    except nvml_error(nvml) as e:
        return f"nvmlInit failed: {e}"
    return None


def shutdown_nvml(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml_error(nvml):
        pass


@dataclass
class GpuInfo:
    """One GPU as NVML describes it, for the hardware key; None where NVML cannot say.

    Clocks are only read, never set: locking clocks is the operator's decision.
    """

    index: int
    name: str
    uuid: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    memory_total_bytes: int | None
    power_limit_w: float | None
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    sm_clock_app_mhz: int | None
    mem_clock_app_mhz: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _call(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None when NVML raises (NotSupported on this board, say)."""
    try:
        return fn(*args)
    except nvml_error(nvml):
        return None


def _cuda_version(v: Any) -> str | None:
    return None if v is None else f"{int(v) // 1000}.{(int(v) % 1000) // 10}"


def visible_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees, in physical order; an empty list without NVML or on NVML failure."""
    nvml, _ = import_pynvml()
    if nvml is None or init_nvml(nvml) is not None:
        return []
    try:
        return _read_gpus(nvml)
    except nvml_error(nvml):
        return []
    finally:
        shutdown_nvml(nvml)


def _read_gpus(nvml: Any) -> list[GpuInfo]:
    driver = _call(nvml, nvml.nvmlSystemGetDriverVersion)
    cuda = _cuda_version(_call(nvml, nvml.nvmlSystemGetCudaDriverVersion))
    sm, mem = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
    out: list[GpuInfo] = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        meminfo = _call(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
        limit_mw = _call(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        uuid = _call(nvml, nvml.nvmlDeviceGetUUID, h)
        out.append(
            GpuInfo(
                index=i,
                name=_text(nvml.nvmlDeviceGetName(h)),
                uuid=None if uuid is None else _text(uuid),
                driver_version=None if driver is None else _text(driver),
                cuda_driver_version=cuda,
                memory_total_bytes=None if meminfo is None else int(meminfo.total),
                power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
                sm_clock_max_mhz=_call(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, sm),
                mem_clock_max_mhz=_call(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, mem),
                sm_clock_app_mhz=_call(nvml, nvml.nvmlDeviceGetApplicationsClock, h, sm),
                mem_clock_app_mhz=_call(nvml, nvml.nvmlDeviceGetApplicationsClock, h, mem),
            )
        )
    return out
