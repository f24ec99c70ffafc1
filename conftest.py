"""Root conftest: make the plugin available from a plain checkout too.

Installed (``pip install -e .``) the plugin loads through its ``pytest11`` entry point; from a bare
checkout it is loaded here instead, never both (pytest would refuse a double registration).
"""

from __future__ import annotations

from importlib.metadata import entry_points

_installed = any(ep.name == "moeperf" for ep in entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["pytest_moeperf.plugin"]
