"""One pytester test per marker misuse: each gives one line naming the value, source and fix."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def _run_marked(pytester: pytest.Pytester, decorator: str) -> pytest.RunResult:
    pytester.makepyfile("import pytest\n\n" + decorator + "\ndef test_it():\n    pass\n")
    return pytester.runpytest("-p", "no:cacheprovider")


def _assert_one_error(result: pytest.RunResult, *needles: str) -> None:
    result.assert_outcomes(errors=1)
    text = result.stdout.str()
    for needle in needles:
        assert needle in text, f"{needle!r} not in output:\n{text}"


def test_markers_are_listed_with_signatures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    out = result.stdout.str()
    for line in (
        "@pytest.mark.moeperf_slo(ttft_p99_ms: float, tpot_p99_ms: float, *, e2el_p99_ms: float",
        "@pytest.mark.moeperf_accuracy(task: str = 'gsm8k', shots: int = 5, max_drop: float",
        "@pytest.mark.moeperf_moe_config(folder",
        "@pytest.mark.moeperf_spec(path",
        "@pytest.mark.moeperf_gpu",
    ):
        assert line in out


def test_slo_unknown_keyword(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=100, tpot_ms=5)")
    _assert_one_error(result, "moeperf_slo", "tpot_ms", "test_slo_unknown_keyword.py:3",
                      "Fix: use @pytest.mark.moeperf_slo(ttft_p99_ms")  # fmt: skip


def test_slo_missing_tpot(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=100)")
    _assert_one_error(result, "missing a required argument: 'tpot_p99_ms'")


def test_slo_negative_value(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=-5, tpot_p99_ms=20)")
    _assert_one_error(result, "ttft_p99_ms = -5", "must be a finite number > 0")


def test_slo_non_numeric_value(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms='2s', tpot_p99_ms=20)")
    _assert_one_error(result, "ttft_p99_ms = '2s'", "not a number")


def test_slo_nan_value(pytester: pytest.Pytester) -> None:
    result = _run_marked(
        pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=float('nan'), tpot_p99_ms=20)"
    )
    _assert_one_error(result, "ttft_p99_ms = nan")


def test_slo_bad_e2el(pytester: pytest.Pytester) -> None:
    result = _run_marked(
        pytester, "@pytest.mark.moeperf_slo(ttft_p99_ms=1, tpot_p99_ms=2, e2el_p99_ms=0)"
    )
    _assert_one_error(result, "e2el_p99_ms = 0")


def test_accuracy_unknown_task(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_accuracy(task='mmlu')")
    _assert_one_error(result, "task = 'mmlu'", "use task='gsm8k'")


def test_accuracy_negative_max_drop(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_accuracy(max_drop=-1)")
    _assert_one_error(result, "max_drop = -1")


def test_accuracy_bad_shots(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_accuracy(shots=2.5)")
    _assert_one_error(result, "shots = 2.5")


def test_accuracy_bad_limit(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_accuracy(limit=0)")
    _assert_one_error(result, "limit = 0")


def test_accuracy_unknown_keyword(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_accuracy(max_dorp=1)")
    _assert_one_error(result, "keyword max_dorp = 1: is not an argument of "
                      "@pytest.mark.moeperf_accuracy", "(did you mean 'max_drop'?)")  # fmt: skip


def test_moe_config_missing_folder(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_moe_config('no/such/dir')")
    _assert_one_error(result, "folder = 'no/such/dir'", "no such directory")


def test_moe_config_folder_and_files(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_moe_config('x', files={'a.json': {}})")
    _assert_one_error(result, "give one, not both")


def test_moe_config_empty_files(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_moe_config(files={})")
    _assert_one_error(result, "files = {}", "non-empty mapping")


def test_spec_missing_file(pytester: pytest.Pytester) -> None:
    result = _run_marked(pytester, "@pytest.mark.moeperf_spec('nope.yaml')")
    _assert_one_error(result, "path = 'nope.yaml'", "spec file not found")


def test_spec_bad_runs(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", spec="name: x\n")
    result = _run_marked(pytester, "@pytest.mark.moeperf_spec('spec.yaml', runs=0)")
    _assert_one_error(result, "runs = 0", "integer >= 1")


def test_valid_markers_do_not_error(pytester: pytest.Pytester) -> None:
    pytester.mkdir("cfg")
    result = _run_marked(
        pytester,
        "@pytest.mark.moeperf_slo(ttft_p99_ms=100, tpot_p99_ms=20, e2el_p99_ms=5000)\n"
        "@pytest.mark.moeperf_accuracy('gsm8k', 5, 1.0, limit=10)\n"
        "@pytest.mark.moeperf_moe_config('cfg', name='tuned')",
    )
    result.assert_outcomes(passed=1)
