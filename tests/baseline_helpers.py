"""A baseline key and provenance for tests of the store and the gates (an H200 TP=2 setup)."""

from __future__ import annotations

from typing import Any

from pytest_moeperf.baseline import BaselineKey, Provenance

PROV = Provenance(
    commit="0123abcd",
    date="2026-05-01T10:00:00+00:00",
    host="ci-1",
    command="pytest -k goodput",
    reason="initial",
    plugin_version="0.1.0",
)


def make_key(**over: Any) -> BaselineKey:
    """The reference key; ``over`` changes single fields (another GPU, another vLLM, ...)."""
    fields: dict[str, Any] = {
        "backend": "cuda",
        "gpu_name": "NVIDIA H200",
        "gpu_count": 2,
        "driver": "570.86",
        "cuda": "12.8",
        "vllm_version": "0.9.1",
        "model": "Qwen/Qwen3-30B-A3B",
        "dtype": "bfloat16",
        "tp": 2,
        "dp": 1,
        "spec_hash": "abc123",
        "moe_config_hash": "def456",
    }
    fields.update(over)
    return BaselineKey(**fields)
