"""A spec's ``engine_args`` checked against vLLM's own server parser, before any server starts.

A misspelt flag (``max-num-seqss``) otherwise costs a whole server start: vLLM imports torch,
parses its arguments and exits after about 30 s. The flags come from the parser the server
itself uses (``make_arg_parser`` of ``vllm.entrypoints.launchers.cli_args`` on a
``FlexibleArgumentParser``; ``vllm.entrypoints.openai.cli_args`` before vLLM 0.25, where the
H200 recipe's 0.24.0 keeps it), built in a child process with the same Python: the plugin and the
pytest process stay free of torch and vLLM (no import cost, no CUDA state before the GPU lease).
Building it takes seconds, so the flag list is cached per process and on disk, keyed on where
vLLM is installed and on its argument files' sizes and times (an upgrade rewrites them).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from pytest_moeperf.errors import UsageError
from pytest_moeperf.spec.model import Spec

#: The server the plugin starts (``python -m vllm.entrypoints.openai.api_server``).
SERVER = "vllm.entrypoints.openai.api_server"

# Prints {"version": ..., "flags": [...]}: every long option of the server's own parser.
_SCRIPT = """
import json, sys
from vllm import __version__
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ModuleNotFoundError:  # vLLM before 0.25 (the H200 recipe's 0.24.0)
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
flags = sorted(o[2:] for o in parser._option_string_actions if o.startswith("--"))
sys.stdout.write("\\nMOEPERF-FLAGS " + json.dumps({"version": __version__, "flags": flags}))
"""
_MARK = "MOEPERF-FLAGS "
_KEY_FILES = (
    "entrypoints/launchers/cli_args.py", "entrypoints/openai/cli_args.py", "engine/arg_utils.py",
    "version.py",
)  # fmt: skip
_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ServerFlags:
    """The long options of vLLM's server (without ``--``), or why they are not known here."""

    flags: frozenset[str] | None
    version: str = ""
    note: str = ""  # set when flags is None: why engine_args were not checked


def _vllm_dir() -> Path | None:
    """vLLM's package folder, found without importing it (None: not installed here)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):  # ValueError: sys.modules["vllm"] is None
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(os.path.realpath(next(iter(spec.submodule_search_locations))))


def _cache_key(pkg: Path) -> str:
    h = hashlib.sha256(f"{sys.executable}\0{pkg}".encode())
    for rel in _KEY_FILES:
        with contextlib.suppress(OSError):
            st = (pkg / rel).stat()
            h.update(f"\0{rel}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def _read_cache(path: Path) -> ServerFlags | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        flags, version = data["flags"], data["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged: rebuild it
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags) or not flags:
        return None
    return ServerFlags(frozenset(flags), str(version))


def _write_cache(path: Path, flags: ServerFlags) -> None:
    assert flags.flags is not None
    text = json.dumps({"version": flags.version, "flags": sorted(flags.flags)})
    with contextlib.suppress(OSError):  # a read-only cache only costs the next run a rebuild
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)


def _build() -> ServerFlags:
    """Ask vLLM's parser in a child process; any failure is a note, never a crash."""
    try:
        out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                             timeout=_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return ServerFlags(None, note=f"vLLM's argument parser could not be run ({exc})")
    line = next((x for x in out.stdout.splitlines() if x.startswith(_MARK)), None)
    if out.returncode != 0 or line is None:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return ServerFlags(None, note=f"vllm is installed but its server parser does not "
                                      f"load here ({tail})")  # fmt: skip
    data = json.loads(line[len(_MARK) :])
    return ServerFlags(frozenset(data["flags"]), str(data["version"]))


@functools.lru_cache(maxsize=4)
def server_flags(cache_dir: Path | None = None) -> ServerFlags:
    """vLLM's server flags, from this process's cache, the disk cache, or vLLM itself."""
    pkg = _vllm_dir()
    if pkg is None:
        return ServerFlags(None, note=f"vllm is not importable by {sys.executable} (an "
                                      "external-server run?), so engine_args were not checked "
                                      "against vLLM's argument parser")  # fmt: skip
    if cache_dir is None:
        from pytest_moeperf.server.embedded import default_cache_root

        cache_dir = default_cache_root()
    path = cache_dir / "vllm-flags" / f"{_cache_key(pkg)}.json"
    cached = _read_cache(path)
    if cached is not None:
        return cached
    built = _build()
    if built.flags is not None:
        _write_cache(path, built)
    return built


def _key_lines(spec: Spec) -> dict[str, tuple[str, int]]:
    """flag -> (the key as written, its line) under ``engine_args`` of the spec file."""
    try:
        root = yaml.compose(Path(spec.source).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(root, yaml.MappingNode):
        return {}
    section = next((v for k, v in root.value if k.value == "engine_args"), None)
    if not isinstance(section, yaml.MappingNode):
        return {}
    return {str(k.value).replace("_", "-"): (str(k.value), k.start_mark.line + 1)
            for k, _ in section.value}  # fmt: skip


def check_engine_args(spec: Spec, known: ServerFlags) -> None:
    """Raise a UsageError for the first ``engine_args`` key vLLM's server would refuse.

    argparse also takes an unambiguous prefix (``max-num-seq``) as the whole flag, as vLLM's
    server does; an ambiguous one is refused, like vLLM would.
    """
    if known.flags is None or not spec.engine_args:
        return
    flags = sorted(known.flags)
    lines = _key_lines(spec)
    for flag, value in spec.engine_args:
        if flag in known.flags:
            continue
        prefixed = [f for f in flags if f.startswith(flag)]
        if len(prefixed) == 1:
            continue
        written, line = lines.get(flag, (flag, 0))
        source = f"{spec.source}:{line}" if line else spec.source
        what, server = f"engine_args.{written}", f"vLLM {known.version}'s server ({SERVER})"
        if prefixed:
            raise UsageError(source, what, value,
                             f"is an abbreviation of several flags of {server}: "
                             + ", ".join(prefixed[:6]),
                             "write the whole flag name")  # fmt: skip
        close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`? " if close else ""
        raise UsageError(source, what, value,
                         f"is not a flag of {server}, which would exit on it after loading",
                         f"{hint}see `python -m {SERVER} --help` for its flags (without the "
                         "leading --)")  # fmt: skip
