"""``run/source.py``: a local vLLM process and an external URL behind one interface.

The end-to-end paths are covered elsewhere (``test_external_real.py``, ``test_faults_external.py``
and every real-server test); these pin what each source says without a server: which machine
it is on, what measures its energy, what it claims about the MoE config, and its engine facts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.external import ENERGY_NOT_MEASURED
from pytest_moeperf.markers import MoeConfigChoice
from pytest_moeperf.run.probe import Endpoint
from pytest_moeperf.run.source import ExternalUrl, LocalVllm, Served, ServerSource


@pytest.fixture
def config(pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> pytest.Config:
    """This session's config, with no GPUs named for an external server's energy."""
    monkeypatch.delenv("MOEPERF_GPUS", raising=False)
    return pytestconfig


@pytest.fixture
def openai_like() -> Iterator[str]:
    """A server that answers /v1/models and /version as vLLM does."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {"/v1/models": {"object": "list", "data": [{"id": "served-model"}]},
                    "/version": {"version": "0.32.0"}}.get(self.path)  # fmt: skip
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body or {}).encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _choice() -> MoeConfigChoice:
    return MoeConfigChoice(name="tuned", folder=Path("tuned"), files=None, source="marker")


@pytest.mark.parametrize(("url", "here"), [("http://127.0.0.1:8000", True),
                                           ("http://localhost:8000", True),
                                           ("http://gpu-node-7:8000", False)])  # fmt: skip
def test_an_external_server_is_on_this_machine_only_on_loopback(config: pytest.Config, url: str,
                                                               here: bool) -> None:  # fmt: skip
    source: ServerSource = ExternalUrl(config, url)
    assert source.on_this_machine is here
    assert source.url == url


def test_a_local_server_is_always_on_this_machine_and_has_no_url(config: pytest.Config) -> None:
    source: ServerSource = LocalVllm(config, None, lambda spec: Path())  # type: ignore[arg-type]
    assert source.on_this_machine and source.url is None
    assert source.energy_fallback(()) is None  # NVML on its leased GPUs, as every local run


def test_an_external_servers_energy_is_not_measured_unless_gpus_are_named(
    config: pytest.Config,
) -> None:
    source = ExternalUrl(config, "http://gpu-node-7:8000")
    meter = source.energy_fallback(())
    assert meter is not None and getattr(meter, "reason", None) == ENERGY_NOT_MEASURED
    assert source.energy_fallback((0, 1)) is None  # named local GPUs: NVML measures them


def test_an_external_server_declares_its_config_and_reports_its_own_version(
    config: pytest.Config, openai_like: str
) -> None:
    source = ExternalUrl(config, openai_like)
    served = source.start(None, _choice())  # type: ignore[arg-type]
    assert served.endpoint.base_url == openai_like
    assert served.endpoint.model == "served-model"
    assert served.server is None and served.model_dir is None
    assert served.check == f"declared, not set: tuned on external server {openai_like}"
    engine = source.engine(served)
    assert (engine.backend, engine.version, engine.devices) == ("external", "0.32.0", ())


def test_an_external_server_without_version_says_unknown(
    config: pytest.Config, openai_like: str
) -> None:
    source = ExternalUrl(config, openai_like + "/behind-a-proxy")  # no /version there
    served = Served(Endpoint(openai_like, "served-model"), None, "declared")
    assert source.engine(served).version == "unknown (external)"
