"""Checks run in test setup, before any server starts: a typo costs a second, not a server start.

Every input a perf test will read is checked here and the first problem is raised as one
``UsageError`` naming its source: the markers (and the MoE config files they point at), the
workload spec (file and line; its engine_args against vLLM's own parser), every plugin option
(command line, environment or ini file) and the test's stored baselines (file and line). A
nightly job with a bad baseline file would otherwise measure for an hour and then fail on
reading it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_moeperf import markers, options, settings
from pytest_moeperf.errors import UsageError

if TYPE_CHECKING:
    from pytest_moeperf.spec.model import Spec

#: Fixtures whose tests start servers: their inputs are checked before setup.
SERVER_FIXTURES = ("moeperf", "moeperf_ab", "moeperf_server_factory")


def check_item(item: pytest.Item) -> None:
    """Raise the first bad input of ``item`` as a UsageError; return quietly if all is well.

    A test that starts servers gets its settings resolved once here (``settings``: marker >
    command line > environment > ini file > spec file > default) and kept in ``item.stash``,
    where the flow modules read them.
    """
    markers.slo_gate(item)
    markers.accuracy_gate(item)
    markers.exclusive(item)
    _check_moe_config(item)
    names = getattr(item, "fixturenames", ())
    if not any(f in names for f in SERVER_FIXTURES):
        if item.get_closest_marker("moeperf_spec") is not None:  # a helper test reads it too
            specs_dir = options.resolve_dir(item.config, "moeperf_specs_dir").value
            choice = markers.spec_choice(item, specs_dir)
            if choice is not None:
                from pytest_moeperf.spec.loader import load_spec

                load_spec(choice.path)
        return
    resolved = item.stash[settings.SETTINGS_KEY] = settings.resolve_item_settings(item)
    for setting in options.SETTINGS:  # session-wide ones, and values a marker shadows here
        options.resolve(item.config, setting.name)
    spec = resolved.spec.value
    if spec is not None and spec.engine_args:
        _check_engine_args(item, spec, resolved.cache_dir.value)
    if "moeperf" in names:
        check_baselines(resolved.baseline_dir.value, item.nodeid)
        check_records_dir(item.config)


def check_records_dir(config: pytest.Config) -> None:
    """``--moeperf-records`` must name a folder this run can write: found now, not when the
    first probe's records are due (after a server start and a warm-up)."""
    import tempfile

    records = options.resolve(config, "moeperf_records")
    if records.value is None:
        return
    path = options.rooted(config, records.value)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".moeperf-write-check-"):
            pass
    except OSError as exc:
        raise UsageError(records.source, "moeperf_records", records.value,
                         f"cannot write per-request records in {path} "
                         f"({exc.strerror or type(exc).__name__})",
                         "give a folder this user can create and write, or drop the option",
                         ) from None  # fmt: skip


def _check_engine_args(item: pytest.Item, spec: Spec, cache_dir: Path | None) -> None:
    """engine_args against vLLM's own parser; where vLLM is not here, the result says so."""
    from pytest_moeperf.spec.vllm_flags import check_engine_args, server_flags

    known = server_flags(cache_dir)
    if known.flags is None:
        item.user_properties.append(("moeperf.engine_args_check", known.note))
        from pytest_moeperf.plugin import SESSION_KEY

        session = item.config.stash.get(SESSION_KEY, None)
        if session is not None and known.note not in session.warnings:
            session.warn(known.note)  # in the terminal summary and the results JSON
        return
    check_engine_args(spec, known)


def _check_moe_config(item: pytest.Item) -> None:
    choice = markers.moe_config_choice(item)
    if choice is None or choice.in_tree:
        return
    from pytest_moeperf.moeconfig.folder import check_config_folder, check_variant_files

    try:
        if choice.files:
            check_variant_files(choice.files)
        elif choice.folder is not None:
            check_config_folder(choice.folder)
    except UsageError as e:
        raise UsageError(f"{choice.source}, {e.source}", e.what, e.value, e.problem,
                         e.fix) from None  # fmt: skip


def check_baselines(root: Path | None, test_id: str) -> None:
    """Read every baseline file of this test: a truncated, too new or misplaced one fails now."""
    from pytest_moeperf.baseline.storage import BaselineStore, read_baseline_file

    if root is None:
        return
    store = BaselineStore(root)
    folder = store.dir_for(test_id)
    if folder.is_dir():
        for path in sorted(folder.glob("*.json")):
            baseline = read_baseline_file(path)
            if baseline.test_id != test_id:  # the store refuses it after measuring
                _wrong_test(path, baseline.test_id, test_id, store.dir_for(baseline.test_id))


def _wrong_test(path: Path, got: str, want: str, home: Path) -> None:
    from pytest_moeperf.moeconfig.validate import line_of_key

    line = line_of_key(path.read_text(encoding="utf-8"), "test_id")
    raise UsageError(f"{path}:{line}" if line else str(path), "test_id", got,
                     f"this folder holds the baselines of {want!r}, so the store would refuse "
                     "this file after the measurement",
                     f"move the file to the folder of {got!r} ({home}), or re-record the "
                     "baseline of this test")  # fmt: skip
