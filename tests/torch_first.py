"""torch imported before any in-process pytester run (the fixtures ``tests/conftest.py`` uses).

An in-process run (``pytester.runpytest``) removes from ``sys.modules`` what it imported, and
so does the ``pytester`` fixture at its teardown. torch imported for the first time there is
removed with it, and the next ``import torch`` in the process segfaults (2026-12-07: exit
code 139; ``tests/test_torch_first.py`` shows it). An xdist worker died so in a fresh-clone
``make test`` once no test module imported vLLM at collection any more. numpy has the milder
form of the same trap (see ``tests/conftest.py``).
"""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="session")
def _torch_imported() -> None:
    """Session scope: set up before any ``pytester`` takes its snapshot of ``sys.modules``."""
    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401


@pytest.fixture
def pytester(_torch_imported: None, pytester: pytest.Pytester) -> pytest.Pytester:
    """pytest's own ``pytester`` (registered first, by ``-p pytester`` in pyproject.toml), with
    torch already imported where it is installed: ~1.7 s once a process that uses it."""
    return pytester
