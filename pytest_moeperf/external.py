"""External endpoint mode: measure a server this run did not start (``--moeperf-server-url``).

An existing OpenAI-compatible server, a Kubernetes service or a Ray Serve load balancer. What
the run cannot know about it, it must not pretend to: the MoE config is declared (by the test),
not set; energy is measured only on local GPUs the user names (``--moeperf-gpus``), since which
GPUs serve the URL is not visible from here; the engine version is the server's own
(``GET /version``), not the vLLM installed beside pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pytest_moeperf import options
from pytest_moeperf.errors import UsageError

#: Seconds to connect to / hear from the external server before the run gives up on it: a
#: server that does not answer /v1/models in this long will not serve a load test either.
CHECK_TIMEOUT_S = 5.0

ENERGY_NOT_MEASURED = (
    "external server: the GPUs serving it are not known here; if they are local, name them "
    "with --moeperf-gpus (CUDA_VISIBLE_DEVICES entries) to measure their energy"
)


@dataclass(frozen=True)
class ExternalServer:
    url: str
    version: str | None  # None: the server has no /version (not vLLM, or behind a proxy)
    devices: tuple[str, ...]  # local GPUs named for energy; () = not measured
    devices_source: str


def describe(config: pytest.Config, url: str) -> ExternalServer:
    """The external server's engine version and the local GPUs named for its energy."""
    from pytest_moeperf.gpupool import parse_devices

    gpus = options.resolve(config, "moeperf_gpus")
    devices = () if gpus.value is None else parse_devices(str(gpus.value), gpus.source)
    return ExternalServer(url, server_version(url), devices, gpus.source)


def server_version(url: str) -> str | None:
    """vLLM's ``GET /version`` -> "0.32.0"; None where the endpoint does not offer it."""
    import httpx

    try:
        r = httpx.get(f"{url}/version", timeout=CHECK_TIMEOUT_S)
        r.raise_for_status()
        version = r.json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(version) if version else None


def served_model(config: pytest.Config, url: str) -> str:
    """The model the server serves (``GET /v1/models``), or one UsageError line saying what
    answered instead: nothing, not HTTP, an HTTP error, not JSON, or no model at all."""
    return served_model_at(url, options.resolve(config, "moeperf_server_url").source)


def served_model_at(url: str, source: str) -> str:
    """``served_model`` for a URL given by ``source`` (an option, outside pytest too)."""
    import httpx

    def fail(problem: str, fix: str) -> UsageError:
        return UsageError(source, "moeperf_server_url", url, problem, fix)

    models = f"{url}/v1/models"
    try:
        r = httpx.get(models, timeout=CHECK_TIMEOUT_S)
    except httpx.ConnectError as exc:
        raise fail(f"nothing answers there ({_reason(exc)})",
                   "start the server, or correct the host and port") from None  # fmt: skip
    except httpx.TimeoutException:
        raise fail(f"no answer to GET {models} within {CHECK_TIMEOUT_S:g} s",
                   "check that the server is up and the URL is its HTTP port",
                   ) from None  # fmt: skip
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # RemoteProtocolError: not HTTP
        raise fail(f"does not speak HTTP ({type(exc).__name__}: {_reason(exc)})",
                   "give the URL of the OpenAI-compatible HTTP server") from None  # fmt: skip
    if r.status_code != 200:
        raise fail(f"GET {models} answered HTTP {r.status_code}",
                   "give the root of an OpenAI-compatible server (vLLM: `vllm serve`)")  # fmt: skip
    try:
        body: Any = r.json()
    except ValueError:
        raise fail(f"GET {models} answered {r.text[:40]!r}, not JSON",
                   "give the root of an OpenAI-compatible server") from None  # fmt: skip
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data:
        raise fail(f"GET {models} lists no model ({str(body)[:60]})",
                   "load a model in the server before measuring it")  # fmt: skip
    first = data[0]
    model = first.get("id") if isinstance(first, dict) else None
    if not isinstance(model, str) or not model:
        raise fail(f"GET {models}: the first model has no id ({str(first)[:60]})",
                   "give the root of an OpenAI-compatible server")  # fmt: skip
    return model


def _reason(exc: Exception) -> str:
    """The innermost cause, on one line: "[Errno 111] Connection refused"."""
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:120]
