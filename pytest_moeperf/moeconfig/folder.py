"""Config variants laid out as folders for ``VLLM_TUNED_CONFIG_FOLDER``, and their identity.

vLLM reads ``$VLLM_TUNED_CONFIG_FOLDER/<name>`` first, then its in-tree ``configs/<name>``,
then falls back to a computed default. A variant is therefore just a folder of files; the
"in-tree" variant is an empty folder (nothing overrides vLLM's shipped files). The folder's
hash names the variant in baselines so a result is never compared against other tilings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.naming import parse
from pytest_moeperf.moeconfig.validate import TileConfig, load_config, validate_config

IN_TREE = "in-tree"
ENV_VAR = "VLLM_TUNED_CONFIG_FOLDER"

FileSource = Path | Mapping[Any, Any]


@dataclass(frozen=True)
class ConfigVariant:
    """A named set of tuned config files; ``in_tree`` means "vLLM's shipped files, no overrides".

    ``files`` maps a config file name to a path to copy or to the config itself (a JSON-like
    dict keyed by M, or ``dict[int, TileConfig]`` as load_config returns).
    """

    name: str
    files: Mapping[str, FileSource] = field(default_factory=dict)
    in_tree: bool = False

    def __post_init__(self) -> None:
        source = f"config variant {self.name!r}"
        if not self.name or not self.name.strip():
            raise UsageError(source, "name", self.name, "must not be empty", "name the variant")
        if (self.in_tree or self.name == IN_TREE) and self.files:
            raise UsageError(
                source,
                "files",
                sorted(self.files),
                f"the {IN_TREE!r} variant means no tuned files; it cannot carry any",
                f"give this variant another name, or drop its files to use {IN_TREE!r}",
            )
        if self.name == IN_TREE and not self.in_tree:
            object.__setattr__(self, "in_tree", True)
        if not self.in_tree and not self.files:
            raise UsageError(
                source,
                "files",
                {},
                "a tuned variant without files behaves exactly like the in-tree configs",
                f"add config files, or use the {IN_TREE!r} variant",
            )

    @classmethod
    def in_tree_variant(cls) -> ConfigVariant:
        return cls(IN_TREE, {}, in_tree=True)

    @classmethod
    def from_folder(cls, name: str, folder: Path) -> ConfigVariant:
        """A variant made of every ``*.json`` file in ``folder`` (an empty one is in-tree)."""
        files = {p.name: p for p in _json_files(folder)}
        if not files:
            return cls(name, {}, in_tree=True)
        return cls(name, files)

    def lay_out(self, dest: Path) -> Path:
        return lay_out_config_folder(dest, self.files)


def in_tree_variant() -> ConfigVariant:
    return ConfigVariant.in_tree_variant()


def _json_files(folder: Path) -> list[Path]:
    source = f"config folder {folder}"
    if not folder.exists():
        raise UsageError(source, "path", str(folder), "does not exist", "check the path")
    if not folder.is_dir():
        raise UsageError(source, "path", str(folder), "is not a directory", "pass a folder")
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(".json"))


def _as_json_dict(name: str, data: Mapping[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        out[str(k)] = v.to_dict() if isinstance(v, TileConfig) else v
    validate_config(out, f"config {name} (in-memory)")
    return out


def check_config_name(name: str, source: str) -> None:
    """A name vLLM looks up in ``VLLM_TUNED_CONFIG_FOLDER``: any other is never read there."""
    cname = parse(name, source=source)
    if cname.backend is not None:
        raise UsageError(
            source,
            "backend",
            cname.backend,
            f"vLLM reads ',backend={cname.backend}' configs only from its own configs/ "
            f"folder, never from {ENV_VAR}",
            "test it by installing it into vLLM's configs/ folder, or drop it from the variant",
        )


def check_variant_files(files: Mapping[str, FileSource]) -> None:
    """Check each file's name and contents, as ``lay_out_config_folder`` writes them."""
    for name, src in files.items():
        source = f"config variant file {name!r}"
        check_config_name(name, source)
        if isinstance(src, Path):
            load_config(src)
        elif isinstance(src, Mapping):
            _as_json_dict(name, src)
        elif isinstance(src, str):  # a path as text: name it, and how to pass it
            raise UsageError(
                source,
                "source",
                src,
                "is a str; files= takes a pathlib.Path to copy (relative paths would depend on "
                "the working directory) or the config dict",
                f"pass Path(__file__).parent / {src!r}",
            )
        else:
            raise UsageError(
                source,
                "source",
                type(src).__name__,
                "must be a pathlib.Path to copy or a dict to write",
                "pass Path(...) or the config dict",
            )


def check_config_folder(folder: Path) -> None:
    """Check the name and contents of every ``*.json`` in a user's config folder.

    A misnamed file is refused on the CPU too, where no config is read: the same folder is
    used on a GPU, where vLLM would silently ignore it and measure the default tiling.
    """
    for path in _json_files(folder):
        check_config_name(path.name, f"file {path}")
        load_config(path)


def lay_out_config_folder(dest: Path, files: Mapping[str, FileSource]) -> Path:
    """Create ``dest`` holding the given files, each checked first; returns ``dest``.

    ``dest`` must not exist or be empty: a stale file left from another variant would be
    picked up by vLLM and silently change what is measured.
    """
    if dest.exists():
        if not dest.is_dir():
            raise UsageError(
                f"config folder {dest}",
                "path",
                str(dest),
                "exists and is not a directory",
                "pass a new folder path",
            )
        if any(dest.iterdir()):
            raise UsageError(
                f"config folder {dest}",
                "contents",
                sorted(p.name for p in dest.iterdir()),
                "folder is not empty; leftover files would be read by vLLM too",
                "lay out each variant into a fresh, empty folder",
            )
    check_variant_files(files)
    dest.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        if isinstance(src, Path):
            shutil.copyfile(src, dest / name)  # byte-exact: the hash matches the source file
        else:
            text = json.dumps(_as_json_dict(name, src), indent=4) + "\n"
            (dest / name).write_text(text, encoding="utf-8")
    return dest


def config_hash(folder: Path) -> str:
    """sha256 over the sorted ``*.json`` names and bytes; ``"in-tree"`` for an empty folder.

    Other files and subfolders are ignored because vLLM never reads them.
    """
    paths = _json_files(folder)
    if not paths:
        return IN_TREE
    h = hashlib.sha256()
    for p in paths:
        name = p.name.encode("utf-8")
        data = p.read_bytes()
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def env_for(folder: Path) -> dict[str, str]:
    """Environment for the server process; always set, so a stray outer value cannot leak in."""
    return {ENV_VAR: str(folder)}


def in_tree_config_dir() -> Path | None:
    """vLLM's shipped ``fused_moe/configs`` folder, found without importing vLLM (slow)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations)))
    d = base / "model_executor" / "layers" / "fused_moe" / "configs"
    return Path(os.path.realpath(d)) if d.is_dir() else None


@dataclass(frozen=True)
class ConfigResolution:
    """Which file vLLM will load for one config name, and the log line it will print."""

    source: Literal["tuned", "in-tree", "default"]
    path: str | None
    log_line: str


def resolve_config(
    file_name: str, tuned_folder: Path | str | None, in_tree_dir: Path | None
) -> ConfigResolution:
    """Replay ``get_moe_configs``' lookup: tuned folder, then in-tree, then the default.

    Paths are joined the way vLLM does (``os.path.join`` on the env value as given), so
    ``log_line`` matches the server log verbatim and can be searched for in it.
    """
    parse(file_name)
    candidates: list[tuple[Literal["tuned", "in-tree"], str]] = []
    if tuned_folder is not None:
        candidates.append(("tuned", os.path.join(str(tuned_folder), file_name)))
    if in_tree_dir is not None:
        candidates.append(("in-tree", os.path.join(str(in_tree_dir), file_name)))
    for kind, path in candidates:
        if os.path.exists(path):
            return ConfigResolution(kind, path, f"Using configuration from {path} for MoE layer.")
    tried = ", ".join(p for _, p in candidates)
    return ConfigResolution(
        "default",
        None,
        "Using default MoE config. Performance might be sub-optimal! "
        f"Config file not found at {tried}",
    )
