"""The machine calibration in the baseline key (issue 17): same names, another machine.

On a fresh 2-core VM ``make perf`` said ``slo_goodput_tok_s regressed vs baseline: -75.46 %``
against a baseline from a VM with the same CPU model name and core count, 3-5x faster. The
figures below are recorded ones: ``FAST`` is what the shared 2-core CI VM measured (best-of, 1
thread, benchmarks/calibration_spread.py), ``SAME_SLOW_SESSION`` its slowest unsaturated session
of twelve, ``SLOW`` a VM 3.5x slower, as in the issue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from baseline_helpers import PROV, make_key

from pytest_moeperf import gates
from pytest_moeperf.baseline import Baseline, BaselineKey, BaselineStore, Calibration
from pytest_moeperf.baseline import calibration as cal
from pytest_moeperf.errors import UsageError

TEST_ID = "perf_tests/test_embedded.py::test_embedded_slo_goodput"
TARGET = "perf_tests/test_embedded.py"
NOISE = [1.0, 1.004, 0.997, 1.002, 0.999, 1.001, 0.998, 1.003, 0.996, 1.0]
FAST = Calibration({"gemm_gflops": 86.3, "copy_gb_s": 17.7}, threads=1)
SAME_SLOW_SESSION = Calibration({"gemm_gflops": 65.8, "copy_gb_s": 16.6}, threads=1)
SLOW = Calibration({"gemm_gflops": 24.6, "copy_gb_s": 5.1}, threads=1)
H200 = {"memory_total_bytes": 150754820096, "power_limit_w": 700.0, "sm_clock_max_mhz": 1980,
        "mem_clock_max_mhz": 3201, "ecc": True}  # fmt: skip  # read on the lent H200
COMMITTED = Path(__file__).resolve().parent.parent / "baselines"


def cpu_key(calibration: Calibration | None) -> BaselineKey:
    return make_key(backend="cpu", gpu_name="AMD EPYC", gpu_count=2, driver="none", cuda="none",
                    calibration=calibration)  # fmt: skip


def goodput(center: float) -> dict[str, list[float]]:
    return {"slo_goodput_tok_s": [center * n for n in NOISE]}


def compare(tmp_path: Path, recorded: Calibration | None, here: Calibration | None,
            candidate: float, **kw: Any) -> gates.BaselineOutcome:  # fmt: skip
    store = BaselineStore(tmp_path / "baselines")
    store.write(Baseline(TEST_ID, cpu_key(recorded), goodput(1000.0), [], PROV), complete=True)
    opts: dict[str, Any] = {"allow_other_hardware": False, "ci_mode": False, **kw}
    return gates.compare(store, TEST_ID, cpu_key(here), goodput(candidate), target=TARGET, **opts)


# ---- the comparison of two calibrations


def test_same_machine_within_tolerance_is_no_difference() -> None:
    assert cal.differences(SAME_SLOW_SESSION, FAST) == []
    assert cal.differences(FAST, SAME_SLOW_SESSION) == []


def test_a_3_5x_slower_machine_names_both_figures() -> None:
    assert cal.differences(SLOW, FAST) == [
        "GEMM 24.6 vs 86.3 GFLOP/s (-71 %)",
        "copy 5.1 vs 17.7 GB/s (-71 %)",
    ]


def test_gpu_identity_power_limit_and_ecc_enter_the_comparison() -> None:
    here = Calibration(FAST.figures, 1, ({**H200, "power_limit_w": 500.0, "ecc": False},))
    there = Calibration(FAST.figures, 1, (H200,))
    assert cal.differences(here, there) == [
        "gpu0 power_limit_w 500.0 vs 700.0",
        "gpu0 ecc False vs True",
    ]
    near = Calibration(FAST.figures, 1, ({**H200, "power_limit_w": 700.4},))
    assert cal.differences(near, there) == []


def test_an_unknown_field_is_not_a_difference() -> None:
    here = Calibration({"gemm_gflops": 86.0}, 1, ({**H200, "ecc": None},))
    assert cal.differences(here, Calibration(FAST.figures, 1, (H200,))) == []


def test_another_method_or_thread_count_is_a_difference() -> None:
    assert cal.differences(Calibration(FAST.figures, 1, version=2), FAST) == [
        "calibration method v2 vs v1"
    ]
    assert cal.differences(Calibration(FAST.figures, 3), FAST) == ["threads 3 vs 1"]


# ---- the gate


def test_another_machine_is_one_line_naming_both_figures_never_regressed(tmp_path: Path) -> None:
    out = compare(tmp_path, FAST, SLOW, candidate=245.4)  # -75.46 %, as in the issue
    assert out.status == "other-setup" and out.verdicts == [] and out.failures == []
    (line,) = out.warnings
    assert "\n" not in line
    assert line.startswith(f"no baseline for {TEST_ID} on this machine: ")
    assert "(calibration GEMM 24.6 vs 86.3 GFLOP/s (-71 %); copy 5.1 vs 17.7 GB/s (-71 %), " \
           "here vs baseline; tolerance x2); not compared." in line  # fmt: skip
    assert "--moeperf-refresh-baselines" in line and "regressed" not in line


def test_another_machine_fails_in_ci_mode_like_another_gpu(tmp_path: Path) -> None:
    out = compare(tmp_path, FAST, SLOW, candidate=245.4, ci_mode=True)
    assert out.status == "other-setup" and len(out.failures) == 1 and out.verdicts == []


def test_refreshing_on_another_machine_says_it_records_this_machines_beside_it(
    tmp_path: Path,
) -> None:
    out = compare(tmp_path, FAST, SLOW, candidate=245.4, ci_mode=True, refreshing=True)
    assert out.failures == []
    assert out.warnings[0].endswith("(this refresh records this machine's baseline beside it)")


def test_refreshing_over_an_uncalibrated_baseline_says_it_replaces_it(tmp_path: Path) -> None:
    out = compare(tmp_path, None, SLOW, candidate=245.4, ci_mode=True, refreshing=True)
    assert out.status == "uncalibrated" and out.failures == []
    assert out.warnings[0].endswith("(this refresh replaces it)")


def test_a_real_regression_on_the_same_machine_still_fails(tmp_path: Path) -> None:
    """The calibration must not hide a regression: it never measures the code under test."""
    out = compare(tmp_path, FAST, SAME_SLOW_SESSION, candidate=700.0)
    assert out.status == "compared"
    assert out.failures == [f"slo_goodput_tok_s regressed vs baseline: {out.verdicts[0].reason}"]


def test_allow_other_hardware_compares_another_machine_anyway(tmp_path: Path) -> None:
    out = compare(tmp_path, FAST, SLOW, candidate=245.4, allow_other_hardware=True)
    assert out.status == "compared" and out.verdicts[0].outcome == "regressed"


def test_a_baseline_without_calibration_is_not_compared(tmp_path: Path) -> None:
    out = compare(tmp_path, None, SLOW, candidate=245.4)
    assert out.status == "uncalibrated" and out.verdicts == [] and out.failures == []
    (line,) = out.warnings
    assert "has no machine calibration (recorded before calibrations existed)" in line
    assert "this machine (GEMM 24.6 GFLOP/s, copy 5.1 GB/s (1 thread))" in line
    assert "not compared. Re-record it here with `pytest perf_tests/test_embedded.py " in line


def test_a_remote_server_has_no_calibration_and_compares_by_names(tmp_path: Path) -> None:
    out = compare(tmp_path, FAST, None, candidate=1000.0)
    assert out.status == "compared"


def test_the_committed_cpu_baseline_is_another_setup_on_a_slower_machine() -> None:
    """What ``make perf`` on a fresh clone of a slower VM meets: one line, never "regressed"
    (issue 17: -75 % against the committed file), and a compare on the recording machine."""
    (path,) = COMMITTED.glob("perf_tests_test_embedded.py--*/cpu-*.json")
    recorded = json.loads(path.read_text())
    assert recorded["key"]["calibration"] is not None, "re-record it with calibration"
    there = Calibration.from_dict(recorded["key"]["calibration"], source=str(path))
    slow = BaselineKey.from_dict({**recorded["key"], "calibration": SLOW.to_dict()})
    quarter = [v / 4 for v in recorded["metrics"]["slo_goodput_tok_s"]]
    out = gates.compare(BaselineStore(COMMITTED), recorded["test_id"], slow,
                        {"slo_goodput_tok_s": quarter},
                        allow_other_hardware=False, ci_mode=False, target=TARGET)  # fmt: skip
    assert out.status == "other-setup" and out.failures == [] and len(out.warnings) == 1
    assert "regressed" not in out.warnings[0]
    same = BaselineKey.from_dict(recorded["key"])
    assert same.calibration == there
    out = gates.compare(BaselineStore(COMMITTED), recorded["test_id"], same,
                        {"slo_goodput_tok_s": quarter},
                        allow_other_hardware=False, ci_mode=False, target=TARGET)  # fmt: skip
    assert out.status == "compared"
    # compared, and -75 % would be a regression, but that file's own boundary probes were
    # measured while the VM stalled the client (p99 send lag ~470 ms): inconclusive, saying so
    assert out.failures == [] and any("stalled the client" in w for w in out.warnings)


# ---- the key and the file


def test_calibration_is_stored_but_not_in_the_name_or_equality() -> None:
    a, b = cpu_key(FAST), cpu_key(SLOW)
    assert a == b and a.slug() == b.slug() == cpu_key(None).slug()
    back = BaselineKey.from_dict(json.loads(json.dumps(a.to_dict())))
    assert back.calibration == FAST


def test_old_key_without_calibration_reads_as_none() -> None:
    d = cpu_key(None).to_dict()
    del d["calibration"]
    assert BaselineKey.from_dict(d).calibration is None


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        ("fast", "key.calibration"),
        ({"version": 1, "threads": 1, "figures": {"gemm_gflops": "x"}}, "key.calibration.figures"),
        ({"version": 0, "threads": 1, "figures": {}}, "key.calibration.version"),
    ],
)
def test_a_bad_calibration_names_the_field(bad: object, what: str) -> None:
    with pytest.raises(UsageError) as e:
        BaselineKey.from_dict({**cpu_key(None).to_dict(), "calibration": bad}, source="b.json")
    assert e.value.what == what and str(e.value).startswith("b.json: ")


# ---- measuring


def test_measure_host_gives_positive_figures_quickly() -> None:
    pytest.importorskip("torch", reason="the calibration's GEMM runs on torch")
    best, spread, threads = cal.measure_host(threads=1, repeats=3)
    assert set(best) == set(cal.HOST_FIGURES) and all(v > 0 for v in best.values())
    assert all(0 <= s < 1 for s in spread.values()) and threads == 1


def test_vllm_threads_one_per_core_minus_the_scheduler(tmp_path: Path) -> None:
    for cpu, core in enumerate([0, 0, 1, 1, 2, 2, 3, 3]):  # 4 cores with SMT-2
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    assert cal.vllm_threads(range(8), tmp_path, environ={}) == 3
    assert cal.vllm_threads(range(2), tmp_path, environ={}) == 1
    assert cal.vllm_threads(range(8), tmp_path, environ={"OMP_NUM_THREADS": "6"}) == 6


@pytest.mark.parametrize(
    ("url", "here"),
    [(None, True), ("http://127.0.0.1:8000", True), ("http://localhost:1/v1", True),
     ("http://[::1]:8000", True), ("http://10.0.0.5:8000", False)],
)  # fmt: skip
def test_only_a_server_on_this_machine_is_calibrated(url: str | None, here: bool) -> None:
    assert cal.on_this_machine(url) is here


# ---- the whole plugin: a baseline recorded on another machine

SPEC = """\
name: calib
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
workload: {trace: fixed, num_requests: 20, seed: 0, input_tokens: 16, output_tokens: 8}
arrival: {process: poisson, rate: 2.0}
slo: {ttft_p99_ms: 2000, tpot_p99_ms: 200}
search: {rate_min: 20.0, rate_max: 40.0, tolerance: 0.4, max_probes: 2, probe_requests: 40,
         probe_duration_s: 0.5}
runs: 1
"""
CONFTEST = """\
import os
from pytest_moeperf.baseline import calibration

def _fixed(threads=None, repeats=0):
    gemm, copy = (float(x) for x in os.environ["FAKE_CALIBRATION"].split(","))
    return {"gemm_gflops": gemm, "copy_gb_s": copy}, {"gemm_gflops": 0.1, "copy_gb_s": 0.1}, 1

calibration.measure_host = _fixed
"""
TEST = """\
import pytest

@pytest.mark.moeperf_spec("calib.yaml")
def test_goodput(moeperf):
    moeperf.run()
"""


def test_plugin_says_another_machine_in_one_line(
    pytester: pytest.Pytester, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Record on a 'fast' machine, run on a 'slow' one with the same names: one line, a pass."""
    url, _ = serve(delay_s=0.001)
    (pytester.path / "perf_tests" / "specs").mkdir(parents=True)
    (pytester.path / "perf_tests" / "specs" / "calib.yaml").write_text(SPEC)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_calib=TEST)
    args = ["-p", "no:cacheprovider", "--moeperf-server-url", url, "-rA"]
    monkeypatch.setenv("FAKE_CALIBRATION", "86.3,17.7")
    first = pytester.runpytest(*args, "--moeperf-refresh-baselines", "--moeperf-reason", "fast")
    first.assert_outcomes(passed=1)
    (written,) = (pytester.path / "baselines").glob("*/*.json")
    assert json.loads(written.read_text())["key"]["calibration"]["figures"] == FAST.figures
    monkeypatch.setenv("FAKE_CALIBRATION", "24.6,5.1")
    second = pytester.runpytest(*args)
    second.assert_outcomes(passed=1)
    lines = [ln for ln in second.outlines if "on this machine:" in ln]
    assert lines, second.stdout.str()
    assert "calibration GEMM 24.6 vs 86.3 GFLOP/s (-71 %); copy 5.1 vs 17.7 GB/s (-71 %)" \
        in lines[0]  # fmt: skip
    assert "regressed" not in second.stdout.str()
