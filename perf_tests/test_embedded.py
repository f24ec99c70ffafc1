"""The embedded default: the real vLLM CPU server on the generated tiny Qwen3-MoE.

Runs with no GPU and no network: `pytest perf_tests` on a laptop or in CI.
"""

from __future__ import annotations

import pytest


@pytest.mark.moeperf_spec("cpu-smoke.yaml")
@pytest.mark.moeperf_slo(ttft_p99_ms=2000, tpot_p99_ms=200)
@pytest.mark.moeperf_moe_config("in-tree")
def test_embedded_slo_goodput(moeperf) -> None:  # type: ignore[no-untyped-def]
    """SLO goodput of the CPU server; the CPU backend reads no MoE configs (recorded)."""
    result = moeperf.run()
    goodput = result.metrics.slo_goodput_tok_s.center
    assert goodput is not None and goodput > 0
    assert "ignores MoE configs" in result.moe_config.check
