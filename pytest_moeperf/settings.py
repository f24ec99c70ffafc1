"""Per-test settings: one resolver, run once per test in preflight and kept in ``item.stash``.

Modelled on pytest-timeout's single resolver: every value carries the place it came from, and
the first bad value is one ``UsageError`` naming that place. Precedence, highest first:

    marker > command line > environment > ini file > spec file > built-in default

- ``runs``: ``@pytest.mark.moeperf_spec(..., runs=N)`` > ``--moeperf-runs`` > ``MOEPERF_RUNS`` >
  ini ``moeperf_runs`` > the spec file's ``runs:`` > 3. ``--moeperf-quick`` then measures one run
  whatever the source (quick mode is one run per config).
- ``slo``: ``@pytest.mark.moeperf_slo`` > the spec file's ``slo:`` (no option sets an SLO).
- ``moe_config``: ``@pytest.mark.moeperf_moe_config`` > in-tree. ``accuracy``: the marker, or none.
- every other per-test option, the specs and models folders included: command line >
  environment > ini file > default, as ``options.resolve`` does.

A session value that a marker shadows is still checked by preflight: it applies to the
session's other tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_moeperf import markers, options
from pytest_moeperf.errors import UsageError
from pytest_moeperf.options import Resolved

if TYPE_CHECKING:
    from pytest_moeperf.spec.model import Spec

#: Runs when no marker, option or spec file sets them (the spec loader's own default for runs:).
DEFAULT_RUNS = 3

#: Per-test options that no marker and no spec file carries: ``options.resolve`` as it is.
_PLAIN = ("quick", "server_url", "startup_timeout", "hbm_bandwidth", "ci",
          "allow_other_hardware", "refresh_baselines", "reason", "ab_pairs", "ab_control",
          "sweep")  # fmt: skip
#: Per-test path options, made absolute (relative paths from the rootdir).
_PATHS = ("baseline_dir", "cache_dir")


@dataclass(frozen=True)
class ItemSettings:
    """Every per-test setting as ``Resolved(value, source)``; see the module for precedence."""

    specs_dir: Resolved  #: Path: where a moeperf_spec marker's bare name is looked up
    models_dir: Resolved  #: Path: where a spec's bare model name is looked up
    spec: Resolved  #: spec.model.Spec the moeperf_spec marker names (loaded), or None
    runs: Resolved  #: int
    slo: Resolved  #: spec.model.Slo, or None without a spec
    moe_config: Resolved  #: markers.MoeConfigChoice
    accuracy: Resolved  #: markers.AccuracyGate, or None
    quick: Resolved  #: bool
    server_url: Resolved  #: str, or None
    startup_timeout: Resolved  #: float seconds
    baseline_dir: Resolved  #: Path
    cache_dir: Resolved  #: Path, or None
    hbm_bandwidth: Resolved  #: float TB/s, or None
    ci: Resolved  #: bool
    allow_other_hardware: Resolved  #: bool
    refresh_baselines: Resolved  #: bool
    reason: Resolved  #: str
    ab_pairs: Resolved  #: int, or None
    ab_control: Resolved  #: bool
    sweep: Resolved  #: str, or None


SETTINGS_KEY = pytest.StashKey[ItemSettings]()


def resolve_item_settings(item: pytest.Item) -> ItemSettings:
    """Every per-test setting of ``item``; the first bad one is a UsageError naming its source."""
    config = item.config
    specs_dir = options.resolve_dir(config, "moeperf_specs_dir")
    choice = markers.spec_choice(item, specs_dir.value)
    spec = None
    if choice is not None:
        from pytest_moeperf.spec.loader import load_spec

        spec = load_spec(choice.path)
    runs = _runs(config, choice, spec)
    slo = _slo(item, choice, spec)
    moe = markers.moe_config_choice(item) or markers.MoeConfigChoice(
        markers.IN_TREE, None, None, "default (in-tree)"
    )
    accuracy = markers.accuracy_gate(item)
    models_dir = options.resolve_dir(config, "moeperf_models_dir")
    plain = {f: options.resolve(config, f"moeperf_{f}") for f in _PLAIN}
    paths = {f: _path(config, f"moeperf_{f}") for f in _PATHS}
    return ItemSettings(
        specs_dir=specs_dir,
        models_dir=models_dir,
        spec=Resolved(spec, choice.source if choice else "no moeperf_spec marker"),
        runs=runs,
        slo=slo,
        moe_config=Resolved(moe, moe.source),
        accuracy=Resolved(accuracy, accuracy.source if accuracy else "no moeperf_accuracy marker"),
        **plain,
        **paths,
    )


def of(item: pytest.Item) -> ItemSettings:
    """The settings preflight stashed for ``item``; resolved (and stashed) here if it did not."""
    got = item.stash.get(SETTINGS_KEY, None)
    if got is None:
        got = item.stash[SETTINGS_KEY] = resolve_item_settings(item)
    return got


def _path(config: pytest.Config, name: str) -> Resolved:
    """A folder the run creates if missing (baselines, the model cache). A file in its place, or
    in the place of a folder above it, is refused now, not after the measurement (a refresh
    with ``--moeperf-baseline-dir`` naming a file measured, then failed on writing)."""
    got = options.resolve(config, name)
    if got.value is None:
        return Resolved(None, got.source)
    path = options.rooted(config, got.value)
    there = next((p for p in (path, *path.parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        setting = options.BY_NAME[name]
        raise UsageError(got.source, name, got.value,
                         f"{there} is a file, so no folder can be made there",
                         f"point {setting.flag} / {setting.env} / {setting.ini} at a folder "
                         "(one that does not exist yet is created)")  # fmt: skip
    return Resolved(path, got.source)


def _runs(config: pytest.Config, choice: markers.SpecChoice | None, spec: Spec | None) -> Resolved:
    """marker > command line > environment > ini file > spec file > built-in default."""
    got = options.resolve(config, "moeperf_runs",
                          marker_value=None if choice is None else choice.runs,
                          marker_source=None if choice is None else choice.source)  # fmt: skip
    if got.value is not None:
        return got
    if choice is None or spec is None:
        return Resolved(DEFAULT_RUNS, "default")
    line = _runs_line(choice.path)
    if line is not None:
        return Resolved(spec.runs, f"spec file {choice.path}:{line}")
    return Resolved(DEFAULT_RUNS, f"default (no runs: in spec file {choice.path})")


def _runs_line(path: Path) -> int | None:
    """The line of the spec's top-level ``runs:``, or None where the spec leaves it out."""
    import yaml

    from pytest_moeperf.spec._yaml import compose_and_load

    root, _ = compose_and_load(path.read_text(encoding="utf-8"), str(path))
    if isinstance(root, yaml.MappingNode):
        for key, _value in root.value:
            if key.value == "runs":
                return int(key.start_mark.line) + 1
    return None


def _slo(item: pytest.Item, choice: markers.SpecChoice | None, spec: Spec | None) -> Resolved:
    """marker > spec file: no option sets an SLO."""
    gate = markers.slo_gate(item)
    if gate is not None:
        from pytest_moeperf.spec.model import Slo

        return Resolved(Slo(gate.ttft_p99_ms, gate.tpot_p99_ms, gate.e2el_p99_ms), gate.source)
    if choice is not None and spec is not None:
        return Resolved(spec.slo, f"spec {choice.path}")
    return Resolved(None, "no moeperf_slo marker and no spec")
