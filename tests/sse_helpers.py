"""The synthetic SSE server of ``benchmarks/sse_server.py``, loaded once for the client tests.

It lives under ``benchmarks/`` because the client benchmark drives it too; tests that need it
import ``sse`` from here and take the ``serve`` fixture from ``conftest.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def load_sse_server() -> ModuleType:
    if "sse_server" in sys.modules:
        return sys.modules["sse_server"]
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "sse_server.py"
    spec = importlib.util.spec_from_file_location("sse_server", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sse_server"] = mod
    spec.loader.exec_module(mod)
    return mod


sse = load_sse_server()
#: serve(**ServerConfig fields) -> (base_url, server)
Serve = Callable[..., tuple[str, Any]]
