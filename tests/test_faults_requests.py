"""Requests that fail (HTTP 4xx/5xx, a cut stream, a stall past the timeout) are counted,
reported and judged as SLO misses: never dropped from the percentiles.

The unit test runs ``run_load`` + ``summarize`` against the synthetic SSE server with one fault
of each kind planted on chosen requests; the last test sends a prompt longer than the real vLLM
server's ``--max-model-len``, which vLLM answers with HTTP 400.
"""

from __future__ import annotations

import math

import pytest
from sse_helpers import Serve

from pytest_moeperf.load.records import RequestSpec
from pytest_moeperf.load.runner import run_load
from pytest_moeperf.metrics.summary import failed_text, summarize
from pytest_moeperf.run.search import ProbeResult
from pytest_moeperf.server.process import VllmServer
from pytest_moeperf.spec.model import Slo

SLO = Slo(ttft_p99_ms=1000.0, tpot_p99_ms=100.0)


def test_failed_requests_are_counted_reported_and_slo_misses(serve: Serve) -> None:
    faults = {3: "http_500", 8: "cut", 13: "stall"}
    url, _ = serve(delay_s=0.005, faults=faults)
    # The first prompt id is the index: the server keys its faults by it.
    reqs = [RequestSpec(i, 0.02 * i, (i, 1, 2, 3), 8) for i in range(24)]
    run = run_load(url, "m", reqs, mode="poisson", target=50.0, request_timeout_s=1.0)
    by_index = {r.index: r for r in run.requests}
    assert len(run.requests) == 24, "a failed request vanished from the run"
    assert by_index[3].status == "http_error" and by_index[3].http_status == 500
    assert by_index[3].error is not None and "injected failure" in by_index[3].error
    assert by_index[8].status == "stream_cut" and by_index[8].output_tokens == 2
    assert by_index[13].status == "timeout" and "request_timeout_s=1" in str(by_index[13].error)
    assert all(r.ok for i, r in by_index.items() if i not in faults)

    s = summarize(run, SLO, warmup_s=0.0, cooldown_s=0.0)
    assert s.n_requests == 24 and s.n_ok == 21
    assert s.failed_by_status == {"http_error": 1, "stream_cut": 1, "timeout": 1}
    assert s.window.n_requests == 24 and s.window.n_failed == 3
    # Every request enters the latency percentiles; the failed ones as +inf.
    for stats in (s.ttft, s.e2el):
        assert stats.n == 24 and stats.n_inf == 3
        assert stats.p99_ms == math.inf and math.isfinite(stats.p50_ms)
    assert s.tpot.n_inf == 3
    assert s.slo_attainment == pytest.approx(21 / 24)
    assert not s.slo_met and "p99 ttft inf ms > 1000 ms" in s.slo_violations
    # The good requests alone would have met the SLO: the failures are what fail the probe.
    assert max(r.ttft_s or 0.0 for r in run.requests if r.ok) < 0.5
    probe = ProbeResult.from_summary(50.0, s)
    assert not probe.met and probe.summary["failed_by_status"] == s.failed_by_status
    assert failed_text(probe.summary) == ", 3 failed (http_error 1, stream_cut 1, timeout 1)"


def test_failed_text_is_empty_without_failures() -> None:
    assert failed_text({"failed_by_status": {}}) == ""


def test_vllm_rejects_an_overlong_prompt_as_a_counted_miss(cpu_server: VllmServer) -> None:
    """Real vLLM: a prompt beyond the shared server's --max-model-len gets HTTP 400; it must
    count as a miss."""
    args = cpu_server.config.args
    too_long = 2 * int(args[args.index("--max-model-len") + 1])
    reqs = [
        RequestSpec(0, 0.0, tuple(10 + (i % 500) for i in range(too_long)), 8),
        RequestSpec(1, 0.1, tuple(range(20, 36)), 8),
        RequestSpec(2, 0.2, tuple(range(40, 56)), 8),
    ]
    run = run_load(cpu_server.base_url, cpu_server.model_name, reqs, mode="poisson",
                   target=10.0, request_timeout_s=120.0)  # fmt: skip
    bad = run.requests[0]
    assert bad.status == "http_error" and bad.http_status == 400, bad
    assert bad.error is not None and bad.error.startswith("HTTP 400: ")
    assert [r.status for r in run.requests[1:]] == ["ok", "ok"]
    s = summarize(run, Slo(60_000.0, 10_000.0), warmup_s=0.0, cooldown_s=0.0)
    assert s.failed_by_status == {"http_error": 1} and s.n_ok == 2
    assert s.ttft.n == 3 and s.ttft.n_inf == 1 and s.ttft.p99_ms == math.inf
    assert s.slo_attainment == pytest.approx(2 / 3) and not s.slo_met
