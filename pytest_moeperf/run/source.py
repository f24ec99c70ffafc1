"""Where a perf test's server comes from: a vLLM process this run starts, or a URL it is given.

``PerfTest`` asks its source for the endpoint, the MoE config line, the engine's version and
devices, and what measures energy when nothing else does; it never asks which kind it has. The
two differ in what they can know: a local server's log proves which config file it loaded and
its GPUs are leased here; an external server's config is declared by the test, its version is
its own ``GET /version``, and its energy is measured only on local GPUs the user names
(``external.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from pytest_moeperf.run.probe import Endpoint

if TYPE_CHECKING:
    from pytest_moeperf.markers import MoeConfigChoice
    from pytest_moeperf.metrics.energy import EnergyMeter
    from pytest_moeperf.server.fixture import ServerFactory
    from pytest_moeperf.server.process import VllmServer
    from pytest_moeperf.spec.model import Spec


@dataclass(frozen=True)
class Served:
    """A server ready for load, and what the run knows about it."""

    endpoint: Endpoint
    model_dir: Path | None  # the model's folder when this machine has it (MBU, vocabulary, key)
    check: str  # the MoE config line: proven from the server's log, or declared
    server: VllmServer | None = None  # the process this run started; None when given a URL


@dataclass(frozen=True)
class Engine:
    backend: str  # "cpu", "cuda" or "external": which hygiene checks and meters apply
    version: str | None
    devices: tuple[str, ...] | None  # GPUs serving it as CUDA_VISIBLE_DEVICES entries; None: all


class ServerSource(Protocol):
    #: the URL of a server this run did not start (hygiene names it); None for a local one
    url: str | None

    @property
    def on_this_machine(self) -> bool:
        """Whether the server shares this machine (its calibration then describes the server)."""

    def start(self, spec: Spec, moe: MoeConfigChoice) -> Served: ...

    def engine(self, served: Served) -> Engine: ...

    def energy_fallback(self, gpu_indices: tuple[int, ...]) -> EnergyMeter | None:
        """The meter when no plugin offers one; None: the default (NVML on the leased GPUs)."""


class LocalVllm:
    """A vLLM OpenAI server started by this run (``server.fixture.ServerFactory``)."""

    url: str | None = None

    def __init__(self, config: pytest.Config, factory: ServerFactory,
                 model_dir: Callable[[Spec], Path]) -> None:  # fmt: skip
        self.config = config
        self.factory = factory
        self.model_dir = model_dir

    @property
    def on_this_machine(self) -> bool:
        return True

    def start(self, spec: Spec, moe: MoeConfigChoice) -> Served:
        model_dir = self.model_dir(spec)
        args = spec.vllm_args()
        self.config.hook.pytest_moeperf_server_command(config=self.config, command=args)
        server = self.factory(model_dir, args, name=moe.name, moe_config_folder=moe.folder,
                              moe_config_files=moe.files,
                              env=spec.parallelism.server_env())  # fmt: skip
        endpoint = Endpoint(server.base_url, server.model_name, server.alive, server.pgid)
        return Served(endpoint, model_dir, self.factory.checks[-1].message, server)

    def engine(self, served: Served) -> Engine:
        from pytest_moeperf.server.logscan import engine_version

        server = served.server
        assert server is not None, "a local source's server is the one it started"
        log = server.log_text()
        backend = "cpu" if server.moe_observation().backend == "cpu" else "cuda"
        return Engine(backend, engine_version(log) if log else None, server.gpu_devices)

    def energy_fallback(self, gpu_indices: tuple[int, ...]) -> EnergyMeter | None:
        return None


class ExternalUrl:
    """A running OpenAI-compatible server this run did not start (``--moeperf-server-url``)."""

    def __init__(self, config: pytest.Config, url: str) -> None:
        self.config = config
        self.url: str | None = url

    @property
    def on_this_machine(self) -> bool:
        """An external server on a loopback address shares this machine."""
        from pytest_moeperf.baseline.calibration import on_this_machine

        return on_this_machine(self.url)

    def start(self, spec: Spec, moe: MoeConfigChoice) -> Served:
        from pytest_moeperf.external import served_model

        url = str(self.url)
        model = served_model(self.config, url)
        return Served(Endpoint(url, model), None,
                      f"declared, not set: {moe.name} on external server {url}")  # fmt: skip

    def engine(self, served: Served) -> Engine:
        from pytest_moeperf.external import describe

        ext = describe(self.config, str(self.url))
        return Engine("external", ext.version or "unknown (external)", ext.devices)

    def energy_fallback(self, gpu_indices: tuple[int, ...]) -> EnergyMeter | None:
        if gpu_indices:  # local GPUs named with --moeperf-gpus: NVML measures them
            return None
        from pytest_moeperf.external import ENERGY_NOT_MEASURED
        from pytest_moeperf.metrics.energy import NotMeasuredMeter

        return NotMeasuredMeter(ENERGY_NOT_MEASURED)
