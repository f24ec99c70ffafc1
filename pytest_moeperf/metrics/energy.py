"""GPU board energy over a load run, read through NVML, and the GPUs that identify a hardware key.

Why this shape: a perf comparison that silently reports 0 J (or an exception at the end of a
30-minute run) is worse than none, so every path that cannot measure returns ``joules=None`` and
says why. ``pynvml`` is imported inside functions because this module is imported at pytest
start-up on machines that have no GPU.

NVML device indices are physical indices: NVML ignores ``CUDA_VISIBLE_DEVICES``. ``visible_gpus``
and ``GpuInfo`` live in ``hardware`` and are re-exported here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from pytest_moeperf.errors import UsageError
from pytest_moeperf.metrics.hardware import (
    GpuInfo,
    import_pynvml,
    init_nvml,
    nvml_error,
    shutdown_nvml,
    visible_gpus,
)

__all__ = [
    "EnergyMeter",
    "EnergyReading",
    "GpuInfo",
    "NotMeasuredMeter",
    "NvmlEnergyMeter",
    "make_default_meter",
    "tokens_per_joule",
    "visible_gpus",
]

METHOD_COUNTER = "nvml_total_energy_counter"
METHOD_SAMPLING = "nvml_power_sampling"
METHOD_NOT_MEASURED = "not_measured"
SCOPE_GPU_BOARD = "gpu_board"
SCOPE_NONE = "none"
MIN_SAMPLE_HZ = 10.0


@dataclass
class EnergyReading:
    """Energy used over one measured window. ``joules is None`` means "not measured", never 0.

    ``samples`` counts power samples integrated (0 when only energy counters were read);
    ``device_methods[i]`` is the method used for ``devices[i]``.
    """

    joules: float | None
    seconds: float
    avg_power_w: float | None
    method: str
    scope: str
    devices: list[int] = field(default_factory=list)
    reason: str | None = None
    samples: int = 0
    device_methods: list[str] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.joules is not None

    @property
    def sample_hz(self) -> float | None:
        if self.samples < 2 or self.seconds <= 0:
            return None
        return (self.samples - 1) / self.seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnergyReading:
        return cls(**d)


class EnergyMeter(Protocol):
    """Anything that can bracket a load run: the NVML meter, or a plugged-in wall-power meter."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> EnergyReading: ...


def not_measured(reason: str, seconds: float = 0.0, devices: Sequence[int] = ()) -> EnergyReading:
    return EnergyReading(
        joules=None,
        seconds=seconds,
        avg_power_w=None,
        method=METHOD_NOT_MEASURED,
        scope=SCOPE_NONE,
        devices=list(devices),
        reason=reason,
        samples=0,
    )


class NotMeasuredMeter:
    """The meter used where nothing can be measured; it still times the window."""

    name = METHOD_NOT_MEASURED

    def __init__(self, reason: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.reason = reason
        self._clock = clock
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = self._clock()

    def stop(self) -> EnergyReading:
        seconds = 0.0 if self._t0 is None else self._clock() - self._t0
        self._t0 = None
        return not_measured(self.reason, seconds)


class _PowerSampler(threading.Thread):
    """Samples board power of some devices on a fixed period; keeps the first NVML error."""

    def __init__(
        self, nvml: Any, handles: list[Any], interval_s: float, clock: Callable[[], float]
    ) -> None:
        super().__init__(name="moeperf-power-sampler", daemon=True)
        self._nvml = nvml
        self._handles = handles
        self._interval_s = interval_s
        self._clock = clock
        self._halt = threading.Event()
        self.times: list[float] = []
        self.watts: list[list[float]] = []
        self.error: str | None = None

    def sample_once(self) -> bool:
        if self.error is not None:
            return False
        try:
            t = self._clock()
            w = [self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in self._handles]
        except nvml_error(self._nvml) as e:
            self.error = f"nvmlDeviceGetPowerUsage failed: {e}"
            return False
        self.times.append(t)
        self.watts.append(w)
        return True

    def run(self) -> None:
        # Absolute deadlines, not wait(interval) after each sample: under GIL contention from the
        # load generator a relative wait drifts well below the nominal rate.
        next_t = time.monotonic() + self._interval_s
        while not self._halt.wait(max(0.0, next_t - time.monotonic())):
            if not self.sample_once():
                return
            next_t = max(next_t + self._interval_s, time.monotonic() - self._interval_s)

    def halt(self) -> None:
        self._halt.set()
        self.join()

    def joules_per_device(self) -> list[float]:
        """Trapezoid integral of each device's power over the sample times."""
        n_dev = len(self._handles)
        total = [0.0] * n_dev
        for i in range(1, len(self.times)):
            dt = self.times[i] - self.times[i - 1]
            for d in range(n_dev):
                total[d] += 0.5 * (self.watts[i][d] + self.watts[i - 1][d]) * dt
        return total


class NvmlEnergyMeter:
    """Board energy of every GPU the server uses, from NVML.

    Prefers the total-energy counter (mJ since driver load, exact for the window); a device that
    lacks it (pre-Volta, some virtualised GPUs) is sampled with ``nvmlDeviceGetPowerUsage`` at
    ``1 / sample_interval_s`` Hz and integrated with the trapezoid rule.
    """

    name = "nvml"

    def __init__(
        self,
        device_indices: Sequence[int],
        sample_interval_s: float = 0.05,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        devices = list(device_indices)
        for d in devices:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise UsageError(
                    "NvmlEnergyMeter",
                    "device_indices",
                    list(device_indices),
                    f"{d!r} is not a non-negative integer NVML device index",
                    "pass the physical GPU indices the server runs on, e.g. [0, 1]",
                )
        if len(set(devices)) != len(devices):
            raise UsageError(
                "NvmlEnergyMeter",
                "device_indices",
                devices,
                "a device is listed twice, so its energy would be counted twice",
                "list each GPU index once",
            )
        if not 0 < sample_interval_s <= 1.0 / MIN_SAMPLE_HZ:
            raise UsageError(
                "NvmlEnergyMeter",
                "sample_interval_s",
                sample_interval_s,
                f"power sampling must run at >= {MIN_SAMPLE_HZ:g} Hz to integrate load bursts",
                f"use a value in (0, {1.0 / MIN_SAMPLE_HZ:g}]",
            )
        self.devices = devices
        self.sample_interval_s = sample_interval_s
        self._clock = clock
        self._reset()

    def _reset(self) -> None:
        self._running = False
        self._nvml: Any = None
        self._fail: str | None = None
        self._t0 = 0.0
        self._counter_handles: dict[int, Any] = {}
        self._counter_start: dict[int, int] = {}
        self._sampled: list[int] = []
        self._sampler: _PowerSampler | None = None
        self._fallback_reason: str | None = None

    def start(self) -> None:
        if self._running:
            raise RuntimeError("NvmlEnergyMeter.start() called twice without stop()")
        self._reset()
        self._running = True
        self._t0 = self._clock()
        if not self.devices:
            self._fail = "no GPU devices were given to measure (the server runs on no GPU)"
            return
        nvml, reason = import_pynvml()
        if nvml is None:
            self._fail = reason
            return
        reason = init_nvml(nvml)
        if reason is not None:
            self._fail = reason
            return
        self._nvml = nvml
        try:
            self._open_devices(nvml)
        except nvml_error(nvml) as e:
            self._fail = f"NVML failed while opening the devices: {e}"
        except UsageError:
            shutdown_nvml(nvml)
            self._nvml = None
            self._running = False
            raise

    def _open_devices(self, nvml: Any) -> None:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            self._fail = "NVML reports no GPU devices"
            return
        bad = [d for d in self.devices if d >= count]
        if bad:
            raise UsageError(
                "NvmlEnergyMeter",
                "device_indices",
                self.devices,
                f"NVML sees {count} device(s) (indices 0..{count - 1}); {bad} do not exist",
                "pass physical indices as NVML numbers them (nvidia-smi -L lists them)",
            )
        not_supported = nvml_error(nvml, "NVMLError_NotSupported")
        sample_handles: list[Any] = []
        self._t0 = self._clock()  # nvmlInit can take seconds: the window starts at the first read
        for d in self.devices:
            h = nvml.nvmlDeviceGetHandleByIndex(d)
            try:
                self._counter_start[d] = int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
                self._counter_handles[d] = h
            except not_supported:
                self._sampled.append(d)
                sample_handles.append(h)
        if sample_handles:
            self._fallback_reason = (
                f"total energy counter not supported on device(s) {self._sampled}; "
                f"their power was sampled at {1.0 / self.sample_interval_s:g} Hz and integrated"
            )
            self._sampler = _PowerSampler(nvml, sample_handles, self.sample_interval_s, self._clock)
            if not self._sampler.sample_once():
                self._fail = self._sampler.error
                self._sampler = None
                return
            self._sampler.start()

    def stop(self) -> EnergyReading:
        """Never raises for NVML trouble: any failure becomes ``joules=None`` with the reason."""
        if not self._running:
            return not_measured("stop() was called without start()", 0.0, self.devices)
        try:
            return self._stop()
        finally:
            if self._nvml is not None:
                shutdown_nvml(self._nvml)
            self._running = False
            self._nvml = None

    def _stop(self) -> EnergyReading:
        nvml = self._nvml
        sampler = self._sampler
        if sampler is not None:
            sampler.halt()
            sampler.sample_once()  # close the window at stop time
        t1 = self._clock()
        seconds = t1 - self._t0
        if self._fail is not None:
            return not_measured(self._fail, seconds, self.devices)
        per_device: dict[int, float] = {}
        try:
            for d, h in self._counter_handles.items():
                end = int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
                delta_mj = end - self._counter_start[d]
                if delta_mj < 0:
                    return not_measured(
                        f"energy counter of device {d} went backwards (driver reloaded?)",
                        seconds,
                        self.devices,
                    )
                per_device[d] = delta_mj / 1000.0
        except nvml_error(nvml) as e:
            return not_measured(f"NVML failed reading energy at stop: {e}", seconds, self.devices)
        reason = self._fallback_reason
        samples = 0
        if sampler is not None:
            if sampler.error is not None:
                return not_measured(sampler.error, seconds, self.devices)
            samples = len(sampler.times)
            for d, j in zip(self._sampled, sampler.joules_per_device(), strict=True):
                per_device[d] = j
            hz = (samples - 1) / seconds if seconds > 0 and samples > 1 else 0.0
            if hz < MIN_SAMPLE_HZ:
                reason = f"{reason}; only {hz:.1f} Hz was achieved (CPU contention?)"
        joules = sum(per_device.values())
        method = METHOD_SAMPLING if self._sampled else METHOD_COUNTER
        return EnergyReading(
            joules=joules,
            seconds=seconds,
            avg_power_w=joules / seconds if seconds > 0 else None,
            method=method,
            scope=SCOPE_GPU_BOARD,
            devices=list(self.devices),
            reason=reason,
            samples=samples,
            device_methods=[
                METHOD_SAMPLING if d in self._sampled else METHOD_COUNTER for d in self.devices
            ],
        )


def make_default_meter(device_indices: Sequence[int] | None) -> EnergyMeter:
    """The NVML meter when NVML works here, else a meter that reports why nothing is measured.

    ``None`` means every GPU NVML can see.
    """
    if device_indices is not None and len(device_indices) == 0:
        return NotMeasuredMeter("no GPU devices were given to measure (the server runs on no GPU)")
    nvml, reason = import_pynvml()
    if nvml is None:
        return NotMeasuredMeter(reason or "pynvml is not importable")
    reason = init_nvml(nvml)
    if reason is not None:
        return NotMeasuredMeter(reason)
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml_error(nvml) as e:
        return NotMeasuredMeter(f"nvmlDeviceGetCount failed: {e}")
    finally:
        shutdown_nvml(nvml)
    if count == 0:
        return NotMeasuredMeter("NVML reports no GPU devices")
    devices = list(range(count)) if device_indices is None else list(device_indices)
    return NvmlEnergyMeter(devices)


def tokens_per_joule(output_tokens: int, reading: EnergyReading) -> float | None:
    """Output tokens per joule; None when energy was not measured or nothing was generated."""
    if output_tokens < 0:
        raise UsageError(
            "tokens_per_joule",
            "output_tokens",
            output_tokens,
            "a token count cannot be negative",
            "pass the sum of output tokens of the successful requests",
        )
    if reading.joules is None or reading.joules <= 0 or output_tokens == 0:
        return None
    return output_tokens / reading.joules
