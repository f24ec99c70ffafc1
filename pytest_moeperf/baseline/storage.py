"""Baseline files: one JSON file per (test id, key, machine), written atomically, read with
clear errors.

Baselines live in git next to the tests, so the format is chosen for reviewable diffs: keys
sorted, two-space indent, one value per line. A reader never sees a half-written file (temp
file in the same directory, fsync, os.replace) and concurrent writers (pytest-xdist workers)
are serialised by an fcntl lock on one lock file per store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_moeperf.baseline.key import BaselineKey, safe_name
from pytest_moeperf.errors import UsageError
from pytest_moeperf.verdict.metrics import DEFAULT_METRICS

if TYPE_CHECKING:
    from pytest_moeperf.baseline.schema import ProvenanceEntry

SCHEMA_VERSION = 1
LOCK_NAME = ".moeperf-baseline.lock"
#: The fix of a baseline file that cannot be read as one (also the schema's errors).
RERECORD = "restore the file from git or re-record the baseline"
#: Far above any real baseline (a few KiB); bounds what a reader takes into memory.
MAX_FILE_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Provenance:
    """Who wrote a baseline, when, from which commit and why (shown when a test fails)."""

    commit: str
    date: str
    host: str
    command: str
    reason: str
    plugin_version: str

    @classmethod
    def collect(
        cls, reason: str, *, command: str | None = None, cwd: Path | None = None
    ) -> Provenance:
        """Provenance of the current process: git HEAD (with "-dirty"), UTC time, host, argv."""
        from pytest_moeperf import __version__

        return cls(
            commit=_git_commit(cwd),
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(),
            command=command if command is not None else shlex.join(sys.argv),
            reason=reason,
            plugin_version=__version__,
        )

    def to_dict(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: object, *, source: str) -> Provenance:
        from pytest_moeperf.baseline.schema import ProvenanceEntry, validate

        return cls.from_entry(validate(ProvenanceEntry, d, source))

    @classmethod
    def from_entry(cls, entry: ProvenanceEntry) -> Provenance:
        """From the file's validated ``provenance`` object (``baseline/schema.py``)."""
        return cls(**entry.model_dump())


def _git_commit(cwd: Path | None) -> str:
    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip()

    # A GPU runner's copy of the tree may lack .git or carry a stale one (seen on the H200: the
    # tree was a later commit than its .git said): the runner's word, when given, wins.
    env = os.environ.get("MOEPERF_GIT_COMMIT", "").strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return f"{env} (MOEPERF_GIT_COMMIT)" if env else "unknown"
    here = commit + ("-dirty" if dirty else "")
    if env and env != here:
        return f"{env} (MOEPERF_GIT_COMMIT; the tree's .git said {here})"
    return here


@dataclass
class Baseline:
    """Per-run values of every metric for one test under one key, plus how they were made.

    ``metrics`` holds one value per run (the verdict needs the spread, not just a mean);
    ``runs`` holds whatever per-run summaries the caller wants kept; ``accuracy`` holds
    per-question outcomes for the paired accuracy gate, or None.
    """

    test_id: str
    key: BaselineKey
    metrics: dict[str, list[float]]
    runs: list[dict[str, Any]]
    provenance: Provenance
    accuracy: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # unknown keys, kept on rewrite

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        d.update(
            schema_version=self.schema_version,
            test_id=self.test_id,
            key=self.key.to_dict(),
            metrics={k: list(v) for k, v in self.metrics.items()},
            runs=list(self.runs),
            accuracy=self.accuracy,
            provenance=self.provenance.to_dict(),
        )
        return d

    def to_json(self) -> str:
        """The file's text: sorted keys, one value per line, no NaN (JSON has none)."""
        _check_metrics(self.metrics, f"baseline of {self.test_id!r}")
        try:
            text = json.dumps(
                self.to_dict(), indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False
            )
        except (TypeError, ValueError) as e:
            raise UsageError(
                f"baseline of {self.test_id!r}",
                "runs/accuracy",
                str(e),
                "cannot be written as JSON",
                "pass only str/int/float/bool/None, lists and dicts, without NaN or infinity",
            ) from e
        return text + "\n"

    @classmethod
    def from_dict(cls, d: object, *, source: str) -> Baseline:
        """Validate a parsed file (``baseline/schema.py``); every problem is a UsageError
        naming ``source`` and the field."""
        from pytest_moeperf.baseline.schema import BaselineFile, validate

        version = d.get("schema_version") if isinstance(d, dict) else None
        if isinstance(d, dict) and version is None:
            raise UsageError(
                source, "schema_version", None, "is missing (not a moeperf baseline?)", RERECORD
            )
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            raise UsageError(
                source,
                "schema_version",
                version,
                f"was written by a newer pytest-moeperf (this one reads schema {SCHEMA_VERSION})",
                "upgrade the plugin: pip install -U pytest-moeperf",
            )
        m = validate(BaselineFile, d, source)
        return cls(
            test_id=m.test_id,
            key=BaselineKey.from_entry(m.key),
            metrics=_check_metrics(m.metrics, source),  # runs in each, a gated metric
            runs=m.runs,
            provenance=Provenance.from_entry(m.provenance),
            accuracy=m.accuracy,
            schema_version=m.schema_version,
            extra=dict(m.model_extra or {}),
        )


def _check_metrics(metrics: object, source: str) -> dict[str, list[float]]:
    if not isinstance(metrics, dict):
        raise UsageError(source, "metrics", metrics, "must be an object", RERECORD)
    out: dict[str, list[float]] = {}
    for name, values in metrics.items():
        field = f"metrics.{name if str(name).isprintable() else repr(name)}"  # one line
        ok = isinstance(values, list) and all(_finite_number(v) for v in values)
        if not ok:
            raise UsageError(
                source,
                field,
                values,
                "must be a list of finite numbers (one per run)",
                RERECORD,
            )
        if not values:  # the gate skips a metric without runs: the file would gate nothing
            raise UsageError(source, field, values,
                             "has no runs, so this metric would not be gated",
                             RERECORD)  # fmt: skip
        out[str(name)] = [float(v) for v in values]
    gated = [n for n, s in DEFAULT_METRICS.items() if s.role == "gate"]
    if not any(n in out for n in gated):
        raise UsageError(source, "metrics", sorted(out),
                         f"holds no gated metric (one of {', '.join(gated)}), so this baseline "
                         "gates nothing", RERECORD)  # fmt: skip
    return out


def _finite_number(v: object) -> bool:
    """A JSON number a float can hold: no bool, NaN, infinity or int beyond float range."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int such as 10**400
        return False


def read_baseline_file(path: Path) -> Baseline:
    """Read and validate one baseline file; corrupt JSON is reported with line and column."""
    source = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:  # never read a stray dump into memory
            raise UsageError(source, "file", source,
                             f"is {size / 2**20:.0f} MiB; a baseline file is a few KiB, so "
                             "this is not one", RERECORD)  # fmt: skip
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(source, "file", source, "does not exist", "check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(source, "file", source, f"cannot be read ({e})", RERECORD) from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        problem = f"is not valid JSON ({e.msg}): the file is corrupt or truncated"
        if not text.strip():
            problem = "is empty: the file was truncated"
        raise UsageError(source, "JSON", where, problem, RERECORD) from e
    except (ValueError, RecursionError) as e:  # a 5,000-digit number; arrays nested 100,000 deep
        problem = ("nests deeper than a JSON reader allows" if isinstance(e, RecursionError)
                   else f"cannot be read as JSON ({str(e).split(';')[0]})")  # fmt: skip
        raise UsageError(source, "JSON", "the whole file", f"{problem}: the file is corrupt",
                         RERECORD) from None  # fmt: skip
    try:
        return Baseline.from_dict(data, source=source)
    except UsageError as e:
        raise _at_line(e, text) from None


def _at_line(err: UsageError, text: str) -> UsageError:
    """The same error with ``:LINE`` of the field it names (``metrics.x`` -> ``"x":``)."""
    from pytest_moeperf.moeconfig.validate import line_of_key

    line = line_of_key(text, err.what.split(".")[-1])
    if line is None:
        return err
    return UsageError(f"{err.source}:{line}", err.what, err.value, err.problem, err.fix)


class BaselineStore:
    """A directory of baselines: ``root/<test>-<hash>/<key slug>.json`` (``.mN.json`` for the
    N-th machine of the same names)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def dir_for(self, test_id: str) -> Path:
        """Test ids hold '/', '::' and '[...]'; the hash keeps distinct ids apart after cleaning."""
        digest = hashlib.sha256(test_id.encode()).hexdigest()[:8]
        readable = safe_name(test_id.replace("::", "--"), limit=80)
        return self.root / f"{readable}-{digest}"

    def first_path(self, test_id: str, key: BaselineKey) -> Path:
        """The first machine's file of this key: where a baseline of these names is looked for
        before any is read."""
        return self.dir_for(test_id) / f"{key.slug()}.json"

    def _machine_files(self, test_id: str, key: BaselineKey) -> list[tuple[Path, Baseline]]:
        """Each machine's file of this key, read (``baseline/machines.py``)."""
        from pytest_moeperf.baseline.machines import machine_paths

        return [(p, read_baseline_file(p))
                for p in machine_paths(self.dir_for(test_id), key.slug())]  # fmt: skip

    def find(self, test_id: str, key: BaselineKey) -> tuple[Path, Baseline | None]:
        """The file a run with this key is compared with and its baseline (None: no file):
        its machine's (the calibration decides among files of the same names), else the
        closest other machine's. Each file is read once."""
        from pytest_moeperf.baseline.machines import for_reading

        files = self._machine_files(test_id, key)
        path = for_reading(key.calibration, [(p, b.key.calibration) for p, b in files])
        if path is None:
            return self.first_path(test_id, key), None
        baseline = dict(files)[path]
        for what, want, got in (("test_id", test_id, baseline.test_id), ("key", key, baseline.key)):
            if want != got:
                raise UsageError(
                    str(path),
                    what,
                    got.to_dict() if isinstance(got, BaselineKey) else got,
                    "does not match the file's place in the baseline directory",
                    "move the file back or re-record the baseline",
                )
        return path, baseline

    def path_for(self, test_id: str, key: BaselineKey) -> Path:
        """The file a run with this key is compared with (``find``)."""
        return self.find(test_id, key)[0]

    def load(self, test_id: str, key: BaselineKey) -> Baseline | None:
        """The baseline of this test and key for this machine (``find``), or None."""
        return self.find(test_id, key)[1]

    def write_path(self, test_id: str, key: BaselineKey) -> Path:
        """Where a refresh with this key writes: its machine's file, or a new one beside the
        other machines' (never over another machine's baseline)."""
        from pytest_moeperf.baseline.machines import for_writing

        files = [(p, b.key.calibration) for p, b in self._machine_files(test_id, key)]
        return for_writing(key.calibration, files, self.dir_for(test_id), key.slug())

    def find_other_keys(
        self, test_id: str, *, exclude: BaselineKey | None = None
    ) -> list[BaselineKey]:
        """Keys of every baseline recorded for this test (minus ``exclude``), sorted by slug.

        Used to say "there is a baseline, but from other hardware / another vLLM".
        """
        folder = self.dir_for(test_id)
        if not folder.is_dir():
            return []
        keys = [read_baseline_file(p).key for p in sorted(folder.glob("*.json"))]
        return sorted((k for k in keys if k != exclude), key=lambda k: k.slug())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK_NAME, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def write(self, baseline: Baseline, *, complete: bool,
              before_replace: Callable[[Path], None] | None = None) -> Path:  # fmt: skip
        """Write atomically; refuses a partial run, whose numbers would poison later verdicts.

        ``before_replace(path)`` runs under the lock just before the rename: the file another
        refresh wrote meanwhile is still there to be named (and cannot change under it)."""
        if not complete:
            raise UsageError(
                str(self.write_path(baseline.test_id, baseline.key)),
                "complete",
                complete,
                "the run was partial (failed, aborted or interrupted), so it is not a baseline",
                "fix the failure and rerun every run of the test to record a baseline",
            )
        text = baseline.to_json()
        with self._locked():
            path = self.write_path(baseline.test_id, baseline.key)  # under the lock: as of now
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o644)  # mkstemp makes 0600; baselines are shared through git
                if before_replace is not None:
                    before_replace(path)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # make the rename itself durable
            finally:
                os.close(dir_fd)
        return path
