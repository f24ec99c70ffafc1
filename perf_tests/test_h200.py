"""Qwen3-30B-A3B-shaped model (dummy weights) on a GPU: in-tree fused-MoE config."""

from __future__ import annotations

import pytest


@pytest.mark.moeperf_gpu
@pytest.mark.moeperf_spec("chat-mix-v1-h200.yaml")
@pytest.mark.moeperf_moe_config("in-tree")
def test_h200_in_tree_goodput(moeperf) -> None:  # type: ignore[no-untyped-def]
    result = moeperf.run()
    assert result.data["metrics"]["slo_goodput_tok_s"]["center"] is not None
