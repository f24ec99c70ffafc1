"""Find the MoE config files a change touches, with their before/after contents, from real git.

A PR that edits ``E=128,N=768,device_name=NVIDIA_H200.json`` should be benchmarked base vs
head for exactly that file. Files are matched by vLLM's naming pattern anywhere in the repo
(vLLM's own ``configs/`` folder, a project's tuned folder, ...). A file that did not exist on
one side is "in-tree" on that side: vLLM then falls back to its shipped file or the default.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.folder import IN_TREE
from pytest_moeperf.moeconfig.naming import MoeConfigName, is_config_file_name, parse
from pytest_moeperf.moeconfig.validate import TileConfig, parse_config_text

Status = Literal["added", "deleted", "modified"]
_STATUS: dict[str, Status] = {"A": "added", "D": "deleted", "M": "modified", "T": "modified"}
_WORKTREE = "working tree"
_RANGE_FIX = (
    "use 'BASE..HEAD', 'BASE...HEAD' (from the merge base) or one revision (vs the working "
    "tree), e.g. 'origin/main...HEAD'; in CI fetch the base branch first (shallow clones lack "
    "it: actions/checkout with fetch-depth: 0, or git fetch origin main)"
)


@dataclass(frozen=True)
class ChangedConfig:
    """One changed config file. ``base_text``/``head_text`` None means "in-tree" on that side.

    ``base_rev``/``head_rev`` are commit shas ("working tree" for uncommitted changes) or, from
    :func:`changed_between_folders`, the folder paths; the labels name the exact blob or file.
    """

    path: str  # relative to the repo root (or the folder), '/'-separated
    name: MoeConfigName
    status: Status
    base_rev: str
    head_rev: str
    base_text: str | None
    head_text: str | None
    base_label: str
    head_label: str

    @property
    def file_name(self) -> str:
        return self.name.file_name()

    def base_config(self) -> dict[int, TileConfig] | None:
        """Validated base config; None for in-tree. Raises UsageError naming the blob/file."""
        if self.base_text is None:
            return None
        return parse_config_text(self.base_text, self.base_label)

    def head_config(self) -> dict[int, TileConfig] | None:
        if self.head_text is None:
            return None
        return parse_config_text(self.head_text, self.head_label)


def _label(text: str | None, where: str) -> str:
    return IN_TREE if text is None else where


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, check=False, timeout=60
        )
    except FileNotFoundError:
        raise UsageError(
            "git", "executable", "git", "git is not installed or not on PATH", "install git"
        ) from None


def _check_repo(repo: Path) -> Path:
    r = _git(repo, "rev-parse", "--show-toplevel")
    if r.returncode != 0:
        raise UsageError(
            f"repo {repo}",
            "path",
            str(repo),
            "not inside a git work tree: " + r.stderr.decode(errors="replace").strip(),
            "pass the repository root (the folder that holds .git)",
        )
    return Path(r.stdout.decode().strip())


def _verify_rev(repo: Path, rev: str, git_range: str) -> str:
    r = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if r.returncode != 0:
        raise UsageError(
            "git range",
            "range",
            git_range,
            f"revision {rev!r} does not name a commit in {repo}",
            _RANGE_FIX,
        )
    return r.stdout.decode().strip()


def _split_range(repo: Path, git_range: str) -> tuple[str, str | None]:
    """Return (base commit, head commit or None for the working tree)."""
    if not git_range or git_range.strip() != git_range or git_range.startswith("-"):
        raise UsageError("git range", "range", git_range, "not a revision range", _RANGE_FIX)
    if "..." in git_range:
        a, b = git_range.split("...", 1)
        a_sha = _verify_rev(repo, a or "HEAD", git_range)
        b_sha = _verify_rev(repo, b or "HEAD", git_range)
        r = _git(repo, "merge-base", a_sha, b_sha)
        if r.returncode != 0:
            raise UsageError(
                "git range", "range", git_range, "the two sides have no merge base", _RANGE_FIX
            )
        return r.stdout.decode().strip(), b_sha
    if ".." in git_range:
        a, b = git_range.split("..", 1)
        return _verify_rev(repo, a or "HEAD", git_range), _verify_rev(repo, b or "HEAD", git_range)
    return _verify_rev(repo, git_range, git_range), None


def _show(repo: Path, rev: str, path: str) -> str:
    r = _git(repo, "show", f"{rev}:{path}")
    if r.returncode != 0:
        raise UsageError(
            f"git show {rev}:{path}",
            "path",
            path,
            "could not read the file at that revision: " + r.stderr.decode(errors="replace"),
            "check that the revision is fetched",
        )
    return r.stdout.decode("utf-8", errors="replace")


def changed_config_files(repo: Path, git_range: str) -> list[ChangedConfig]:
    """MoE config files added, deleted or modified in ``git_range``, sorted by path.

    Renames are reported as a delete plus an add: vLLM looks files up by name, so a rename is
    two different configs. Skipped: names that are not valid vLLM config names,
    ``,backend=...`` files (FlyDSL), which vLLM never reads from a tuned folder, and mode-only
    changes (same bytes). A single revision compares it with the working tree (tracked files
    only).
    """
    top = _check_repo(repo)
    base, head = _split_range(top, git_range)
    args = ["diff", "--name-status", "-z", "--no-renames", "--no-ext-diff", "--no-color", base]
    if head is not None:
        args.append(head)
    r = _git(top, *args, "--")
    if r.returncode != 0:
        raise UsageError(
            "git range", "range", git_range, r.stderr.decode(errors="replace").strip(), _RANGE_FIX
        )
    text = r.stdout.decode("utf-8", errors="surrogateescape").rstrip("\0")
    fields = text.split("\0") if text else []
    out: list[ChangedConfig] = []
    head_label = head if head is not None else _WORKTREE
    for code, path in zip(fields[0::2], fields[1::2], strict=True):
        status = _STATUS.get(code[:1])
        base_name = path.rsplit("/", 1)[-1]
        if status is None or not is_config_file_name(base_name):
            continue
        name = parse(base_name, source=f"{path} in {git_range}")
        if name.backend is not None:
            continue
        base_text = None if status == "added" else _show(top, base, path)
        head_text: str | None = None
        if status != "deleted":
            if head is None:
                head_text = (top / path).read_text(encoding="utf-8", errors="replace")
            else:
                head_text = _show(top, head, path)
        if status == "modified" and base_text == head_text:
            continue  # mode-only change (chmod): vLLM reads the same bytes
        out.append(
            ChangedConfig(
                path,
                name,
                status,
                base,
                head_label,
                base_text,
                head_text,
                _label(base_text, f"{base}:{path}"),
                _label(head_text, f"{head}:{path}" if head else f"{top / path}"),
            )
        )
    return sorted(out, key=lambda c: c.path)


def changed_between_folders(a: Path, b: Path) -> list[ChangedConfig]:
    """Config files that differ between two variant folders (a = base, b = head), by name.

    Byte comparison: a re-formatted file counts as modified; compare ``base_config()`` and
    ``head_config()`` to ask whether the tiling changed.
    """
    files: dict[str, dict[str, Path]] = {}
    for side, folder in (("a", a), ("b", b)):
        if not folder.is_dir():
            raise UsageError(
                f"config folder {folder}",
                "path",
                str(folder),
                "is not a directory",
                "pass two existing variant folders",
            )
        for p in folder.iterdir():
            if p.is_file() and is_config_file_name(p.name) and parse(p.name).backend is None:
                files.setdefault(p.name, {})[side] = p
    out: list[ChangedConfig] = []
    for fname, sides in sorted(files.items()):
        ta = sides["a"].read_text(encoding="utf-8", errors="replace") if "a" in sides else None
        tb = sides["b"].read_text(encoding="utf-8", errors="replace") if "b" in sides else None
        if ta == tb:
            continue
        status: Status = "added" if ta is None else "deleted" if tb is None else "modified"
        out.append(
            ChangedConfig(
                fname,
                parse(fname),
                status,
                str(a),
                str(b),
                ta,
                tb,
                _label(ta, f"file {a / fname}"),
                _label(tb, f"file {b / fname}"),
            )
        )
    return out
