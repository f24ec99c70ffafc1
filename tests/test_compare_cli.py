"""``moeperf compare``: exit codes 0 / 1 / 2, the table, the notes and every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.baseline import Baseline, BaselineKey, Provenance
from pytest_moeperf.compare_cli import main

BASE = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
SAME = [1002.0, 998.0, 1007.0, 993.0, 1001.0]
DROP = [950.0, 960.0, 940.0, 955.0, 945.0]
TTFT = [120.0, 121.0, 119.0, 120.5, 119.5]
POWER = [300.0, 301.0, 299.0, 300.5, 299.5]


def key(**over: Any) -> BaselineKey:
    d: dict[str, Any] = {
        "backend": "cpu",
        "gpu_name": "Xeon",
        "gpu_count": 1,
        "driver": "",
        "cuda": "",
        "vllm_version": "0.32.0",
        "model": "tiny-moe",
        "dtype": "bfloat16",
        "tp": 1,
        "dp": 1,
        "spec_hash": "s1",
        "moe_config_hash": "m1",
    }
    d.update(over)
    return BaselineKey(**d)


def write(
    path: Path,
    metrics: dict[str, list[float]],
    k: BaselineKey | None = None,
    test_id: str = "t::a",
    runs: list[dict[str, Any]] | None = None,
) -> str:
    prov = Provenance("c0ffee", "2026-05-01T00:00:00+00:00", "h", "pytest", "test", "0.1.0")
    b = Baseline(test_id=test_id, key=k or key(), metrics=metrics, runs=runs or [],
                 provenance=prov)  # fmt: skip
    path.write_text(b.to_json())
    return str(path)


@pytest.fixture
def a(tmp_path: Path) -> str:
    return write(
        tmp_path / "a.json", {"slo_goodput_tok_s": BASE, "ttft_p99_ms": TTFT, "power_w": POWER}
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_unchanged_exits_0_and_prints_the_table(
    a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = write(
        tmp_path / "b.json", {"slo_goodput_tok_s": SAME, "ttft_p99_ms": TTFT, "power_w": POWER}
    )
    code, out, err = run(capsys, a, b)
    assert code == 0, out + err
    assert err == ""
    assert f"moeperf compare: {a} (baseline) vs {b} (candidate)" in out
    for m in ("slo_goodput_tok_s", "ttft_p99_ms", "power_w"):
        assert m in out
    assert "✗" not in out


def test_regression_exits_1(a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = write(
        tmp_path / "b.json", {"slo_goodput_tok_s": DROP, "ttft_p99_ms": TTFT, "power_w": POWER}
    )
    code, out, _ = run(capsys, a, b)
    assert code == 1
    assert "✗ regressed" in out
    assert "✗ slo_goodput_tok_s: -5.00 % (worse)" in out


def test_improvement_exits_0(a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, write(tmp_path / "b.json", {"slo_goodput_tok_s": DROP}), a)
    assert code == 0
    assert "▲ improved" in out


def test_informational_regression_does_not_fail(
    a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hot = [p * 1.2 for p in POWER]
    b = write(tmp_path / "b.json", {"slo_goodput_tok_s": SAME, "power_w": hot})
    code, out, _ = run(capsys, a, b)
    assert code == 0
    assert "✗ regressed (info)" in out


def test_metric_option_restricts_the_table(
    a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = write(tmp_path / "b.json", {"slo_goodput_tok_s": DROP, "ttft_p99_ms": TTFT})
    code, out, _ = run(capsys, a, b, "--metric", "ttft_p99_ms")
    assert code == 0
    assert "ttft_p99_ms" in out and "slo_goodput_tok_s" not in out
    code, out, _ = run(capsys, a, b, "--metric", "ttft_p99_ms", "--metric", "slo_goodput_tok_s")
    assert code == 1
    assert out.index("ttft_p99_ms") < out.index("slo_goodput_tok_s")


def test_unknown_metric_exits_2_with_a_suggestion(
    a: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, a, a, "--metric", "goodput_tok_s")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("moeperf compare: error: --metric: metric = 'goodput_tok_s'")
    assert "did you mean 'slo_goodput_tok_s'" in err


def test_metric_missing_from_one_file_exits_2(
    a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = write(tmp_path / "b.json", {"slo_goodput_tok_s": SAME})
    code, _, err = run(capsys, a, b, "--metric", "ttft_p99_ms")
    assert code == 2
    assert "not recorded on the candidate side" in err


def test_no_common_metric_exits_2(
    a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = write(tmp_path / "b.json", {"mbu": [0.5, 0.51, 0.49]})
    code, _, err = run(capsys, a, b)
    assert code == 2
    assert "share no known metric" in err


def test_missing_file_exits_2(a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, a, str(tmp_path / "nope.json"))
    assert code == 2
    assert "nope.json" in err and "does not exist" in err
    assert err.count("\n") == 1


def test_corrupt_file_exits_2(a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1,')
    code, _, err = run(capsys, str(bad), a)
    assert code == 2
    assert "bad.json" in err and "line 1 column" in err


def test_newer_schema_exits_2(a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = json.loads(Path(a).read_text())
    d["schema_version"] = 99
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(d))
    code, _, err = run(capsys, a, str(newer))
    assert code == 2
    assert "upgrade the plugin" in err


def test_other_hardware_is_refused_unless_allowed(
    a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = write(tmp_path / "b.json", {"slo_goodput_tok_s": DROP}, key(gpu_name="EPYC", gpu_count=2))
    code, out, err = run(capsys, a, b)
    assert code == 2
    assert out == ""
    assert "other hardware" in err and "gpu_name 'Xeon' vs 'EPYC'" in err
    assert "--allow-other-hardware" in err
    code, out, err = run(capsys, a, b, "--allow-other-hardware")
    assert code == 1
    assert out.startswith("warning: different hardware (hardware: gpu_name 'Xeon' vs 'EPYC'")


def test_software_differences_are_noted_not_refused(
    a: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = write(
        tmp_path / "b.json",
        {"slo_goodput_tok_s": SAME},
        key(moe_config_hash="m2", vllm_version="0.33.0"),
        test_id="t::b",
    )
    code, out, _ = run(capsys, a, b)
    assert code == 0
    assert (
        "note: software differs: vllm_version '0.32.0' -> '0.33.0', moe_config_hash 'm1' -> 'm2'"
        in out
    )
    assert "note: different tests: 't::a' vs 't::b'" in out


def test_unknown_and_accuracy_metrics_are_skipped_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = {"slo_goodput_tok_s": BASE, "accuracy": [0.8, 0.81, 0.79], "my_metric": BASE}
    a = write(tmp_path / "a.json", metrics)
    code, out, _ = run(capsys, a, a)
    assert code == 0
    assert "note: skipped unknown metrics: my_metric" in out
    assert "note: accuracy is judged by the accuracy gate" in out
    assert "\nmy_metric" not in out


def test_bad_option_exits_2(a: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, a, a, "--bogus")
    assert code == 2
    assert "unrecognized arguments: --bogus" in err


def test_missing_argument_exits_2(a: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, a)
    assert code == 2


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "--allow-other-hardware" in out and "--metric" in out


def test_runs_as_a_module(a: str, tmp_path: Path) -> None:
    b = write(tmp_path / "b.json", {"slo_goodput_tok_s": DROP})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_moeperf.compare_cli", a, b],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "✗ regressed" in proc.stdout


def test_a_candidate_measured_on_a_busier_machine_is_noted_and_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same -5 % drop, but other processes took 40 % of the CPUs over the candidate's runs:
    the CLI judges as the gate does (inconclusive, exit 0) and prints the note with both sides."""
    quiet = [{"machine": {"steal": 0.0, "others": 0.0, "seconds": 30.0}}] * 5
    busy = [{"machine": {"steal": 0.0, "others": 0.4, "seconds": 30.0}}] * 5
    a = write(tmp_path / "a.json", {"slo_goodput_tok_s": BASE}, runs=quiet)
    b = write(tmp_path / "b.json", {"slo_goodput_tok_s": DROP}, runs=busy)
    code, out, _ = run(capsys, a, b)
    assert code == 0, out
    assert "note: the machine left this run 40 % less of its CPUs" in out
    assert "inconclusive" in out
    b_quiet = write(tmp_path / "c.json", {"slo_goodput_tok_s": DROP}, runs=quiet)
    assert run(capsys, a, b_quiet)[0] == 1  # the same drop on an equally quiet machine
