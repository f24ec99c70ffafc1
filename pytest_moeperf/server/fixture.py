"""The server factory behind the ``moeperf_server_factory`` fixture.

A factory rather than a single server, so that one test can start several (an A/B pair, a TP=1
and a TP=2 server). Every server it started is stopped at teardown, process group and all.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import ServerError
from pytest_moeperf.server.logscan import ConfigCheck, check_requested_config
from pytest_moeperf.server.process import ServerConfig, VllmServer


class ServerFactory:
    """Starts vLLM servers for one test and stops them all at teardown."""

    def __init__(self, workdir: Path, *, startup_timeout_s: float = 900.0,
                 extra_env: Mapping[str, str] | None = None) -> None:  # fmt: skip
        self.workdir = workdir
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(extra_env or {})
        self.servers: list[VllmServer] = []
        self.checks: list[ConfigCheck] = []

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
        label = _safe(name or f"server{len(self.servers)}")
        folder = self.workdir / f"{label}-moe-configs"
        expected: tuple[str, ...] = ()
        if folder.exists():
            shutil.rmtree(folder)
        if moe_config_files:
            from pytest_moeperf.moeconfig.folder import lay_out_config_folder

            lay_out_config_folder(folder, moe_config_files)
        elif moe_config_folder is not None:
            shutil.copytree(moe_config_folder, folder)
        else:
            folder.mkdir(parents=True)
        expected = tuple(sorted(p.name for p in folder.glob("*.json")))
        merged_env = {**self.extra_env, **(env or {})}
        merged_env.setdefault(
            "VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")
        )
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
        server.start()
        check = check_requested_config(server.moe_observation(), folder, expected)
        self.checks.append(check)
        if check_config and not check.ok:
            raise ServerError("MoE config check failed: " + check.message, server.command,
                              "\n".join(server.moe_observation().evidence))  # fmt: skip
        return server

    def stop_all(self) -> None:
        for server in reversed(self.servers):
            server.stop()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80] or "server"
