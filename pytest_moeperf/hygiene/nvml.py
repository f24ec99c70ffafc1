"""NVML access for the hygiene checks: call a getter by name, and turn a refusal into a reason.

Why by name: nvidia-ml-py renames functions across releases (``...ThrottleReasons`` became
``...EventReasons``) and a driver may lack one a newer pynvml has; trying names in order and
keeping NVML's own words for "unknown" works on every pairing without version checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pytest_moeperf.metrics.hardware import nvml_error

NO_GPU = "no NVIDIA GPU / NVML not available"
GIB = 2.0**30


class Nvml:
    """Calls NVML by name; a refusal becomes (None, reason) instead of an exception."""

    def __init__(self, module: Any) -> None:
        self.m = module
        self.errors = (nvml_error(module), nvml_error(module, "NVMLLibraryMismatchError"))

    def get(self, names: str | Sequence[str], *args: Any) -> tuple[Any, str | None]:
        reasons = []
        for name in [names] if isinstance(names, str) else names:
            fn: Callable[..., Any] | None = getattr(self.m, name, None)
            if fn is None:
                reasons.append(f"{name}: not in this pynvml")
                continue
            try:
                return fn(*args), None
            except self.errors as e:
                reasons.append(f"{name}: {str(e) or type(e).__name__}")
        return None, "; ".join(reasons)
