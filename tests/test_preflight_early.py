"""Inputs that used to be checked only after the measurement: now preflight stops them.

Each case once cost minutes (a whole measurement, or a vLLM start that exits after 32 s) before
it failed, or passed silently; now it is one line in test setup, before any server starts. The
guard conftest of ``preflight_helpers`` fails loudly if a server was about to start.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from preflight_helpers import CONFIG_NAME, SPEC, SPEC_MARK, one_error_line, run_perf_test

from pytest_moeperf.accuracy.gsm8k import load_split

pytest_plugins = ["pytester"]

TILE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 3}  # fmt: skip


def _run(pytester: pytest.Pytester, markers: str = "", spec: str = SPEC,
         args: tuple[str, ...] = ()) -> pytest.RunResult:  # fmt: skip
    return run_perf_test(pytester, SPEC_MARK + "\n" + markers, spec, args)


# -- the accuracy marker's limit ----------------------------------------------------------------
def test_accuracy_limit_above_the_test_split(pytester: pytest.Pytester) -> None:
    """limit=5000 of 1,319 questions: the marker's line, not run_gsm8k after the measurement."""
    n = len(load_split("test"))
    result = _run(pytester, "@pytest.mark.moeperf_accuracy('gsm8k', limit=5000)")
    line = one_error_line(
        result,
        "marker @pytest.mark.moeperf_accuracy on test_it.py:7 (test_it): limit = 5000: ",
        f"the gsm8k test split has only {n} questions",
        f"Fix: use limit <= {n}, or leave limit out to ask all {n}",
    )
    assert "run_gsm8k" not in line


def test_accuracy_limit_equal_to_the_test_split_is_fine(pytester: pytest.Pytester) -> None:
    from pytest_moeperf import markers

    n = len(load_split("test"))
    item = pytester.getitem(f"import pytest\n\n@pytest.mark.moeperf_accuracy(limit={n})\n"
                            "def test_func(moeperf):\n    pass\n")  # fmt: skip
    gate = markers.accuracy_gate(item)
    assert gate is not None and gate.limit == n


# -- baselines ------------------------------------------------------------------------------------
def _baseline_text(test_id: str) -> str:
    from pytest_moeperf.baseline import Baseline, BaselineKey, Provenance

    key = BaselineKey(backend="cpu", gpu_name="cpu", gpu_count=0, driver="none", cuda="none",
                      vllm_version="0.32.0", model="embedded", dtype="bfloat16", tp=1, dp=1,
                      spec_hash="0" * 16, moe_config_hash="in-tree")  # fmt: skip
    prov = Provenance("abc", "2026-01-01T00:00:00+00:00", "h", "pytest", "test", "0.1.0")
    return Baseline(test_id, key, {"slo_goodput_tok_s": [1.0, 2.0]}, [{}], prov).to_json()


def test_baseline_whose_test_id_does_not_match_its_folder(pytester: pytest.Pytester) -> None:
    """A file copied from another test's folder: the store would refuse it after measuring."""
    test_id = "test_it.py::test_it"
    digest = hashlib.sha256(test_id.encode()).hexdigest()[:8]
    folder = pytester.path / "baselines" / f"test_it.py--test_it-{digest}"
    folder.mkdir(parents=True)
    text = _baseline_text("test_other.py::test_other")
    line_no = text.splitlines().index('  "test_id": "test_other.py::test_other"') + 1
    (folder / "cpu.json").write_text(text)
    result = _run(pytester)
    one_error_line(
        result,
        f"{folder / 'cpu.json'}:{line_no}: test_id = 'test_other.py::test_other': ",
        "this folder holds the baselines of 'test_it.py::test_it'",
        "Fix: move the file to the folder of 'test_other.py::test_other'",
    )


@pytest.mark.parametrize(
    ("metrics", "problem"),
    [
        ({}, "metrics = []: holds no gated metric"),
        ({"slo_goodput_tok_s": []}, "metrics.slo_goodput_tok_s = []: has no runs"),
        ({"power_w": [500.0, 501.0]}, "metrics = ['power_w']: holds no gated metric"),
    ],
)
def test_hollow_baseline_fails_preflight(pytester: pytest.Pytester, metrics: dict[str, list[float]],
                                         problem: str) -> None:  # fmt: skip
    """Was: preflight and the test passed, gates.py skipped the empty metric: the gate was off."""
    test_id = "test_it.py::test_it"
    digest = hashlib.sha256(test_id.encode()).hexdigest()[:8]
    folder = pytester.path / "baselines" / f"test_it.py--test_it-{digest}"
    folder.mkdir(parents=True)
    data = json.loads(_baseline_text(test_id))
    data["metrics"] = metrics
    (folder / "cpu.json").write_text(json.dumps(data, indent=2))
    result = _run(pytester)
    one_error_line(result, str(folder / "cpu.json"), problem,
                   "restore the file from git or re-record the baseline")  # fmt: skip


# -- MoE config folders and files -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("E=16,N=128,device_name=NVIDIA H200.json", "vLLM spells this device_name"),
        ("e=16,n=128,device_name=NVIDIA_H200.json", "not a vLLM fused-MoE config name"),
        ("tuned-h200.json", "not a vLLM fused-MoE config name"),
        ("E=016,N=128,device_name=NVIDIA_H200.json", "vLLM would spell this config"),
    ],
)  # fmt: skip
def test_misnamed_config_file_in_the_folder(
    pytester: pytest.Pytester, name: str, problem: str
) -> None:
    """vLLM finds a config only by its exact name: on a GPU this file would be ignored."""
    folder = pytester.path / "tuned"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps({"1": TILE}))
    (folder / name).write_text(json.dumps({"1": TILE}))
    result = _run(pytester, '@pytest.mark.moeperf_moe_config("tuned")')
    one_error_line(
        result,
        "marker @pytest.mark.moeperf_moe_config on test_it.py:7 (test_it), "
        f"file {folder / name}: file name = {name!r}: {problem}",
        "Fix: rename it",
    )


def test_backend_config_file_in_the_folder(pytester: pytest.Pytester) -> None:
    """',backend=' files are read only from vLLM's own configs/, never from the tuned folder."""
    folder = pytester.path / "tuned"
    folder.mkdir()
    name = "E=16,N=128,device_name=NVIDIA_H200,backend=flydsl.json"
    (folder / name).write_text(json.dumps({"1": TILE}))
    result = _run(pytester, '@pytest.mark.moeperf_moe_config("tuned")')
    one_error_line(result, f"file {folder / name}: backend = 'flydsl'", "never from")


def test_files_entry_given_as_a_string_names_the_path(pytester: pytest.Pytester) -> None:
    marker = f'@pytest.mark.moeperf_moe_config(files={{"{CONFIG_NAME}": "nope.json"}})'
    result = _run(pytester, marker)
    line = one_error_line(
        result,
        f"marker @pytest.mark.moeperf_moe_config on test_it.py:7 (test_it), config variant file "
        f"{CONFIG_NAME!r}: source = 'nope.json': is a str",
        "Fix: pass Path(__file__).parent / 'nope.json'",
    )
    assert "'str'" not in line


# -- numbers PyYAML 1.1 reads as strings ----------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("rate: 2.0", "rate: 1e3", "spec.yaml:14: arrival.rate = '1e3': "),
        ("rate: 2.0", "rate: 1.0e3", "spec.yaml:14: arrival.rate = '1.0e3': "),
        ("rate: 2.0", "rate: 25E-2", "spec.yaml:14: arrival.rate = '25E-2': "),
        ("num_requests: 16", "num_requests: 1e3", "spec.yaml:8: workload.num_requests = '1e3': "),
    ],
)  # fmt: skip
def test_exponent_without_dot_and_sign_is_a_string_to_pyyaml(
    pytester: pytest.Pytester, old: str, new: str, needle: str
) -> None:
    result = _run(pytester, spec=SPEC.replace(old, new))
    one_error_line(result, needle, "PyYAML (YAML 1.1) reads", "as a string, not a number")


def test_yaml_number_hint_gives_a_spelling_pyyaml_reads() -> None:
    """The suggested spellings really are numbers to PyYAML (``1.0e3`` is not: no sign)."""
    import yaml

    from pytest_moeperf.errors import UsageError
    from pytest_moeperf.spec.loader import load_spec_text

    for text, want in (("1e3", 1000.0), ("25E-2", 0.25), ("1e-7", 1e-7), ("1.5e20", 1.5e20)):
        with pytest.raises(UsageError) as exc:
            load_spec_text(SPEC.replace("rate: 2.0", f"rate: {text}"), "spec.yaml")
        fix = exc.value.fix
        spellings = re.findall(r"`([^`]+)`", fix)
        assert spellings, fix
        if text == "1e3":
            assert spellings == ["1000", "1.0e+3"]
        for s in spellings:
            assert yaml.safe_load(f"a: {s}")["a"] == pytest.approx(want), (s, fix)


def test_underscored_numbers_are_numbers_to_pyyaml(pytester: pytest.Pytester) -> None:
    """``1_000`` is an int in YAML 1.1: no message, the spec loads."""
    from pytest_moeperf.spec.loader import load_spec_text

    spec = load_spec_text(SPEC.replace("num_requests: 16", "num_requests: 1_000"), "spec.yaml")
    assert spec.workload.num_requests == 1000


def test_yaml_hint_leaves_real_words_alone() -> None:
    from pytest_moeperf.errors import UsageError
    from pytest_moeperf.spec.loader import load_spec_text

    with pytest.raises(UsageError) as exc:
        load_spec_text(SPEC.replace("rate: 2.0", "rate: fast"), "spec.yaml")
    assert "PyYAML" not in str(exc.value)
    assert str(exc.value).startswith("spec.yaml:14: arrival.rate = 'fast': must be a number")


def test_files_with_a_path_object_still_pass(tmp_path: Path) -> None:
    from pytest_moeperf.moeconfig.folder import check_variant_files

    (tmp_path / "mine.json").write_text(json.dumps({"1": TILE}))
    check_variant_files({CONFIG_NAME: tmp_path / "mine.json"})
