"""pytest wiring only: options, markers, fixtures and hooks. The work lives in the flow modules.

spec -> server -> load -> metrics/energy -> baseline -> verdict -> report. Imports of those
modules (numpy, httpx, vllm, pynvml ...) happen inside hooks and fixtures, so that merely having
the plugin installed costs a pytest session nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from pytest_moeperf import markers, options
from pytest_moeperf.errors import ServerError, UsageError
from pytest_moeperf.session import MoePerfSession  # light: json, time, options

if TYPE_CHECKING:
    from pytest_moeperf.measure import PerfTest
    from pytest_moeperf.server.fixture import ServerFactory

SESSION_KEY = pytest.StashKey[MoePerfSession]()
GPU_SKIP_REASON = (
    "needs a GPU: this perf test is marked moeperf_gpu; run `pytest perf_tests --gpu` on a GPU "
    "machine with vLLM installed (pip install 'pytest-moeperf[gpu]')"
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_moeperf import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    markers.register(config)
    config.stash[SESSION_KEY] = MoePerfSession(config)
    _install_signal_cleanup()


def _install_signal_cleanup() -> None:
    """SIGTERM of pytest (a CI runner cancelling the job) must not leave vLLM processes behind."""
    from pytest_moeperf.server.process import stop_all_servers

    atexit.register(stop_all_servers)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop_all_servers()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt("SIGTERM")

    if previous is not on_term:
        # not possible outside the main thread (e.g. pytester in-process runs)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, on_term)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = options.resolve(config, "moeperf_gpu").value
    for item in items:
        if item.get_closest_marker("moeperf_gpu") is not None and not gpu:
            item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check markers, spec, options and baselines before the test runs: one clear line each."""
    from pytest_moeperf import preflight

    message = None
    try:
        preflight.check_item(item)
    except UsageError as exc:
        message = str(exc)
    if message is not None:
        pytest.fail(message, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A UsageError (a bad path found late) or a ServerError raised inside a test is shown as
    its own message: one line, or the server's command and log tail, without plugin internals."""
    report = yield
    exc = call.excinfo
    if exc is not None and report.failed and isinstance(exc.value, UsageError | ServerError):
        report.longrepr = str(exc.value)
    return report


@pytest.fixture
def moeperf_server_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[ServerFactory]:
    """Start real vLLM servers: ``server = moeperf_server_factory(model, args, ...)``."""
    from pytest_moeperf.server.fixture import ServerFactory

    timeout = options.value(request.config, "moeperf_startup_timeout")
    factory = ServerFactory(tmp_path, startup_timeout_s=float(timeout))
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def moeperf_embedded_model(request: pytest.FixtureRequest) -> Path:
    """The embedded tiny Qwen3-MoE (random weights, local tokenizer), generated once and cached."""
    from pytest_moeperf.server.embedded import ensure_embedded_model

    return ensure_embedded_model(options.resolve_path(request.config, "moeperf_cache_dir"))


@pytest.fixture
def moeperf(
    request: pytest.FixtureRequest, moeperf_server_factory: ServerFactory, tmp_path: Path
) -> PerfTest:
    """The perf test driver: ``result = moeperf.run()`` measures the spec and applies the gates."""
    from pytest_moeperf.measure import PerfTest

    item = request.node
    assert isinstance(item, pytest.Item)
    return PerfTest(item, request.config.stash[SESSION_KEY], moeperf_server_factory, tmp_path)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.terminal_summary(terminalreporter)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(SESSION_KEY, None)
    if state is not None:
        state.finish()


def pytest_unconfigure(config: pytest.Config) -> None:
    from pytest_moeperf.server.process import stop_all_servers

    stop_all_servers()
