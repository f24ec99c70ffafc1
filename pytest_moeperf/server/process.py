"""Start, watch and stop a real vLLM OpenAI server process.

Design points, each from a way a nightly job goes wrong:
- the server runs in its own process group (and gets SIGTERM if pytest dies, via
  PR_SET_PDEATHSIG), so teardown can stop the API server and its engine-core children together and
  nothing keeps a GPU after the test;
- a server that exits during startup fails the test at once with its last log lines and the
  command line, not at the health deadline;
- a port taken between choosing and binding is retried on another port.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pytest_moeperf.errors import ServerError
from pytest_moeperf.server.logscan import MoeConfigObservation, port_conflict, scan_moe_config

_LIVE: dict[int, VllmServer] = {}


@dataclass
class ServerConfig:
    """Everything needed to launch one server; built from a spec, markers and options."""

    model: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    tuned_config_folder: Path | None = None
    log_path: Path = Path("vllm-server.log")
    python: str = sys.executable
    host: str = "127.0.0.1"
    startup_timeout_s: float = 900.0
    port_retries: int = 3
    served_model_name: str | None = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM the server if pytest itself is killed."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class VllmServer:
    """A running ``python -m vllm.entrypoints.openai.api_server`` process."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []
        self.startup_s: float | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> VllmServer:
        attempts = max(1, self.config.port_retries)
        for attempt in range(attempts):
            port = free_port(self.config.host)
            try:
                self._launch_and_wait(port)
                return self
            except ServerError:
                taken = port_conflict(self.log_text())
                self.stop()
                if not taken or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def launch_command(self, port: int) -> list[str]:
        """The exact command line the server is started with on ``port``."""
        cfg = self.config
        command = [
            cfg.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", cfg.model, "--host", cfg.host, "--port", str(port), *cfg.args,
        ]  # fmt: skip
        if cfg.served_model_name and "--served-model-name" not in cfg.args:
            command += ["--served-model-name", cfg.served_model_name]
        return command

    def launch_env(self) -> dict[str, str]:
        """The server process's whole environment: this process's, plus the config's."""
        cfg = self.config
        env = dict(os.environ)
        env.update(cfg.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        if cfg.tuned_config_folder is not None:
            env["VLLM_TUNED_CONFIG_FOLDER"] = str(cfg.tuned_config_folder)
        else:
            env.pop("VLLM_TUNED_CONFIG_FOLDER", None)
        return env

    @property
    def gpu_devices(self) -> tuple[str, ...] | None:
        """CUDA_VISIBLE_DEVICES entries the config gives the server; None: it inherits ours."""
        visible = self.config.env.get("CUDA_VISIBLE_DEVICES")
        return None if visible is None else tuple(d for d in visible.split(",") if d)

    def _launch_and_wait(self, port: int) -> None:
        cfg = self.config
        self.port = port
        self.command = self.launch_command(port)
        env = self.launch_env()
        cfg.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(cfg.log_path, "ab") as log:
            log.write(f"\n# moeperf: {' '.join(self.command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        _LIVE[self.proc.pid] = self
        t0 = time.monotonic()
        deadline = t0 + cfg.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(
                    f"vLLM server exited with code {code} during startup "
                    f"after {time.monotonic() - t0:.1f} s (log: {cfg.log_path})",
                    self.command,
                    self.log_tail(),
                )
            if self._healthy():
                self.startup_s = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"vLLM server not healthy after {cfg.startup_timeout_s:.0f} s "
                    f"(GET {self.base_url}/health; log: {cfg.log_path}). Raise the startup "
                    "timeout with --moeperf-startup-timeout if the model is large",
                    self.command,
                    self.log_tail(),
                )
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``grace_s``."""
        proc = self.proc
        if proc is None:
            return
        _LIVE.pop(proc.pid, None)
        pgid = proc.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        # SIGKILL is delivered at once but a member exits when it is next scheduled: on a busy
        # 2-core machine a killed member was still listed right after (tests, xdist)
        deadline = time.monotonic() + 5.0
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state -----------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The name requests must use: --served-model-name (option or spec flag), else the path."""
        args = self.config.args
        if self.config.served_model_name:
            return self.config.served_model_name
        for i, a in enumerate(args):
            if a == "--served-model-name" and i + 1 < len(args):
                return args[i + 1]
            if a.startswith("--served-model-name="):
                return a.split("=", 1)[1]
        return self.config.model

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.config.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def death_note(self, lines: int = 12) -> str:
        """The exit code, log path and last log lines of a server that died, for a failure."""
        code = self.proc.poll() if self.proc is not None else None
        return (f"; server exit code {code}, log {self.config.log_path}\n"
                f"--- server log (last lines) ---\n{self.log_tail(lines)}")  # fmt: skip

    def moe_observation(self) -> MoeConfigObservation:
        return scan_moe_config(self.log_text())


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of our own children excepted)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) succeeds for zombies too; look for a non-zombie member.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def live_server_pids() -> frozenset[int]:
    """PIDs of the servers this process has running now (to scope a later stop)."""
    return frozenset(_LIVE)


def stop_all_servers(keep: frozenset[int] = frozenset()) -> None:
    """Stop every server this process started, except those in ``keep`` (atexit, SIGTERM, Ctrl-C).

    ``keep`` exists for nested sessions: an in-process pytester run ends with its own
    ``pytest_unconfigure`` and must not stop the outer session's servers.
    """
    for pid, server in list(_LIVE.items()):
        if pid not in keep:
            server.stop(grace_s=10.0)
