"""An in-process pytester run must not stop the outer session's vLLM servers.

The CI failure this guards: the session-wide ``cpu_server`` was stopped by the
``pytest_unconfigure`` of an inline ``pytester.runpytest`` in an unrelated test, and three
later tests met a refused connection.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_moeperf.server import process


class _Recorder:
    """Stands in for a ``VllmServer`` in the live registry: records that it was stopped."""

    def __init__(self) -> None:
        self.stopped = 0

    def stop(self, grace_s: float = 10.0) -> None:
        self.stopped += 1


@pytest.fixture
def outer_server() -> Iterator[_Recorder]:
    rec = _Recorder()
    pid = -4242  # no real process has a negative pid
    process._LIVE[pid] = rec  # type: ignore[assignment]
    try:
        yield rec
    finally:
        process._LIVE.pop(pid, None)


def test_inline_run_leaves_the_outer_sessions_server_running(
    pytester: pytest.Pytester, outer_server: _Recorder
) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert outer_server.stopped == 0


def test_inline_run_still_stops_the_servers_it_started(
    pytester: pytest.Pytester, outer_server: _Recorder
) -> None:
    """A server the inner session registered is stopped at the inner session's end."""
    pytester.makeconftest(
        """
        from pytest_moeperf.server import process

        class Rec:
            stopped = 0
            def stop(self, grace_s=10.0):
                Rec.stopped += 1

        INNER = Rec()

        def pytest_sessionstart(session):
            process._LIVE[-4343] = INNER

        def pytest_sessionfinish(session):
            session.config._inner = INNER
        """
    )
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    inner = result.reprec.getcalls("pytest_sessionfinish")[0].session.config._inner  # type: ignore[attr-defined]
    assert inner.stopped == 1
    assert outer_server.stopped == 0
    process._LIVE.pop(-4343, None)
