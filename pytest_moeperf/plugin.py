"""pytest wiring only: options, markers, fixtures and hooks. The work lives in the flow modules.

spec -> server -> load -> metrics/energy -> baseline -> verdict -> report. Imports of those
modules (numpy, httpx, vllm, pynvml ...) happen inside hooks and fixtures, so that merely having
the plugin installed costs a pytest session nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from pytest_moeperf import markers, options
from pytest_moeperf.errors import GateFailure, ServerError, UsageError
from pytest_moeperf.session import MoePerfSession  # light: json, time, options

if TYPE_CHECKING:
    from pytest_moeperf.ab.cases import AbCase
    from pytest_moeperf.ab.gate import AbTest
    from pytest_moeperf.gpupool import GpuPool, TestGpus
    from pytest_moeperf.run.measure import PerfTest
    from pytest_moeperf.server.fixture import ServerFactory

SESSION_KEY = pytest.StashKey[MoePerfSession]()
AB_CASES_KEY = pytest.StashKey["tuple[list[AbCase], str | None]"]()
#: Servers already running when this session was configured: an outer session's, not ours.
_OUTER_SERVERS_KEY = pytest.StashKey[frozenset[int]]()
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
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_XdistRelay(config.stash[SESSION_KEY]), "moeperf-relay")
    _install_signal_cleanup()
    if "pytest_moeperf.server.process" in sys.modules:  # only if some session started servers
        from pytest_moeperf.server.process import live_server_pids

        config.stash[_OUTER_SERVERS_KEY] = live_server_pids()
    if options.value(config, "moeperf_ab_range") or options.value(config, "moeperf_ab_folders"):
        _ab_cases(config)  # a bad range or config file is a usage error before collection


class _XdistRelay:
    """On the xdist controller: collect the results the workers attached to their reports."""

    def __init__(self, session: MoePerfSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, "moeperf_payload", None)
        if payload and getattr(report, "node", None) is not None:  # relayed from a worker
            self.session.add_from_worker(payload)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    """A UsageError (a bad path found late), a ServerError or a GateFailure (a gate said no)
    raised inside a test is shown as its own message: one line, or the server's command and log
    tail, without plugin internals.
    A refreshed baseline prepared by ``moeperf.run()`` is written here, once the body passed.
    On an xdist worker: ship this test's results with its report (pytest serialises it)."""
    report = yield
    exc = call.excinfo
    shown = UsageError | ServerError | GateFailure
    if exc is not None and report.failed and isinstance(exc.value, shown):
        report.longrepr = str(exc.value)
    session = item.config.stash.get(SESSION_KEY, None)
    if session is not None and (call.when != "setup" or report.failed):
        from pytest_moeperf import pending  # a refresh's file waits for the body's asserts

        pending.settle(item, session, report, exc)
    if session is not None and session.is_xdist_worker:
        payload = session.take_for_controller()
        if payload is not None:
            report.moeperf_payload = payload
    return report


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
        names = getattr(item, "fixturenames", None)
        if (item.get_closest_marker("moeperf_exclusive") is not None
                and isinstance(names, list) and "moeperf_gpus" not in names):  # fmt: skip
            names.append("moeperf_gpus")  # the exclusive lease lives in that fixture


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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A/B tests (they use ``moeperf_ab``) get one parameter per changed MoE config file."""
    if "moeperf_ab_case" not in metafunc.fixturenames:
        return
    cases, _ = _ab_cases(metafunc.config)
    if cases:
        metafunc.parametrize("moeperf_ab_case", cases, ids=[c.id for c in cases])
    else:  # one skipped test that says why, rather than a test that silently vanishes
        metafunc.parametrize("moeperf_ab_case", [None], ids=["no-ab-case"])


def _ab_cases(config: pytest.Config) -> tuple[list[AbCase], str | None]:
    """Changed config files, found once per session (git is asked once, not once per test)."""
    if AB_CASES_KEY not in config.stash:
        from pytest_moeperf.ab.cases import discover

        rng = options.resolve(config, "moeperf_ab_range")
        folders = options.resolve(config, "moeperf_ab_folders")
        try:
            cases = discover(Path(config.rootpath), git_range=rng.value, folders=folders.value,
                             source=rng.source if rng.value else folders.source)  # fmt: skip
        except UsageError as exc:
            raise pytest.UsageError(str(exc)) from None
        origin = (f"git range {rng.value}" if rng.value
                  else f"folders {folders.value}" if folders.value else None)  # fmt: skip
        config.stash[AB_CASES_KEY] = (cases, origin)
    return config.stash[AB_CASES_KEY]


@pytest.fixture(scope="session")
def moeperf_gpu_pool(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> GpuPool:  # fmt: skip
    """This process's handle on the GPU pool that all xdist workers of the run share."""
    from pytest_moeperf.gpupool import pool_from_config

    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # xdist worker: its basetemp is <run root>/<gw>
        root = root.parent
    try:
        pool = pool_from_config(request.config, root)
        pool.universe  # noqa: B018 - a bad --moeperf-gpus fails here, once, in one line
    except UsageError as exc:
        pytest.fail(str(exc), pytrace=False)
    return pool


@pytest.fixture
def moeperf_gpus(request: pytest.FixtureRequest, moeperf_gpu_pool: GpuPool) -> Iterator[TestGpus]:
    """GPU leases for this test (``moeperf_gpus.lease(2).env``); all of them if exclusive."""
    from pytest_moeperf.errors import MoePerfError
    from pytest_moeperf.gpupool import TestGpus, take_exclusive

    gpus = TestGpus(moeperf_gpu_pool, request.node.nodeid)
    if request.node.get_closest_marker("moeperf_exclusive") is not None:
        try:
            gpus.exclusive_lease = take_exclusive(moeperf_gpu_pool, request.node.nodeid)
        except MoePerfError as exc:  # one line: already holding GPUs, or the wait ran out
            pytest.fail(str(exc), pytrace=False)
    try:
        yield gpus
    finally:
        gpus.release_all()
        if gpus.exclusive_lease is not None:
            gpus.exclusive_lease.release()


@pytest.fixture
def moeperf_server_factory(
    request: pytest.FixtureRequest, tmp_path: Path, moeperf_gpus: TestGpus
) -> Iterator[ServerFactory]:
    """Start real vLLM servers: ``server = moeperf_server_factory(model, args, ...)``.

    Each server leases its GPUs (tensor x pipeline x data, from its flags) from the pool.
    """
    from pytest_moeperf import settings
    from pytest_moeperf.server.fixture import ServerFactory

    timeout = settings.of(request.node).startup_timeout.value  # stashed by preflight
    factory = ServerFactory(tmp_path, startup_timeout_s=float(timeout),
                            gpu_pool=moeperf_gpus.pool, owner=request.node.nodeid)  # fmt: skip
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
    from pytest_moeperf.run.measure import PerfTest

    item = request.node
    assert isinstance(item, pytest.Item)
    return PerfTest(item, request.config.stash[SESSION_KEY], moeperf_server_factory, tmp_path)


@pytest.fixture
def moeperf_ab_case() -> None:
    """The changed config file of an A/B test; replaced by pytest_generate_tests' parameter."""
    return None


@pytest.fixture
def moeperf_ab(
    request: pytest.FixtureRequest,
    moeperf_ab_case: AbCase | None,
    moeperf_server_factory: ServerFactory,
    tmp_path: Path,
) -> AbTest:
    """The MoE config gate: ``moeperf_ab.run()`` serves base and head interleaved and judges."""
    from pytest_moeperf.ab.gate import AbTest

    item = request.node
    assert isinstance(item, pytest.Item)
    _, origin = _ab_cases(request.config)
    return AbTest(item, request.config.stash[SESSION_KEY], moeperf_server_factory, tmp_path,
                  moeperf_ab_case, origin)  # fmt: skip


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.terminal_summary(terminalreporter)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(SESSION_KEY, None)
    if state is not None:
        state.finish()
        # A file that could not be written where asked (its warning says where it went
        # instead) is a bad option value: CI must see it, even when every test passed.
        if state.write_failed and session.exitstatus in (pytest.ExitCode.OK,
                                                         pytest.ExitCode.TESTS_FAILED):  # fmt: skip
            session.exitstatus = pytest.ExitCode.USAGE_ERROR


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """After the test body: a perf test that also used pytest-benchmark shares its numbers."""
    try:
        return (yield)
    finally:
        state = item.config.stash.get(SESSION_KEY, None)
        if state is not None:
            state.link_benchmark(item)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the servers this session started; an outer session's (in-process pytester) live on."""
    from pytest_moeperf.server.process import stop_all_servers

    stop_all_servers(keep=config.stash.get(_OUTER_SERVERS_KEY, frozenset()))
