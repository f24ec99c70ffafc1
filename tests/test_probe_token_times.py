"""A probe whose completions arrive whole is not met: its TPOT would read ~0 (the synthetic
SSE server sends every completion as one chunk; the same server sending token by token keeps
its token times, so only the chunking differs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sse_helpers import sse
from test_faults_energy import _measure as measure_energy_run

from pytest_moeperf.metrics.energy import NotMeasuredMeter
from pytest_moeperf.run.probe import Endpoint, RunMeasurement


@pytest.fixture
def measure(tmp_path: Path) -> Iterator[Callable[[int], RunMeasurement]]:
    servers: list[object] = []

    def run(tokens_per_chunk: int) -> RunMeasurement:
        srv = sse.SSEServer(sse.ServerConfig(delay_s=0.002, tokens_per_chunk=tokens_per_chunk))
        servers.append(srv)
        port = srv.run_in_thread()
        # test_faults_energy's spec and run: 8-token outputs, two short probes at 60-120 req/s
        endpoint = Endpoint(f"http://127.0.0.1:{port}", "m")
        return measure_energy_run(tmp_path, endpoint, NotMeasuredMeter("test"))

    yield run
    for srv in servers:
        srv.stop_thread()  # type: ignore[attr-defined]


def test_whole_completions_are_never_a_met_probe(
    measure: Callable[[int], RunMeasurement],
) -> None:
    search = measure(8).search  # 8-token outputs in one chunk each
    assert search is not None
    probes = search.probes
    assert probes and not any(p.met for p in probes)
    assert all("token times lost: 8.0 tokens a chunk of 8" in (p.reason or "") for p in probes)
    assert search.boundary_rate is None


def test_token_by_token_streams_keep_their_token_times(
    measure: Callable[[int], RunMeasurement],
) -> None:
    search = measure(1).search  # met or not is up to this machine's speed; times are kept
    assert search is not None and search.probes
    assert not any("token times lost" in (p.reason or "") for p in search.probes)
