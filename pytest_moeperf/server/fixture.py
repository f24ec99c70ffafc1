"""The server factory behind the ``moeperf_server_factory`` fixture.

A factory rather than a single server, so that one test can start several (an A/B pair, a TP=1
and a TP=2 server). Every server it started is stopped at teardown, process group and all.

With a GPU pool (``moeperf_gpus``), each server leases the GPUs its vLLM flags ask for
(tensor x pipeline x data) and gets them as CUDA_VISIBLE_DEVICES; the lease is returned only
after the server's whole process group is gone.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_moeperf.errors import MoePerfError, ServerError
from pytest_moeperf.server.logscan import ConfigCheck, check_requested_config
from pytest_moeperf.server.process import ServerConfig, VllmServer

if TYPE_CHECKING:
    from pytest_moeperf.gpupool import GpuLease, GpuPool


class ServerFactory:
    """Starts vLLM servers for one test and stops them all at teardown."""

    def __init__(self, workdir: Path, *, startup_timeout_s: float = 900.0,
                 extra_env: Mapping[str, str] | None = None, gpu_pool: GpuPool | None = None,
                 owner: str = "") -> None:  # fmt: skip
        self.workdir = workdir
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(extra_env or {})
        self.gpu_pool = gpu_pool
        self.owner = owner or str(workdir)
        self.servers: list[VllmServer] = []
        self.checks: list[ConfigCheck] = []
        self.leases: list[GpuLease] = []

    def __call__(self, model: str | os.PathLike[str], args: Sequence[str] = (), *,
                 moe_config_folder: Path | None = None,
                 moe_config_files: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None, name: str | None = None,
                 served_model_name: str | None = None,
                 check_config: bool = True) -> VllmServer:  # fmt: skip
        """Start a server and wait until it is healthy.

        ``moe_config_folder`` is passed as ``VLLM_TUNED_CONFIG_FOLDER``; ``moe_config_files``
        (name -> path or dict) is laid out into a fresh folder first. With neither, an empty
        folder is used: the in-tree variant. After startup the log is checked for the config the
        engine loaded; a requested file that was not loaded raises ``ServerError`` (on the CPU
        backend, which reads no MoE configs, that is recorded instead).
        """
        server = self.prepare(model, args, moe_config_folder=moe_config_folder,
                              moe_config_files=moe_config_files, env=env, name=name,
                              served_model_name=served_model_name)  # fmt: skip
        server.start()
        folder = server.config.tuned_config_folder
        assert folder is not None
        expected = tuple(sorted(p.name for p in folder.glob("*.json")))
        check = check_requested_config(server.moe_observation(), folder, expected)
        self.checks.append(check)
        if check_config and not check.ok:
            raise ServerError("MoE config check failed: " + check.message, server.command,
                              "\n".join(server.moe_observation().evidence))  # fmt: skip
        return server

    def prepare(self, model: str | os.PathLike[str], args: Sequence[str] = (), *,
                moe_config_folder: Path | None = None,
                moe_config_files: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None, name: str | None = None,
                served_model_name: str | None = None) -> VllmServer:  # fmt: skip
        """Lay out the config folder and lease GPUs; the server is not started yet.

        ``launch_command(port)`` and ``launch_env()`` of the result are exactly what
        ``start()`` runs. The server is registered, so teardown frees its lease either way.
        """
        label = _safe(name or f"server{len(self.servers)}")
        folder = self.workdir / f"{label}-moe-configs"
        if folder.exists():
            shutil.rmtree(folder)
        if moe_config_files:
            from pytest_moeperf.moeconfig.folder import lay_out_config_folder

            lay_out_config_folder(folder, moe_config_files)
        elif moe_config_folder is not None:
            shutil.copytree(moe_config_folder, folder)
        else:
            folder.mkdir(parents=True)
        merged_env = {**self.extra_env, **(env or {})}
        merged_env.setdefault(
            "VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")
        )
        if self.gpu_pool is not None and "CUDA_VISIBLE_DEVICES" not in merged_env:
            merged_env.update(self._lease(list(args), merged_env, label))
        server = VllmServer(
            ServerConfig(
                model=str(model),
                args=list(args),
                env=merged_env,
                tuned_config_folder=folder,
                log_path=self.workdir / f"{label}.log",
                startup_timeout_s=self.startup_timeout_s,
                served_model_name=served_model_name,
            )
        )
        self.servers.append(server)
        return server

    def _lease(self, args: list[str], env: Mapping[str, str], label: str) -> dict[str, str]:
        """GPUs for one server from the pool, sized by its own vLLM flags."""
        from pytest_moeperf.gpupool import gpus_from_args

        assert self.gpu_pool is not None
        n, why = gpus_from_args(args, env)
        try:
            lease = self.gpu_pool.lease(n, f"{self.owner} [{label}]", why)
        except MoePerfError as exc:  # too many GPUs, or the wait ran out: one line, no traceback
            import pytest

            pytest.fail(str(exc), pytrace=False)
        self.leases.append(lease)
        return lease.env

    def stop_all(self) -> None:
        try:
            for server in reversed(self.servers):
                server.stop()
        finally:
            for lease in reversed(self.leases):
                lease.release()
            self.leases.clear()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "server"
