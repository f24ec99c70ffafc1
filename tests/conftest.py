"""Shared fixtures of the project's own tests.

A real vLLM CPU server takes 40-120 s to start on 2 cores, so tests that only need *a* running
server (the client against real SSE, external-endpoint mode, gsm8k, request errors) share one
per session: ``cpu_server``. Tests about startup, teardown, or a server dying start their own.
Real-server tests skip (with the reason) where vllm is not installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy  # noqa: F401  (see below)
import pytest
from torch_first import _torch_imported, pytester  # noqa: F401  (fixtures, see torch_first.py)
from vllm_needed import skip_without_vllm

from pytest_moeperf.server.process import VllmServer

# numpy is imported here, before any pytester run: an in-process run (``runpytest``) removes the
# modules it imported when it ends, and numpy imported a second time breaks (``_CopyMode.IF_NEEDED
# is neither True nor False`` in the next run's array code). Run alone, a test with two inline
# runs failed so; in the full suite an earlier module had imported numpy.


#: Engine arguments of the shared server: eager mode (no torch.compile) starts fastest. 4,096
#: tokens of context because gsm8k 5-shot prompts are up to 3,149 tokens with the embedded
#: byte-level tokenizer, plus 256 generated.
CPU_SERVER_ARGS = [
    "--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", "16", "--enforce-eager",
]  # fmt: skip


#: Fixtures that mean a real vLLM server: tests using them are marked ``real_server``.
REAL_SERVER_FIXTURES = frozenset({"cpu_server", "embedded_model", "tutorial_checkout"})
#: Fixtures that mean a whole measured verdict end to end (a baseline of three searched runs, then
#: runs judged against it: ~25 minutes on 2 cores): tests using them are also marked ``measures``
#: and ``e2e``. ``measures`` runs alone: a second server on the 2 cores moves the figures a verdict
#: is asked about, and the machine calibration a baseline records. ``e2e`` is left by
#: ``make test`` to ``make test-e2e`` (the nightly CPU job, ``.ci/nightly``). A module with
#: ``QUIET_CORES = True`` is ``measures`` only: its search must find a steady boundary, which a
#: vLLM server starting on the other worker can starve away.
MEASURING_FIXTURES = frozenset({"tutorial_checkout"})


def _uses_shared_server(item: pytest.Item) -> bool:
    return "cpu_server" in set(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark real-server tests, by fixture or by a module's ``REAL_SERVER = True`` (pytester runs
    that start their own server), so that ``pytest -m "not real_server"`` is the fast loop.

    Modules that use the shared server run first (each module stays whole, order otherwise
    kept) and the server stops after the last of them: an idle vLLM left running made the
    measuring tests after it warn "noisy machine: 1 inference server(s) not started by this
    session" and shared the 2 cores' memory with them (CI, 2026-12-04)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        module = getattr(item, "module", None)
        if names & REAL_SERVER_FIXTURES or getattr(module, "REAL_SERVER", False):
            item.add_marker(pytest.mark.real_server)
        if names & MEASURING_FIXTURES:
            item.add_marker(pytest.mark.measures)
            item.add_marker(pytest.mark.e2e)
        elif getattr(module, "QUIET_CORES", False):
            item.add_marker(pytest.mark.measures)
    users = {item.path for item in items if _uses_shared_server(item)}
    items.sort(key=lambda item: item.path not in users)  # stable: module order is kept
    _SHARED.last_user = next((i for i in reversed(items) if _uses_shared_server(i)), None)


class _Shared:
    """The shared server's factory and the last test that uses it (stopped after that one)."""

    factory: Any = None
    last_user: pytest.Item | None = None


_SHARED = _Shared()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if item is _SHARED.last_user and nextitem is not None and _SHARED.factory is not None:
        _SHARED.factory.stop_all()  # the session fixture's own teardown then finds it stopped


@pytest.fixture(scope="session", autouse=True)
def _fixed_calibration_for_started_sessions() -> Iterator[None]:
    """Every pytest this suite starts gets a fixed host calibration
    (``tests/moeperf_fixed_calibration.py`` says why and which tests measure for real). Set
    here, not at import: this process and its xdist workers are configured already."""
    saved = {k: os.environ.get(k) for k in ("PYTEST_PLUGINS", "PYTHONPATH", "PYTEST_ADDOPTS")}
    here = str(Path(__file__).resolve().parent)
    plugins = [p for p in (saved["PYTEST_PLUGINS"] or "").split(",") if p]
    os.environ["PYTEST_PLUGINS"] = ",".join([*plugins, "moeperf_fixed_calibration"])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, saved["PYTHONPATH"]]))
    # Hypothesis's plugin imports hypothesis (~1 s) at the end of every session; none of the
    # started sessions uses it
    os.environ["PYTEST_ADDOPTS"] = " ".join(
        filter(None, [saved["PYTEST_ADDOPTS"], "-p no:hypothesispytest"])
    )
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def embedded_model() -> Path:
    """The embedded tiny Qwen3-MoE, generated once into the user cache."""
    pytest.importorskip("tokenizers", reason="the embedded model's tokenizer is trained with "
                        "`tokenizers`: run `make test` (installs it)")  # fmt: skip
    from pytest_moeperf.server.embedded import ensure_embedded_model

    return ensure_embedded_model()


@pytest.fixture(scope="session")
def cpu_server(
    tmp_path_factory: pytest.TempPathFactory, embedded_model: Path
) -> Iterator[VllmServer]:
    """One real vLLM OpenAI server on the CPU for the whole session (do not stop it in a test)."""
    skip_without_vllm()
    from pytest_moeperf.server.fixture import ServerFactory

    factory = ServerFactory(tmp_path_factory.mktemp("shared-cpu-server"), startup_timeout_s=600)
    _SHARED.factory = factory
    try:
        yield factory(embedded_model, CPU_SERVER_ARGS, name="shared")
    finally:
        factory.stop_all()


@pytest.fixture
def serve() -> Iterator[Any]:
    """serve(**ServerConfig fields) -> (base_url, server): synthetic SSE servers (client and
    runner unit tests), stopped at teardown."""
    from sse_helpers import sse

    servers: list[Any] = []

    def start(**cfg: Any) -> tuple[str, Any]:
        srv = sse.SSEServer(sse.ServerConfig(**cfg))
        port = srv.run_in_thread()
        servers.append(srv)
        return f"http://127.0.0.1:{port}", srv

    yield start
    for srv in servers:
        srv.stop_thread()


@pytest.fixture(scope="session")
def tutorial_checkout(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Any]:
    """A fresh copy of the repository in which docs/tutorial.md's first block has run: the
    embedded default's baseline, recorded from three runs on a real server. Returns the copy
    and that block's completed process (the tutorial test asserts on it)."""
    skip_without_vllm()
    from tutorial_helpers import TUTORIAL, copy_checkout, run_block, tutorial_blocks

    checkout = copy_checkout(tmp_path_factory.mktemp("tutorial") / "repo")
    first = run_block(tutorial_blocks(TUTORIAL.read_text())[0], checkout)
    return checkout, first
