"""The MoE kernel-config PR gate: each changed config file becomes an interleaved A/B.

    pytest perf_tests -k moe_config_ab --moeperf-ab-range origin/main...HEAD
    pytest perf_tests -k moe_config_ab \
        --moeperf-ab-folders perf_tests/moe_configs/in-tree,perf_tests/moe_configs/cpu-demo

Without one of those options the tests are skipped and say how to run them. A case whose file
this test's model never reads (other E/N/dtype, or another GPU) is skipped with the reason.
"""

from __future__ import annotations

import pytest


@pytest.mark.moeperf_spec("cpu-ab.yaml")
def test_moe_config_ab(moeperf_ab) -> None:  # type: ignore[no-untyped-def]
    """Embedded tiny Qwen3-MoE on the CPU: the whole gate runs; the backend ignores configs."""
    moeperf_ab.run()


@pytest.mark.moeperf_gpu
@pytest.mark.moeperf_spec("h200-ab.yaml")
def test_moe_config_ab_h200(moeperf_ab) -> None:  # type: ignore[no-untyped-def]
    """Qwen3-30B-A3B shapes on an H200 at concurrency 16."""
    moeperf_ab.run()
