"""External endpoint mode: measure a server this run did not start (``--moeperf-server-url``).

An existing OpenAI-compatible server, a Kubernetes service or a Ray Serve load balancer. What
the run cannot know about it, it must not pretend to: the MoE config is declared (by the test),
not set; energy is measured only on local GPUs the user names (``--moeperf-gpus``), since which
GPUs serve the URL is not visible from here; the engine version is the server's own
(``GET /version``), not the vLLM installed beside pytest.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_moeperf import options

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
        r = httpx.get(f"{url}/version", timeout=10)
        r.raise_for_status()
        version = r.json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(version) if version else None
