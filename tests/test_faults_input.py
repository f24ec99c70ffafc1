"""Bad input through the real plugin: one pytester run per misuse, each fails before any server.

Every run has a ``moeperf`` perf test and a conftest whose server-command and probe-start hooks
shout if a server was about to start: the error must come from setup, as exactly one line that
names the value, where it came from (marker, command line, ini file, spec/config/baseline file
and line) and the fix, with no traceback.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from preflight_helpers import (
    CONFIG_NAME,
    GUARD,
    SPEC,
    SPEC_MARK,
    one_error_line,
    run_perf_test,
)

pytest_plugins = ["pytester"]


TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 3}  # fmt: skip


def _run(pytester: pytest.Pytester, markers: str = "", spec: str = SPEC,
         args: tuple[str, ...] = ()) -> pytest.RunResult:  # fmt: skip
    """The spec marker plus ``markers``."""
    return run_perf_test(pytester, SPEC_MARK + "\n" + markers, spec, args)


_one_line = one_error_line


# -- markers ----------------------------------------------------------------------------------
def test_unknown_marker_keyword(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=100, tpot_ms=5)")
    _one_line(result, "marker @pytest.mark.moeperf_slo on test_it.py:7 (test_it): keyword "
              "tpot_ms = 5: is not an argument of @pytest.mark.moeperf_slo",
              "Fix: use @pytest.mark.moeperf_slo(", "(did you mean 'tpot_p99_ms'?)")  # fmt: skip


def test_negative_slo_in_marker(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=-5, tpot_p99_ms=20)")
    _one_line(result, "marker @pytest.mark.moeperf_slo on test_it.py", "ttft_p99_ms = -5",
              "must be a finite number > 0")  # fmt: skip


def test_non_numeric_slo_in_marker(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=100, tpot_p99_ms='fast')")
    _one_line(result, "marker @pytest.mark.moeperf_slo", "tpot_p99_ms = 'fast'", "not a number")


# -- the spec file ----------------------------------------------------------------------------
def test_negative_slo_in_spec(pytester: pytest.Pytester) -> None:
    result = _run(pytester, spec=SPEC.replace("ttft_p99_ms: 2000", "ttft_p99_ms: -5"))
    _one_line(result, "spec.yaml:16: slo.ttft_p99_ms = -5", "must be > 0")


def test_non_numeric_slo_in_spec(pytester: pytest.Pytester) -> None:
    result = _run(pytester, spec=SPEC.replace("tpot_p99_ms: 200", "tpot_p99_ms: fast"))
    _one_line(result, "spec.yaml:17: slo.tpot_p99_ms = 'fast'", "must be a number")


def test_spec_missing_field(pytester: pytest.Pytester) -> None:
    result = _run(pytester, spec=SPEC.replace("  trace: fixed\n", ""))
    _one_line(result, "spec.yaml:6: workload.trace", "missing required field",
              "Fix: add `trace:` to workload")  # fmt: skip


def test_spec_misspelled_field(pytester: pytest.Pytester) -> None:
    result = _run(pytester, spec=SPEC.replace("num_requests:", "num_request:"))
    _one_line(result, "spec.yaml:8: workload.num_request", "unknown field",
              "did you mean `num_requests`")  # fmt: skip


def test_spec_mistyped_field(pytester: pytest.Pytester) -> None:
    result = _run(pytester, spec=SPEC.replace("num_requests: 16", "num_requests: sixteen"))
    _one_line(result, "spec.yaml:8: workload.num_requests = 'sixteen'", "must be an integer")


# -- MoE config files -------------------------------------------------------------------------
def test_moe_config_with_a_non_integer_key(pytester: pytest.Pytester) -> None:
    folder = pytester.path / "tuned"
    folder.mkdir()
    text = json.dumps({"1": TILE, "sixty-four": TILE}, indent=4) + "\n"
    (folder / CONFIG_NAME).write_text(text)
    line_no = text.splitlines().index('    "sixty-four": {') + 1
    result = _run(pytester, '@pytest.mark.moeperf_moe_config("tuned")')
    _one_line(result, "marker @pytest.mark.moeperf_moe_config on test_it.py",
              f"{CONFIG_NAME}:{line_no}: key 'sixty-four'", "not an integer batch size M",
              'Fix: use a positive integer string like "64"')  # fmt: skip


def test_moe_config_missing_a_block_size(pytester: pytest.Pytester) -> None:
    tile = {k: v for k, v in TILE.items() if k != "BLOCK_SIZE_K"}
    text = json.dumps({"1": TILE, "16": tile}, indent=4) + "\n"
    pytester.path.joinpath("mine.json").write_text(text)
    line_no = text.splitlines().index('    "16": {') + 1
    marker = (f'@pytest.mark.moeperf_moe_config(files={{"{CONFIG_NAME}": '
              'Path(__file__).parent / "mine.json"})')  # fmt: skip
    result = _run(pytester, marker)
    _one_line(result, "marker @pytest.mark.moeperf_moe_config", f"mine.json:{line_no}: key '16'",
              "missing required field 'BLOCK_SIZE_K'", "Fix: add 'BLOCK_SIZE_K'")  # fmt: skip


# -- baseline files ---------------------------------------------------------------------------
def _baseline_dir(pytester: pytest.Pytester) -> Path:
    test_id = "test_it.py::test_it"
    digest = hashlib.sha256(test_id.encode()).hexdigest()[:8]
    folder = pytester.path / "baselines" / f"test_it.py--test_it-{digest}"
    folder.mkdir(parents=True)
    return folder


def _baseline_text() -> str:
    """A complete, valid baseline file (so only the one planted fault is wrong)."""
    from pytest_moeperf.baseline import Baseline, BaselineKey, Provenance

    key = BaselineKey(backend="cpu", gpu_name="cpu", gpu_count=0, driver="none", cuda="none",
                      vllm_version="0.32.0", model="embedded", dtype="bfloat16", tp=1, dp=1,
                      spec_hash="0" * 16, moe_config_hash="in-tree")  # fmt: skip
    prov = Provenance("abc", "2026-01-01T00:00:00+00:00", "h", "pytest", "test", "0.1.0")
    base = Baseline("test_it.py::test_it", key, {"slo_goodput_tok_s": [1.0, 2.0]}, [{}], prov)
    return base.to_json()


def test_truncated_baseline(pytester: pytest.Pytester) -> None:
    text = _baseline_text()
    (_baseline_dir(pytester) / "cpu.json").write_text(text[: len(text) // 2])
    result = _run(pytester)
    _one_line(result, "cpu.json: JSON = 'line ", "the file is corrupt or truncated",
              "Fix: restore the file from git or re-record the baseline")  # fmt: skip


def test_baseline_from_a_newer_schema(pytester: pytest.Pytester) -> None:
    text = _baseline_text().replace('"schema_version": 1', '"schema_version": 7')
    line_no = text.splitlines().index('  "schema_version": 7,') + 1
    (_baseline_dir(pytester) / "cpu.json").write_text(text)
    result = _run(pytester)
    _one_line(result, f"cpu.json:{line_no}: schema_version = 7", "newer pytest-moeperf",
              "Fix: upgrade the plugin")  # fmt: skip


# -- options ----------------------------------------------------------------------------------
def test_bad_option_on_the_command_line(pytester: pytest.Pytester) -> None:
    result = _run(pytester, args=("--moeperf-runs", "zero"))
    _one_line(result, "command line --moeperf-runs: moeperf_runs = 'zero'",
              "Fix: set a valid value for --moeperf-runs")  # fmt: skip


def test_a_fraction_where_an_integer_belongs(pytester: pytest.Pytester) -> None:
    result = _run(pytester, args=("--moeperf-runs", "1.5"))
    _one_line(result, "command line --moeperf-runs: moeperf_runs = '1.5'",
              "must be an integer >= 1")  # fmt: skip


def test_records_folder_that_cannot_be_written(pytester: pytest.Pytester) -> None:
    """Found before the server starts, not when the first probe's records are due."""
    (pytester.path / "afile").write_text("")
    result = _run(pytester, args=("--moeperf-records", "afile/records"))
    _one_line(result, "command line --moeperf-records: moeperf_records = 'afile/records'",
              "cannot write per-request records in", "Not a directory")  # fmt: skip


def test_baseline_folder_that_is_a_file(pytester: pytest.Pytester) -> None:
    """Found before the server starts: a refresh so misdirected measured, then failed."""
    (pytester.path / "afile").write_text("")
    result = _run(pytester, args=("--moeperf-baseline-dir", "afile/baselines"))
    _one_line(result, "command line --moeperf-baseline-dir: moeperf_baseline_dir = "
              "'afile/baselines'", "afile is a file, so no folder can be made there",
              "Fix: point --moeperf-baseline-dir")  # fmt: skip


def test_bad_option_in_the_ini_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MOEPERF_STARTUP_TIMEOUT", raising=False)
    pytester.makeini("[pytest]\nmoeperf_startup_timeout = -1\n")
    result = _run(pytester)
    _one_line(result, "ini option moeperf_startup_timeout (", "tox.ini",
              "moeperf_startup_timeout = '-1'", "must be a finite number > 0")  # fmt: skip


def test_valid_inputs_reach_the_server_start(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, embedded_model: Path
) -> None:
    """The control: with nothing wrong, the run gets as far as the server command hook."""
    monkeypatch.setenv("MOEPERF_CACHE_DIR", str(embedded_model.parent.parent))  # pytester's HOME
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    assert "SERVER WOULD START" in result.stdout.str()


def test_a_marker_error_points_at_the_markers_own_line(pytester: pytest.Pytester) -> None:
    """Three decorators: the error names the line of the bad one (8), not the first (6)."""
    result = _run(pytester, "@pytest.mark.filterwarnings('ignore')\n"
                            "@pytest.mark.moeperf_slo(ttft_p99_ms=100, tpot_ms=5)")  # fmt: skip
    _one_line(result, "marker @pytest.mark.moeperf_slo on test_it.py:8 (test_it): keyword tpot_ms")


def test_a_class_level_marker_error_points_at_the_test(pytester: pytest.Pytester) -> None:
    """``pytestmark`` on a class has no decorator on the function: the test's own line."""
    pytester.makeconftest(GUARD)
    pytester.path.joinpath("spec.yaml").write_text(SPEC)
    pytester.makepyfile(test_it="""\
import pytest


@pytest.mark.moeperf_slo(ttft_p99_ms=100, tpot_ms=5)
class TestIt:
    @pytest.mark.moeperf_spec("spec.yaml")
    def test_it(self, moeperf):
        moeperf.run()
""")  # fmt: skip
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rN")
    _one_line(result, "marker @pytest.mark.moeperf_slo on test_it.py:6 (test_it): keyword tpot_ms")
