"""One xdist worker runs every test that uses the shared vLLM server (``cpu_server``).

Under plain ``-n auto`` (``--dist load``) each worker that got one of those tests started its own
server: two vLLM start-ups on 2 cores (~70-100 s each, slowing the other worker too) and twice
the memory. ``--dist loadgroup`` with an ``xdist_group`` mark would do this, but pytest 9.2 no
longer lets xdist rename a collected item's node id, so the mark is silently ignored
(pytest-dev/pytest-xdist#1386: seen here, the users still ran on both workers).

So: each worker writes the node ids of the users it collected to a file the controller named;
the controller's scheduler makes them one unit of work and every other test a unit of its own,
which is ``load`` distribution for everything else.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

ENV = "MOEPERF_TESTS_SHARED_USERS"  # the list's path, set by the controller for its workers


def on_controller_configure(config: pytest.Config) -> None:
    """Name the file the workers will write (inherited: the workers start after configure)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        fd, name = tempfile.mkstemp(prefix="moeperf-shared-users-", suffix=".txt")
        os.close(fd)
        os.environ[ENV] = name
        config.add_cleanup(lambda: (Path(name).unlink(missing_ok=True), os.environ.pop(ENV, None)))


def write_users(nodeids: list[str]) -> None:
    """On a worker: the users it collected (every worker collects the same tests)."""
    path = os.environ.get(ENV)
    if path is None or "PYTEST_XDIST_WORKER" not in os.environ:
        return
    tmp = Path(f"{path}.{os.environ['PYTEST_XDIST_WORKER']}")
    tmp.write_text("\n".join(nodeids))
    tmp.replace(path)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist load`` with the users as one unit; other modes are left to xdist."""
    if config.getvalue("dist") != "load" or ENV not in os.environ:
        return None
    from xdist.scheduler import LoadScopeScheduling

    path = Path(os.environ[ENV])

    class SharedServerScheduling(LoadScopeScheduling):  # type: ignore[misc]
        users: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.users is None:  # read at the first scheduling: every worker has collected
                self.users = frozenset(path.read_text().split("\n")) - {""}
            return "shared vLLM server" if nodeid in self.users else nodeid

    return SharedServerScheduling(config, log)
