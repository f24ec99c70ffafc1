"""Read the vLLM server log: which MoE config was loaded, which backend, and why startup failed.

The log is the only place vLLM says which fused-MoE tiling file it read, so this is the proof a
config change was actually exercised. Patterns are vLLM's own messages (fused_moe.py):
``Using configuration from <path> for MoE layer.`` and ``Using default MoE config. ... Config file
not found at <paths>``. The CPU backend reads no MoE config files and says so
(``Using CPU Unquantized MoE backend``); that is recorded, not treated as a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

_LOADED = re.compile(r"Using configuration from (?P<path>.+?\.json) for MoE layer")
_DEFAULT = re.compile(r"Using default MoE config\..*?Config file not found at (?P<paths>.+?)\s*$")
_CPU_BACKEND = re.compile(r"Using CPU\w* MoE backend|CPUUnquantizedExperts|CPU .*MoE backend")
_VERSION = re.compile(
    r"Initializing a V1 LLM engine \(v(?P<v>[^)]+)\)|version (?P<v2>\d+\.\d+\.\S+)"
)
_ADDR_IN_USE = re.compile(r"Address already in use|address already in use|Errno 98")

MoeBackend = Literal["triton", "cpu", "unknown"]


@dataclass(frozen=True)
class MoeConfigObservation:
    """What the server log says about fused-MoE configs."""

    loaded: tuple[str, ...] = ()  # config files the engine read, in log order
    default_used: bool = False
    searched: tuple[str, ...] = ()  # paths vLLM looked at before falling back to defaults
    backend: MoeBackend = "unknown"
    evidence: tuple[str, ...] = field(default=())  # the log lines this was read from

    @property
    def summary(self) -> str:
        if self.loaded:
            return "loaded " + ", ".join(self.loaded)
        if self.default_used:
            return "vLLM default MoE config (no file found at " + ", ".join(self.searched) + ")"
        if self.backend == "cpu":
            return "CPU MoE backend: fused-MoE config files are not read"
        return "no MoE config message in the server log"


def scan_moe_config(log_text: str) -> MoeConfigObservation:
    loaded: list[str] = []
    searched: list[str] = []
    evidence: list[str] = []
    default_used = False
    backend: MoeBackend = "unknown"
    for line in log_text.splitlines():
        if m := _LOADED.search(line):
            if m["path"] not in loaded:
                loaded.append(m["path"])
            evidence.append(line.strip())
            backend = "triton"
        elif m := _DEFAULT.search(line):
            default_used = True
            # vLLM joins with ", "; the file names themselves contain "," (E=..,N=..).
            searched.extend(p.strip() for p in m["paths"].split(", ") if p.strip())
            evidence.append(line.strip())
            backend = "triton"
        elif _CPU_BACKEND.search(line) and backend == "unknown":
            backend = "cpu"
            evidence.append(line.strip())
    return MoeConfigObservation(
        loaded=tuple(loaded),
        default_used=default_used,
        searched=tuple(searched),
        backend=backend,
        evidence=tuple(evidence),
    )


@dataclass(frozen=True)
class ConfigCheck:
    """Whether the requested MoE config is the one the engine used."""

    ok: bool
    message: str


def check_requested_config(
    obs: MoeConfigObservation, tuned_folder: Path | None, expected_files: tuple[str, ...]
) -> ConfigCheck:
    """Compare what was requested (files in the tuned folder) with what the log says was loaded.

    ``expected_files`` are the file names the user put in the folder; an empty tuple means the
    in-tree variant (an empty tuned folder): any in-tree file or vLLM's default is then correct.
    """
    if obs.backend == "cpu":
        note = "backend ignores MoE configs (vLLM CPU MoE backend); "
        return ConfigCheck(True, note + obs.summary)
    if not expected_files:
        bad = [p for p in obs.loaded if tuned_folder is not None and _inside(p, tuned_folder)]
        if bad:
            return ConfigCheck(False, f"in-tree requested but the tuned folder was read: {bad}")
        return ConfigCheck(True, "in-tree: " + obs.summary)
    if not obs.loaded and not obs.default_used:
        return ConfigCheck(False, "requested MoE config was never mentioned in the server log")
    assert tuned_folder is not None
    used = [Path(p).name for p in obs.loaded if _inside(p, tuned_folder)]
    if not used:
        return ConfigCheck(
            False,
            f"requested {', '.join(expected_files)} from {tuned_folder} but the engine used: "
            f"{obs.summary}. Check the file name matches E/N/device_name for this model and GPU",
        )
    return ConfigCheck(True, "loaded " + ", ".join(used) + f" from {tuned_folder}")


def _inside(path: str, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def engine_version(log_text: str) -> str | None:
    for line in log_text.splitlines():
        if m := _VERSION.search(line):
            return m["v"] or m["v2"]
    return None


def port_conflict(log_text: str) -> bool:
    return bool(_ADDR_IN_USE.search(log_text))
