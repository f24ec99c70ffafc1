"""A vLLM general plugin: every engine step takes (1 + x) times its compute time.

vLLM calls every ``vllm.general_plugins`` entry point in each of its processes (API server,
engine core, workers). This one wraps ``GPUModelRunner.execute_model`` and ``sample_tokens``
(the CPU backend's ``CPUModelRunner`` inherits both) and, after each call, sleeps ``x`` times
the call's own elapsed time. The sleep debt is carried over: ``time.sleep`` overshoots by tens
of microseconds, so each sleep pays what is owed and the overshoot is taken off the next one;
over a run the slept time is ``x`` times the compute time to within one overshoot. Nothing else
changes: same scheduler, same batch sizes, same kernels; the model runner simply returns later.

Configuration (environment, read once when the plugin loads):

* ``MOEPERF_STEP_DELAY``: the fraction x (0.05 = 5 % slower steps); ``spin:0.05`` busy-waits
  instead of sleeping (the runner keeps its core, as a slower kernel would); ``fixed:0.1``
  sleeps 0.1 s after every ``execute_model`` call (a fixed cost per model step, whatever the
  machine: the e2e test's slowdown, which must stand out of any VM's noise). Unset, empty or 0
  and no ``MOEPERF_STEP_DELAY_FILE``: the plugin returns at once and patches nothing.
* ``MOEPERF_STEP_DELAY_FILE``: a file holding the fraction, re-read when it changes (checked
  every 0.25 s), so one server can alternate 0 and x (the single-stream check of the study).
* ``MOEPERF_STEP_DELAY_STATS``: a folder; each patched process writes ``<pid>.json`` there
  every 2 s (steps, compute seconds, slept seconds), so the study can check the injected ratio.

The model runner module is patched when it is imported (an import hook), so processes that
never import it (the API server) pay nothing.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

TARGET = "vllm.v1.worker.gpu_model_runner"
PATCHED = ("execute_model", "sample_tokens")
FRACTION_ENV = "MOEPERF_STEP_DELAY"
FILE_ENV = "MOEPERF_STEP_DELAY_FILE"
STATS_ENV = "MOEPERF_STEP_DELAY_STATS"
FILE_POLL_S = 0.25
STATS_EVERY_S = 2.0
MODES = ("sleep", "spin", "fixed")
STEP_CALL = "execute_model"  # the call a fixed delay is paid after: one per model step


def parse_fraction(text: str | None) -> float:
    """The fraction in ``text`` (empty or None: 0); it must be a number in [0, 10]."""
    return parse_delay(text)[1]


def parse_delay(text: str | None) -> tuple[str, float]:
    """``"0.05"`` -> ("sleep", 0.05); ``"spin:0.05"`` -> ("spin", 0.05): the delay busy-waits
    instead of sleeping (the model runner keeps its core, as a slower kernel would);
    ``"fixed:0.1"`` -> ("fixed", 0.1): 0.1 s a model step, not a fraction of its compute."""
    if text is None or not text.strip():
        return "sleep", 0.0
    mode, _, value = text.strip().rpartition(":")
    mode = mode or "sleep"
    if mode not in MODES:
        raise ValueError(f"step delay mode {mode!r} is not one of {', '.join(MODES)}")
    x = float(value)
    if not 0.0 <= x <= 10.0:
        raise ValueError(f"step delay fraction {x!r} is outside [0, 10]")
    return mode, x


class StepDelay:
    """The sleep-after-each-call state of one process."""

    def __init__(
        self,
        fraction: float,
        file: Path | None = None,
        stats_dir: Path | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        mode: str = "sleep",
    ) -> None:
        self.mode = mode
        self.fraction = fraction
        self.file = file
        self.stats_dir = stats_dir
        self.clock = clock
        self.sleep = sleep
        self.owed_s = 0.0
        self.calls = 0
        self.busy_s = 0.0
        self.slept_s = 0.0
        self.by_fraction: dict[str, list[float]] = {}  # fraction -> [busy_s, slept_s]
        self._file_checked = -1e9
        self._file_mtime: float | None = None
        self._stats_written = clock()

    def _poll_file(self, now: float) -> None:
        if self.file is None or now - self._file_checked < FILE_POLL_S:
            return
        self._file_checked = now
        try:
            mtime = self.file.stat().st_mtime
            if mtime != self._file_mtime:
                self._file_mtime = mtime
                self.mode, self.fraction = parse_delay(self.file.read_text())
                self.owed_s = 0.0
        except (OSError, ValueError):
            pass  # a half-written file: keep the last fraction, read it again next time

    def after(self, busy_s: float, step: bool = True) -> None:
        """Account one call that computed for ``busy_s`` and pay the sleep owed so far;
        ``step``: the call is the model step (a fixed delay is owed once per step)."""
        self.calls += 1
        self.busy_s += busy_s
        key = f"{self.fraction:g}" if self.mode == "sleep" else f"{self.mode}:{self.fraction:g}"
        slot = self.by_fraction.setdefault(key, [0.0, 0.0])
        slot[0] += busy_s
        if self.mode == "fixed":
            self.owed_s += self.fraction if step else 0.0
        else:
            self.owed_s += self.fraction * busy_s
        if self.owed_s > 0:
            t0 = self.clock()
            if self.mode == "spin":
                end = t0 + self.owed_s
                while self.clock() < end:
                    pass
            else:
                self.sleep(self.owed_s)
            slept = self.clock() - t0
            self.owed_s -= slept
            self.slept_s += slept
            slot[1] += slept
        now = self.clock()
        self._poll_file(now)
        if self.stats_dir is not None and now - self._stats_written >= STATS_EVERY_S:
            self.write_stats()
            self._stats_written = now

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "fraction": self.fraction,
            "mode": self.mode,
            "calls": self.calls,
            "busy_s": self.busy_s,
            "slept_s": self.slept_s,
            "slept_over_busy": self.slept_s / self.busy_s if self.busy_s else None,
            "by_fraction": self.by_fraction,
        }

    def write_stats(self) -> None:
        if self.stats_dir is None:
            return
        try:
            self.stats_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.stats_dir / f".{os.getpid()}.json.tmp"
            tmp.write_text(json.dumps(self.stats()))
            tmp.replace(self.stats_dir / f"{os.getpid()}.json")
        except OSError:
            pass

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        step = getattr(fn, "__name__", "") == STEP_CALL

        def delayed(*args: Any, **kwargs: Any) -> Any:
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.after(self.clock() - t0, step)

        delayed.__wrapped__ = fn  # type: ignore[attr-defined]
        delayed.__name__ = getattr(fn, "__name__", "delayed")
        delayed.__qualname__ = getattr(fn, "__qualname__", "delayed")
        return delayed


def patch_module(module: ModuleType, delay: StepDelay, names: Sequence[str] = PATCHED) -> None:
    """Wrap ``GPUModelRunner.<names>`` of ``module`` once (a second call changes nothing)."""
    cls = module.GPUModelRunner
    for name in names:
        fn = getattr(cls, name)
        if getattr(fn, "_moeperf_step_delay", False):
            continue
        wrapped = delay.wrap(fn)
        wrapped._moeperf_step_delay = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapped)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` through the other finders and patches the module once it has run."""

    def __init__(self, delay: StepDelay) -> None:
        self.delay = delay

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not find us again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module
        delay = self.delay

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch_module(module, delay)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


#: The dist-info that declares this plugin to vLLM, and its entry point.
PLUGIN_DIST = "moeperf_step_delay-0.1.dist-info"
ENTRY_POINT = "moeperf_step_delay = verdict_study_helpers.step_delay:register"


def plugin_dir(root: Path) -> Path:
    """A folder whose ``*.dist-info`` declares this plugin to vLLM (no pip install:
    importlib.metadata finds dist-info folders on sys.path). Put it and the folder holding
    ``verdict_study_helpers`` on the server's PYTHONPATH."""
    dist = root / PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: moeperf-step-delay\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{ENTRY_POINT}\n")
    return root


def register() -> None:
    """The entry point vLLM calls in each process (possibly more than once)."""
    mode, fraction = parse_delay(os.environ.get(FRACTION_ENV))
    file = os.environ.get(FILE_ENV) or None
    if fraction == 0 and file is None:
        return  # off: nothing patched, nothing imported
    if any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        return
    stats = os.environ.get(STATS_ENV) or None
    delay = StepDelay(
        fraction, Path(file) if file else None, Path(stats) if stats else None, mode=mode
    )
    atexit.register(delay.write_stats)
    module = sys.modules.get(TARGET)
    if module is not None:
        patch_module(module, delay)
    else:
        sys.meta_path.insert(0, _PatchOnImport(delay))
