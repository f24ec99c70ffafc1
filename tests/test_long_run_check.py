"""benchmarks/h200/long_run_check.py: the verdict over its four long runs, and R from a baseline."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def check() -> ModuleType:
    path = ROOT / "benchmarks" / "h200" / "long_run_check.py"
    spec = importlib.util.spec_from_file_location("long_run_check", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plugin(rate: float, met: bool) -> dict[str, object]:
    return {"tool": "pytest-moeperf", "rate": rate, "meets_slo_in_steady_state": met}


def bench(rate: float, ttft: float | None, tpot: float = 30.0) -> dict[str, object]:
    return {"tool": "vllm bench serve", "rate": rate, "p99_ttft_ms": ttft, "p99_tpot_ms": tpot,
            "slo_ttft_ms": 2000, "slo_tpot_ms": 50}  # fmt: skip


def test_confirmed_when_r_holds_and_ten_percent_above_does_not(check: ModuleType) -> None:
    runs = [plugin(10, True), bench(10, 1500), plugin(11, False), bench(11, 2600)]
    assert check.verdict(runs, 10.0) == {"confirmed": True, "problems": []}


@pytest.mark.parametrize(
    ("runs", "problem"),
    [
        ([plugin(10, False), bench(10, 1500), plugin(11, False), bench(11, 2600)],
         "pytest-moeperf misses the SLO at the reported rate 10"),
        ([plugin(10, True), bench(10, 1500, tpot=51), plugin(11, False), bench(11, 2600)],
         "vllm bench serve misses the SLO at the reported rate 10"),
        ([plugin(10, True), bench(10, 1500), plugin(11, True), bench(11, 2600)],
         "pytest-moeperf still meets the SLO 10 % above, at 11"),
        ([plugin(10, True), bench(10, None), plugin(11, False), bench(11, 2600)],
         "vllm bench serve at 10 req/s: no result"),
    ],
)  # fmt: skip
def test_each_disagreement_is_named(check: ModuleType, runs: list[dict[str, object]],
                                    problem: str) -> None:  # fmt: skip
    v = check.verdict(runs, 10.0)
    assert v["confirmed"] is False and v["problems"] == [problem]


def test_a_cut_short_check_is_not_confirmed(check: ModuleType) -> None:
    assert check.verdict([plugin(10, True), bench(10, 1500)], 10.0)["confirmed"] is False


def test_r_is_the_baseline_s_median_boundary(check: ModuleType, tmp_path: Path) -> None:
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"metrics": {"slo_rate_rps": [14.76, 15.94, 15.94]}}))
    assert check.boundary_rate(f) == pytest.approx(15.94)
    committed = sorted((ROOT / "baselines").glob("*test_h200_fixed_in_tree*/*.json"))
    if committed:  # the committed H200 baseline gives the rate the GPU check is run at
        assert 5 < check.boundary_rate(committed[0]) < 50
