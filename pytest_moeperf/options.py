"""Every plugin setting, and the one function that resolves it: marker > CLI > env > ini > default.

Modelled on pytest-timeout: one table of settings, one resolver, and every value carries the place
it came from, so an error can say ``--moeperf-runs (command line)`` or ``moeperf_runs (ini file
pytest.ini)`` instead of just "bad value". The per-test settings (a marker's layer, the spec
file's layer below the ini file) are resolved once per test by ``pytest_moeperf.settings``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.errors import UsageError


@dataclass(frozen=True)
class Setting:
    """One setting: its CLI flag, ini key and environment variable, parser and default."""

    name: str
    flag: str
    help: str
    parse: Callable[[str], Any]
    default: Any = None
    is_flag: bool = False  # store_true on the command line
    metavar: str | None = None

    @property
    def ini(self) -> str:
        return self.name

    @property
    def env(self) -> str:
        return self.name.upper()


@dataclass(frozen=True)
class Resolved:
    value: Any
    #: "marker @pytest.mark.X on FILE:LINE (test)", "command line --flag", "environment variable
    #: VAR", "ini option key (file)", "spec file FILE:LINE" (per-test settings only), "default"
    source: str


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def parse_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("must be an integer >= 1") from None
    if value < 1:
        raise ValueError("must be an integer >= 1")
    return value


def parse_positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError("must be a finite number > 0")
    return value


def parse_levels(text: str) -> str:
    """``1,4,16,64``: concurrency levels of a sweep, checked here so the error names its source."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError("expected comma-separated integers >= 1, e.g. 1,4,16,64")
    return ",".join(str(int(p)) for p in parts)


def parse_dir(text: str) -> str:
    """A folder path; that it exists is checked by ``resolve_dir``, which knows the rootdir."""
    t = text.strip()
    if not t:
        raise ValueError("is empty; expected a folder path")
    return t


def parse_url(text: str) -> str:
    """``http://host:port[/prefix]``, checked whole here (the load client speaks plain HTTP)."""
    from urllib.parse import urlsplit

    t = text.strip().rstrip("/")
    if t.startswith("https://"):
        raise ValueError("https is not supported (the load client does not speak TLS); use the "
                         "server's plain http:// address")  # fmt: skip
    if not t.startswith("http://"):
        raise ValueError("must start with http://")
    try:
        parts = urlsplit(t)
        port = parts.port  # ValueError: not a number, or beyond 0-65535
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if not parts.hostname:
        raise ValueError("has no host")
    if port == 0:
        raise ValueError("port 0 is not a server's port")
    if parts.query or parts.fragment or parts.username:
        raise ValueError("must not have a query, fragment or user name")
    return t.removesuffix("/v1")


SETTINGS: tuple[Setting, ...] = (
    Setting("moeperf_gpu", "--gpu", "run perf tests marked moeperf_gpu (needs a GPU machine).",
            parse_bool, False, is_flag=True),
    Setting("moeperf_refresh_baselines", "--moeperf-refresh-baselines",
            "write new baselines from this run (only when every run completed and passed its "
            "gates).", parse_bool, False, is_flag=True),
    Setting("moeperf_reason", "--moeperf-reason", "why baselines are refreshed (stored in the "
            "baseline's provenance).", str, "", metavar="TEXT"),
    Setting("moeperf_baseline_dir", "--moeperf-baseline-dir", "directory of baseline JSON files "
            "(default: baselines/ under the rootdir).", str, "baselines", metavar="DIR"),
    Setting("moeperf_specs_dir", "--moeperf-specs-dir", "folder a moeperf_spec marker's bare "
            "spec name is looked up in, after the test's own folder (default: perf_tests/specs "
            "under the rootdir).", parse_dir, "perf_tests/specs", metavar="DIR"),
    Setting("moeperf_models_dir", "--moeperf-models-dir", "folder of the models a spec names "
            "bare (model.path: qwen3-30b-a3b-shape) (default: perf_tests/models under the "
            "rootdir).", parse_dir, "perf_tests/models", metavar="DIR"),
    Setting("moeperf_server_url", "--moeperf-server-url", "use a running OpenAI-compatible server "
            "at this URL instead of starting vLLM (the MoE config is then declared, not set).",
            parse_url, None, metavar="URL"),
    Setting("moeperf_quick", "--moeperf-quick", "quick mode: fewer requests and probes, one run "
            "per config; results are marked quick and never written as baselines.",
            parse_bool, False, is_flag=True),
    Setting("moeperf_report", "--moeperf-report", "write an HTML and a Markdown report to this "
            "path (suffix replaced).", str, None, metavar="PATH"),
    Setting("moeperf_results", "--moeperf-results", "JSON results file for the session.",
            str, "moeperf-results/results.json", metavar="PATH"),
    Setting("moeperf_benchmark_json", "--moeperf-benchmark-json", "also write the results in "
            "pytest-benchmark's JSON format, for `pytest-benchmark compare` (default when a perf "
            "test also uses the benchmark fixture: pytest-benchmark.json beside the results "
            "file).", str, None, metavar="PATH"),
    Setting("moeperf_records", "--moeperf-records", "also write every probe's per-request "
            "records (send, first token, end, tokens, status) under this folder, one gzipped "
            "JSON-lines file a load: what a run that misbehaved leaves to diagnose it "
            "(load.records.read_records).", str, None, metavar="DIR"),
    Setting("moeperf_ci", "--moeperf-ci", "CI mode: a missing baseline fails the test instead of "
            "warning.", parse_bool, False, is_flag=True),
    Setting("moeperf_runs", "--moeperf-runs", "repeated runs per config; a "
            "moeperf_spec(runs=N) marker beats it, and without either the spec's runs: is used "
            "(else 3).", parse_positive_int, None, metavar="N"),
    Setting("moeperf_startup_timeout", "--moeperf-startup-timeout", "seconds to wait for the "
            "server's /health.", parse_positive_float, 900.0, metavar="S"),
    Setting("moeperf_hbm_bandwidth", "--moeperf-hbm-bandwidth", "rated HBM bandwidth in TB/s "
            "for MBU, overriding the built-in table.", parse_positive_float, None, metavar="TBS"),
    Setting("moeperf_allow_other_hardware", "--moeperf-allow-other-hardware", "compare against "
            "a baseline recorded on other hardware or software (normally skipped with a warning).",
            parse_bool, False, is_flag=True),
    Setting("moeperf_cache_dir", "--moeperf-cache-dir", "where the embedded model is generated "
            "(default: ~/.cache/pytest-moeperf).", str, None, metavar="DIR"),
    Setting("moeperf_ab_range", "--moeperf-ab-range", "A/B gate: the MoE config files changed "
            "in this git range (e.g. origin/main...HEAD) become base-vs-head cases.",
            str, None, metavar="RANGE"),
    Setting("moeperf_ab_folders", "--moeperf-ab-folders", "A/B gate: compare the config files "
            "that differ between two folders, BASE,HEAD.", str, None, metavar="BASE,HEAD"),
    Setting("moeperf_ab_pairs", "--moeperf-ab-pairs", "A/B gate: interleaved base/head pairs "
            "(default: the spec's runs, at least 3).", parse_positive_int, None, metavar="N"),
    Setting("moeperf_ab_control", "--moeperf-ab-control", "A/B gate: also run an A/A control "
            "(base vs a fresh server with a copy of base); a difference there fails the gate as "
            "too noisy.", parse_bool, False, is_flag=True),
    Setting("moeperf_ab_summary", "--moeperf-ab-summary", "A/B gate: Markdown summary to paste "
            "into the PR.", str, "moeperf-results/ab-summary.md", metavar="PATH"),
    Setting("moeperf_sweep", "--moeperf-sweep", "A/B gate: also sweep these concurrencies, one "
            "closed-loop run per side per level (e.g. 1,4,16,64).", parse_levels, None,
            metavar="LEVELS"),
    Setting("moeperf_gpus", "--moeperf-gpus", "GPUs the pool leases to servers, as "
            "CUDA_VISIBLE_DEVICES entries (default: CUDA_VISIBLE_DEVICES, else every GPU NVML "
            "sees); with --moeperf-server-url, the local GPUs of that server, for energy.",
            str, None, metavar="LIST"),
    Setting("moeperf_gpu_wait", "--moeperf-gpu-wait", "seconds a server waits for its GPUs "
            "while other xdist workers hold them.", parse_positive_float, 3600.0, metavar="S"),
    Setting("moeperf_gpu_lock_dir", "--moeperf-gpu-lock-dir", "folder of the GPU pool's lock "
            "files (default: the run's temporary root, shared by its xdist workers); give one "
            "folder to several pytest runs that share a node.", str, None, metavar="DIR"),
)  # fmt: skip

BY_NAME = {s.name: s for s in SETTINGS}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("moeperf", "vLLM / fused-MoE performance regression testing")
    for s in SETTINGS:
        env_note = f" [env {s.env}, ini {s.ini}]"
        if s.is_flag:
            group.addoption(s.flag, action="store_true", default=None, dest=s.name,
                            help=s.help + env_note)  # fmt: skip
        else:
            group.addoption(s.flag, action="store", default=None, dest=s.name,
                            metavar=s.metavar, help=s.help + env_note)  # fmt: skip
        parser.addini(s.ini, s.help, type="string", default=None)


def _parse(setting: Setting, raw: object, source: str) -> Resolved:
    if not isinstance(raw, str):
        return Resolved(raw, source)
    try:
        return Resolved(setting.parse(raw), source)
    except ValueError as exc:
        raise UsageError(source, setting.name, raw, str(exc),
                         f"set a valid value for {setting.flag} / {setting.env} / {setting.ini}"
                         ) from None  # fmt: skip


def resolve(config: pytest.Config, name: str, marker_value: object = None,
            marker_name: str | None = None,
            marker_source: str | None = None) -> Resolved:  # fmt: skip
    """Resolve a setting: marker > command line > environment > ini file > default.

    ``marker_source`` (``markers.where``: the marker, its file and line) names a marker's value;
    without it the source is ``marker @pytest.mark.<marker_name>``.
    """
    setting = BY_NAME[name]
    if marker_value is not None:
        return _parse(setting, marker_value,
                      marker_source or f"marker @pytest.mark.{marker_name}")  # fmt: skip
    cli = config.getoption(setting.name, default=None)
    if cli is not None and cli is not False:
        return _parse(setting, cli, f"command line {setting.flag}")
    env = os.environ.get(setting.env)
    if env is not None and env != "":
        return _parse(setting, env, f"environment variable {setting.env}")
    ini = config.getini(setting.ini)
    if ini not in (None, "", []):
        where = str(config.inipath) if config.inipath else "ini"
        return _parse(setting, str(ini), f"ini option {setting.ini} ({where})")
    return Resolved(setting.default, "default")


def value(config: pytest.Config, name: str) -> Any:
    return resolve(config, name).value


def rooted(config: pytest.Config, raw: object) -> Path:
    """``raw`` as an absolute path: ``~`` expanded, a relative path taken from the rootdir."""
    p = Path(os.path.expanduser(str(raw)))
    return p if p.is_absolute() else Path(config.rootpath) / p


def resolve_path(config: pytest.Config, name: str) -> Path | None:
    """A path setting, relative paths taken from the rootdir (so CI and laptops agree)."""
    raw = value(config, name)
    return None if raw is None else rooted(config, raw)


def resolve_dir(config: pytest.Config, name: str) -> Resolved:
    """A folder setting as an absolute path, with its source. A folder someone set (command line,
    environment, ini file) must exist; the default need not (a project without perf_tests/)."""
    setting = BY_NAME[name]
    got = resolve(config, name)
    path = rooted(config, got.value)
    if got.source != "default" and not path.is_dir():
        problem = "is not a folder" if path.exists() else "no such folder"
        knob = (setting.flag if got.source.startswith("command line")
                else setting.env if got.source.startswith("environment")
                else setting.ini)  # fmt: skip
        raise UsageError(got.source, setting.name, got.value, f"{problem} ({path})",
                         f"point {knob} at an existing folder (a relative path is taken from the "
                         f"rootdir {config.rootpath}), or unset it for the default "
                         f"{setting.default}")  # fmt: skip
    return Resolved(path, got.source)
