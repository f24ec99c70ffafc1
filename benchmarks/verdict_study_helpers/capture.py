"""A pytest plugin that keeps the per-request records of every search probe.

Loaded with ``-p verdict_study_helpers.capture`` (``benchmarks/`` on ``PYTHONPATH``) when
``MOEPERF_STUDY_RECORDS`` names a file. The results JSON of the plugin keeps only each probe's
summary; the study resamples the requests of the probe a run's metrics were read from, so it
needs the records. ``run_load`` is wrapped: after it returns, its ``RunRecord`` is appended to
the file as one JSON line with the run and probe numbers of the ``pytest_moeperf_probe_start``
hook that preceded it. The records are kept in memory and written when the session ends, so
nothing is serialized between a probe's load and its summary: the probe's load, timing and
summary are those of the unwrapped call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

ENV = "MOEPERF_STUDY_RECORDS"
_state: dict[str, Any] = {"run": None, "probe": None, "rate": None}
_lines: list[dict[str, Any]] = []
_path: list[Path] = []


def pytest_moeperf_probe_start(
    config: pytest.Config,
    nodeid: str,
    run_number: int,
    probe_number: int,
    rate: float,
    server_pid: int | None,
) -> None:
    _state.update(run=run_number, probe=probe_number, rate=rate)


def pytest_configure(config: pytest.Config) -> None:
    target = os.environ.get(ENV)
    if not target:
        return
    from pytest_moeperf.load import runner

    original = runner.run_load
    if getattr(original, "_moeperf_capture", False):
        return
    _path.append(Path(target))

    def run_load(*args: Any, **kwargs: Any) -> Any:
        record = original(*args, **kwargs)
        if kwargs.get("mode") == "poisson":  # search probes; the warm-up is closed-loop
            _lines.append(
                {
                    "run": _state["run"],
                    "probe": _state["probe"],
                    "rate": _state["rate"],
                    "record": record,
                }
            )
            _state.update(run=None, probe=None, rate=None)
        return record

    run_load._moeperf_capture = True  # type: ignore[attr-defined]
    runner.run_load = run_load


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _path:
        return
    path = _path.pop()
    path.parent.mkdir(parents=True, exist_ok=True)
    import pytest_moeperf

    with path.open("a") as f:
        f.write(json.dumps({"pytest_moeperf": pytest_moeperf.__file__}) + "\n")
        for line in _lines:
            f.write(json.dumps({**line, "record": line["record"].to_dict()}) + "\n")
    _lines.clear()
