"""Typed hook specifications other plugins (or a conftest.py) can implement.

Modelled on xdist's hookspecs: each hook has a typed signature and a docstring that says when it
is called and what its return value means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_moeperf.metrics.energy import EnergyMeter


@pytest.hookspec(firstresult=True)
def pytest_moeperf_energy_meter(
    config: pytest.Config, device_indices: Sequence[int]
) -> EnergyMeter | None:
    """Return the energy meter for a server using ``device_indices`` (first non-None wins).

    The default implementation returns the NVML meter, or a "not measured" meter where NVML or a
    GPU is absent. Implement it to plug in another source (a PDU, RAPL, a cloud power API).
    """


def pytest_moeperf_server_command(config: pytest.Config, command: list[str]) -> None:
    """Called with the vLLM arguments (after the model) before a server starts; may append.

    vLLM takes the last value of a repeated flag, so appending overrides the spec.
    """


def pytest_moeperf_result(config: pytest.Config, nodeid: str, result: dict[str, Any]) -> None:
    """Called once per perf test with its result record (as written to the results JSON, whose
    shape ``docs/results.schema.json`` gives), after the test body: its ``outcome`` is the
    test's, a body failing after ``run()`` included.
    (A run interrupted by Ctrl-C or SIGTERM is reported at once, as "partial".)"""


def pytest_moeperf_probe_start(
    config: pytest.Config,
    nodeid: str,
    run_number: int,
    probe_number: int,
    rate: float,
    server_pid: int | None,
) -> None:
    """Called just before each load probe sends its first request.

    ``run_number`` and ``probe_number`` count from 1, as in the progress lines and in "server
    died during probe N". ``server_pid`` leads the vLLM server's own process group (None for an
    external server): a profiler can attach to it, and the project's fault tests kill it.
    """
