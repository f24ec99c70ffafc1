"""Preflight (test setup): inputs the existing fault tests leave out, and what preflight scopes.

tests/test_markers.py and tests/test_faults_input.py cover marker values, bad spec fields,
bad MoE config contents, options and a truncated or too new baseline. Here: where a spec is
looked up and its YAML, config folders and files that are missing or truncated, other ways a
baseline file is bad (empty, a mistyped key, a --moeperf-baseline-dir elsewhere), and which
checks apply to which tests. Every pytester run has a conftest that fails loudly if a server
was about to start, so each case must stop in preflight, in seconds, with one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from preflight_helpers import (
    CONFIG_NAME,
    GUARD,
    SPEC,
    SPEC_MARK,
    TEST,
    one_error_line,
    run_perf_test,
)

from pytest_moeperf import preflight
from pytest_moeperf.errors import UsageError

pytest_plugins = ["pytester"]


def _run(pytester: pytest.Pytester, markers: str = SPEC_MARK, spec: str = SPEC,
         args: tuple[str, ...] = ()) -> pytest.RunResult:  # fmt: skip
    return run_perf_test(pytester, markers, spec, args)


_one_line = one_error_line


def _baseline_dir(root: Path, test_id: str = "test_it.py::test_it") -> Path:
    """The store's folder for ``test_id`` (BaselineStore.dir_for, spelt out)."""
    digest = hashlib.sha256(test_id.encode()).hexdigest()[:8]
    folder = root / f"{test_id.replace('::', '--')}-{digest}"
    folder.mkdir(parents=True)
    return folder


def _baseline_text(test_id: str = "test_it.py::test_it") -> str:
    """A complete, valid baseline file (so only the one planted fault is wrong)."""
    from pytest_moeperf.baseline import Baseline, BaselineKey, Provenance

    key = BaselineKey(backend="cpu", gpu_name="cpu", gpu_count=2, driver="", cuda="",
                      vllm_version="0.32.0", model="embedded", dtype="bfloat16", tp=1, dp=1,
                      spec_hash="0" * 16, moe_config_hash="in-tree")  # fmt: skip
    prov = Provenance("abc", "2026-01-01T00:00:00+00:00", "h", "pytest", "test", "0.1.0")
    base = Baseline(test_id, key, {"slo_goodput_tok_s": [1.0, 2.0, 3.0]}, [{}], prov)
    return base.to_json()


# -- the spec: where it is looked up, and its YAML ---------------------------------------------
def test_spec_is_found_in_perf_tests_specs_and_checked(pytester: pytest.Pytester) -> None:
    """A bare spec name falls back to <rootdir>/perf_tests/specs/; that file is the one read."""
    specs = pytester.path / "perf_tests" / "specs"
    specs.mkdir(parents=True)
    (specs / "shared.yaml").write_text(SPEC.replace("num_requests:", "num_request:"))
    result = _run(pytester, '@pytest.mark.moeperf_spec("shared.yaml")')
    _one_line(result, f"{specs / 'shared.yaml'}:8: workload.num_request", "unknown field")


def test_spec_path_that_does_not_exist_lists_where_it_looked(pytester: pytest.Pytester) -> None:
    result = _run(pytester, '@pytest.mark.moeperf_spec("nope.yaml")')
    specs = pytester.path / "perf_tests" / "specs"
    _one_line(result, "marker @pytest.mark.moeperf_spec on test_it.py:6 (test_it): path = "
              "'nope.yaml': spec file not found (tried ", str(specs / "nope.yaml"),
              f"Fix: put the spec in {specs} or give a path relative to the test file")  # fmt: skip


def test_spec_that_is_not_valid_yaml(pytester: pytest.Pytester) -> None:
    result = _run(pytester, spec=SPEC.replace("  seed: 0", "  seed: [0"))
    _one_line(result, "spec.yaml:", "is not valid YAML", "Fix: fix the YAML syntax on that line")


def test_spec_is_checked_for_a_test_that_starts_no_server(pytester: pytest.Pytester) -> None:
    """The spec marker alone is enough: a helper test reading the spec gets the same check."""
    pytester.path.joinpath("spec.yaml").write_text(SPEC.replace("rate: 2.0", "rate: fast"))
    pytester.makepyfile(test_plain=f"import pytest\n\n{SPEC_MARK}\ndef test_it():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*spec.yaml:14: arrival.rate = 'fast': must be a number. Fix:*"])


def test_options_are_checked_only_for_tests_that_start_servers(
    pytester: pytest.Pytester,
) -> None:
    """A bad --moeperf-runs errors the perf test, not an ordinary test in the same session."""
    pytester.makeconftest(GUARD)
    pytester.path.joinpath("spec.yaml").write_text(SPEC)
    pytester.makepyfile(test_mixed=TEST.format(markers=SPEC_MARK)
                        + "\n\ndef test_plain():\n    pass\n")  # fmt: skip
    result = pytester.runpytest("-p", "no:cacheprovider", "--moeperf-runs", "zero")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at setup of test_it*", "command line --moeperf-runs: moeperf_runs = 'zero'*Fix:*"]
    )
    assert "SERVER WOULD START" not in result.stdout.str()


# -- MoE config folders and files --------------------------------------------------------------
def test_moe_config_folder_that_does_not_exist(pytester: pytest.Pytester) -> None:
    result = _run(pytester, SPEC_MARK + '\n@pytest.mark.moeperf_moe_config("configs/gone")')
    _one_line(result, "marker @pytest.mark.moeperf_moe_config on test_it.py:7 (test_it): folder "
              f"= 'configs/gone': no such directory ({pytester.path / 'configs' / 'gone'})",
              "Fix: point folder at a directory")  # fmt: skip


def test_moe_config_file_in_the_folder_is_truncated(pytester: pytest.Pytester) -> None:
    """A half-written tuning file is caught before vLLM would read (or ignore) it."""
    folder = pytester.path / "tuned"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text('{"1": {"BLOCK_SIZE_M": 16, "BLOCK_')
    result = _run(pytester, SPEC_MARK + '\n@pytest.mark.moeperf_moe_config("tuned")')
    _one_line(result, "marker @pytest.mark.moeperf_moe_config on test_it.py:7 (test_it), file "
              f"{folder / CONFIG_NAME}: JSON = 'line 1 column 28'", "invalid JSON")  # fmt: skip


def test_moe_config_files_entry_that_does_not_exist(pytester: pytest.Pytester) -> None:
    marker = (f'@pytest.mark.moeperf_moe_config(files={{"{CONFIG_NAME}": '
              'Path(__file__).parent / "missing.json"})')  # fmt: skip
    result = _run(pytester, SPEC_MARK + "\n" + marker)
    _one_line(result, "marker @pytest.mark.moeperf_moe_config", "missing.json",
              "file does not exist", "Fix: check the path")  # fmt: skip


# -- the test's baseline files -----------------------------------------------------------------
def test_empty_baseline_file(pytester: pytest.Pytester) -> None:
    (_baseline_dir(pytester.path / "baselines") / "cpu.json").write_text("")
    result = _run(pytester)
    _one_line(result, "cpu.json: JSON = 'line 1 column 1': is empty: the file was truncated",
              "Fix: restore the file from git or re-record the baseline")  # fmt: skip


def test_baseline_with_a_mistyped_key_field_names_its_line(pytester: pytest.Pytester) -> None:
    text = _baseline_text().replace('"gpu_count": 2', '"gpu_count": "two"')
    line_no = text.splitlines().index('    "gpu_count": "two",') + 1
    (_baseline_dir(pytester.path / "baselines") / "cpu.json").write_text(text)
    result = _run(pytester)
    _one_line(result, f"cpu.json:{line_no}: key.gpu_count = 'two': must be an integer")


def test_truncated_baseline_in_the_configured_baseline_dir(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """--moeperf-baseline-dir elsewhere: that folder is the one read, and named in the error."""
    root = tmp_path / "elsewhere"
    text = _baseline_text()
    path = _baseline_dir(root) / "cpu.json"
    path.write_text(text[: len(text) // 3])
    result = _run(pytester, args=(f"--moeperf-baseline-dir={root}",))
    _one_line(result, f"{path}: JSON = 'line ", "the file is corrupt or truncated")


# -- scope of the checks, on collected items ---------------------------------------------------
ITEMS = """\
import pytest

@pytest.mark.moeperf_spec("spec.yaml")
def test_perf(moeperf):
    pass

@pytest.mark.moeperf_spec("spec.yaml")
def test_factory(moeperf_server_factory):
    pass
"""


def _items(pytester: pytest.Pytester) -> dict[str, pytest.Item]:
    pytester.path.joinpath("spec.yaml").write_text(SPEC)
    return {item.name: item for item in pytester.getitems(ITEMS)}


def test_good_inputs_pass_preflight(pytester: pytest.Pytester) -> None:
    """The control for the items below: with nothing wrong, check_item returns quietly."""
    items = _items(pytester)
    for item in items.values():
        preflight.check_item(item)


def test_only_this_tests_baselines_are_read(pytester: pytest.Pytester) -> None:
    """A truncated baseline of another test is that test's problem; this one's stops it."""
    items = _items(pytester)
    root = pytester.path / "baselines"
    nodeid = items["test_perf"].nodeid
    (_baseline_dir(root, nodeid + "_other") / "cpu.json").write_text("{")
    preflight.check_item(items["test_perf"])
    (_baseline_dir(root, nodeid) / "cpu.json").write_text("{")
    with pytest.raises(UsageError, match="corrupt or truncated") as exc:
        preflight.check_item(items["test_perf"])
    assert exc.value.source == str(root / f"{nodeid.replace('::', '--')}-"
                                   f"{hashlib.sha256(nodeid.encode()).hexdigest()[:8]}"
                                   / "cpu.json")  # fmt: skip


def test_server_factory_tests_do_not_read_baselines(pytester: pytest.Pytester) -> None:
    """moeperf_server_factory compares with no baseline, so a bad file must not stop it."""
    items = _items(pytester)
    (_baseline_dir(pytester.path / "baselines", items["test_factory"].nodeid)
     / "cpu.json").write_text("{")  # fmt: skip
    preflight.check_item(items["test_factory"])


def test_the_first_problem_is_reported_markers_before_the_spec(pytester: pytest.Pytester) -> None:
    """A bad marker and a missing spec: the marker's error, so fixes come in source order."""
    item = pytester.getitem(
        "import pytest\n\n"
        "@pytest.mark.moeperf_spec('nope.yaml')\n"
        "@pytest.mark.moeperf_slo(ttft_p99_ms=0, tpot_p99_ms=20)\n"
        "def test_func(moeperf):\n    pass\n"
    )
    with pytest.raises(UsageError) as exc:
        preflight.check_item(item)
    assert (exc.value.what, exc.value.value) == ("ttft_p99_ms", 0)
    assert "moeperf_slo" in exc.value.source
