"""A probe whose completions arrive whole is not met: its TPOT would read ~0 (the synthetic
SSE server sends every completion as one chunk; the same server sending token by token keeps
its token times, so only the chunking differs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sse_helpers import sse

from pytest_moeperf.metrics.energy import NotMeasuredMeter
from pytest_moeperf.run.probe import Endpoint, RunMeasurement, measure_run
from pytest_moeperf.spec.loader import load_spec

SPEC = """\
name: token-times
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
workload: {trace: fixed, num_requests: 20, seed: 0, input_tokens: 8, output_tokens: 8}
arrival: {process: poisson}
slo: {ttft_p99_ms: 2000, tpot_p99_ms: 200}
search: {rate_min: 60, rate_max: 120, tolerance: 0.2, max_probes: 2, probe_requests: 20,
         probe_duration_s: 0.3}
runs: 1
"""


@pytest.fixture
def measure(tmp_path: Path) -> Iterator[Callable[[int], RunMeasurement]]:
    servers: list[object] = []

    def run(tokens_per_chunk: int) -> RunMeasurement:
        srv = sse.SSEServer(sse.ServerConfig(delay_s=0.002, tokens_per_chunk=tokens_per_chunk))
        servers.append(srv)
        port = srv.run_in_thread()
        path = tmp_path / "spec.yaml"
        path.write_text(SPEC)
        spec = load_spec(path)
        return measure_run(Endpoint(f"http://127.0.0.1:{port}", "m"), spec, spec.slo, index=0,
                           meter=NotMeasuredMeter("test"), vocab_size=500, rate_min=60.0,
                           probe_requests=20, max_probes=2, mbu_inputs=None)  # fmt: skip

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
