"""A perf test that must fail in preflight: its files, the run, and the one-line check.

Shared by ``test_faults_input.py`` (bad input, one message each) and ``test_preflight.py``
(what the checks read before any server starts). The guard conftest fails loudly if a server
was about to start, so a check that slipped past preflight cannot pass unnoticed.
"""

from __future__ import annotations

import pytest

GUARD = """
def pytest_moeperf_server_command(config, command):
    raise AssertionError("SERVER WOULD START")


def pytest_moeperf_probe_start(config, nodeid, run_number, probe_number, rate, server_pid):
    raise AssertionError("SERVER WOULD START")
"""

SPEC = """\
name: tiny
model:
  path: embedded
  dtype: bfloat16
  max_model_len: 1024
workload:
  trace: fixed
  num_requests: 16
  seed: 0
  input_tokens: 64
  output_tokens: 16
arrival:
  process: poisson
  rate: 2.0
slo:
  ttft_p99_ms: 2000
  tpot_p99_ms: 200
runs: 1
"""

#: The test file: ``{markers}`` are its decorators, from line 6 on.
TEST = """\
from pathlib import Path

import pytest


{markers}
def test_it(moeperf):
    moeperf.run()
"""

SPEC_MARK = '@pytest.mark.moeperf_spec("spec.yaml")'
CONFIG_NAME = "E=16,N=128,device_name=NVIDIA_H200.json"


def run_perf_test(pytester: pytest.Pytester, markers: str, spec: str = SPEC,
                  args: tuple[str, ...] = ()) -> pytest.RunResult:  # fmt: skip
    """One perf test with the guard conftest, in a fresh interpreter as a user would run it."""
    pytester.makeconftest(GUARD)
    pytester.path.joinpath("spec.yaml").write_text(spec)
    pytester.makepyfile(test_it=TEST.format(markers=markers.rstrip("\n")))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rN", *args)


def one_error_line(result: pytest.RunResult, *needles: str) -> str:
    """Setup errored, quickly, with no server and no traceback, in exactly one line holding
    every needle and a "Fix:". No server: the guard conftest raises where one would start or
    be probed."""
    out = result.stdout.str() + result.stderr.str()
    assert "SERVER WOULD START" not in out, out
    assert "Traceback" not in out and "raise " not in out, out
    result.assert_outcomes(errors=1)
    # quickly: nothing waited on a deadline. Not 60 s: the engine-argument check imports
    # vLLM's parser, which took 62 s on a loaded 2-core VM (three xdist workers)
    assert result.duration < 180, f"preflight took {result.duration:.0f} s: what did it wait on?"
    lines = [line for line in out.splitlines() if all(n in line for n in needles)]
    assert len(lines) == 1, f"want one line with {needles}, got {lines}:\n{out}"
    assert "Fix:" in lines[0], lines[0]
    return lines[0]
