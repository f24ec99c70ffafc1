"""summarize(): vLLM metric definitions, the steady-state window, failures as SLO misses."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.records import RequestRecord, RunRecord
from pytest_moeperf.metrics.summary import (
    LatencyStats,
    LoadSummary,
    percentile,
    request_meets_slo,
    steady_window,
    summarize,
)
from pytest_moeperf.spec.model import Slo

SLO = Slo(ttft_p99_ms=500.0, tpot_p99_ms=50.0)


def rec(i: int, send: float, ttft: float, gaps: list[float], status: str = "ok") -> RequestRecord:
    """A streamed request: first token after ``ttft``, then one chunk per gap (one token each)."""
    times = [send + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    ok = status == "ok"
    return RequestRecord(
        index=i, scheduled_s=send, send_s=send, input_tokens=16, max_tokens=len(times),
        status=status,  # type: ignore[arg-type]
        first_token_s=times[0] if ok else None, end_s=times[-1] if ok else None,
        output_tokens=len(times) if ok else 0, token_times_s=times if ok else [],
    )  # fmt: skip


def run_of(reqs: list[RequestRecord], **kw: object) -> RunRecord:
    return RunRecord("poisson", 1.0, 1.0, 0, 10.0, reqs, 0.0, **kw)  # type: ignore[arg-type]


def test_percentile_matches_numpy_linear_on_finite_values() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 333):
        vals = sorted(rng.exponential(size=n).tolist())
        for q in (0, 50, 90, 99, 100):
            assert percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))


def test_percentile_with_inf_is_inf_only_when_interpolating_towards_it() -> None:
    vals = [1.0] * 99 + [math.inf]
    assert percentile(vals, 99) == math.inf  # 0.01 weight on +inf
    assert percentile([1.0, 2.0, math.inf], 50) == 2.0  # weight 0: the value itself, not nan
    assert math.isnan(percentile([], 50))


def test_vllm_definitions_of_ttft_tpot_itl_e2el() -> None:
    r = rec(0, 0.0, 0.2, [0.01, 0.03])  # 3 tokens: e2el 0.24, tpot (0.24-0.2)/2 = 0.02
    s = summarize(run_of([r, rec(1, 1.0, 0.2, [0.01, 0.03])]), SLO, warmup_s=0, cooldown_s=0)
    assert s.ttft.p50_ms == pytest.approx(200.0)
    assert s.e2el.p50_ms == pytest.approx(240.0)
    assert s.tpot.p50_ms == pytest.approx(20.0)
    assert s.itl.n == 4 and s.itl.p50_ms == pytest.approx(20.0)  # gaps 10,30,10,30 ms
    assert s.slo_met and s.slo_attainment == 1.0


def test_multi_token_chunks_form_one_itl_gap() -> None:
    r = rec(0, 0.0, 0.1, [0.0, 0.0, 0.05])  # 3 tokens in the first chunk, then one more
    s = summarize(run_of([r, rec(1, 0.5, 0.1, [0.05])]), SLO, warmup_s=0, cooldown_s=0)
    assert s.itl.n == 2 and s.itl.p50_ms == pytest.approx(50.0)
    assert s.tpot.n == 2


def test_one_token_outputs_have_no_tpot_but_meet_the_slo() -> None:
    reqs = [rec(i, float(i), 0.1, []) for i in range(3)]
    s = summarize(run_of(reqs), SLO, warmup_s=0, cooldown_s=0)
    assert s.tpot.n == 0 and s.slo_met and s.slo_attainment == 1.0
    assert all(request_meets_slo(r, SLO) for r in reqs)


def test_window_excludes_ramp_up_and_drain() -> None:
    slow = [rec(i, i * 0.1, 2.0, [0.01]) for i in range(5)]  # ramp-up: slow first requests
    steady = [rec(5 + i, 0.5 + i * 0.1, 0.1, [0.01]) for i in range(50)]
    drain = [rec(55 + i, 5.5 + i * 0.1, 0.1, [0.01]) for i in range(5)]
    run = run_of(slow + steady + drain)
    whole = summarize(run, SLO, warmup_s=0, cooldown_s=0)
    cut = summarize(run, SLO, warmup_s=0.5, cooldown_s=0.5)
    assert not whole.slo_met and whole.ttft.p99_ms > 1000
    assert cut.slo_met and cut.ttft.p99_ms == pytest.approx(100.0)
    assert cut.window.start_s == pytest.approx(0.5) and cut.window.end_s == pytest.approx(5.4)
    assert cut.window.n_requests == 50 and cut.n_requests == 60


def test_throughputs_count_what_happened_inside_the_window() -> None:
    # one request per 0.1 s, 2 tokens each 10 ms apart, ttft 50 ms: 20 tok/s, 10 req/s
    reqs = [rec(i, i * 0.1, 0.05, [0.01]) for i in range(101)]
    s = summarize(run_of(reqs), SLO, warmup_s=1.0, cooldown_s=1.0)
    assert s.window.length_s == pytest.approx(8.0)
    assert s.output_tok_s == pytest.approx(20.0, rel=0.02)
    assert s.request_throughput == pytest.approx(10.0, rel=0.02)
    assert s.request_goodput == pytest.approx(s.request_throughput)
    assert s.token_goodput_tok_s == pytest.approx(s.output_tok_s)


def test_failed_requests_are_counted_and_push_p99_to_inf() -> None:
    reqs = [rec(i, i * 0.1, 0.1, [0.01]) for i in range(98)]
    reqs += [rec(98, 9.8, 0.1, [], status="timeout"), rec(99, 9.9, 0.1, [], status="http_error")]
    s = summarize(run_of(reqs), SLO, warmup_s=0, cooldown_s=0)
    assert s.failed_by_status == {"http_error": 1, "timeout": 1} and s.n_failed == 2
    assert s.n_ok == 98 and s.window.n_failed == 2
    assert s.ttft.p99_ms == math.inf and s.ttft.n_inf == 2
    assert s.ttft.mean_ms == pytest.approx(100.0)  # means over successful requests
    assert not s.slo_met and any("ttft" in v for v in s.slo_violations)
    assert s.slo_attainment == pytest.approx(0.98)


def test_goodput_drops_requests_that_miss_any_slo() -> None:
    fast = [rec(i, i * 0.1, 0.1, [0.01]) for i in range(50)]
    slow_tpot = [rec(50 + i, 5.0 + i * 0.1, 0.1, [0.2]) for i in range(50)]
    s = summarize(run_of(fast + slow_tpot), SLO, warmup_s=0, cooldown_s=0)
    assert s.slo_attainment == pytest.approx(0.5)
    assert s.request_goodput < s.request_throughput
    assert not s.slo_met and any("tpot" in v for v in s.slo_violations)


def test_e2el_slo_is_checked_when_given() -> None:
    slo = Slo(500.0, 50.0, e2el_p99_ms=100.0)
    reqs = [rec(i, i * 0.1, 0.09, [0.02]) for i in range(10)]  # e2el 110 ms
    s = summarize(run_of(reqs), slo, warmup_s=0, cooldown_s=0)
    assert not s.slo_met and s.slo_attainment == 0.0 and "e2el" in s.slo_violations[0]


def test_aborted_run_is_not_met_and_keeps_the_reason() -> None:
    reqs = [rec(i, i * 0.1, 0.1, [0.01]) for i in range(10)]
    s = summarize(run_of(reqs, aborted_early=True, abort_reason="overload"), SLO,
                  warmup_s=0, cooldown_s=0)  # fmt: skip
    assert s.aborted_early and s.abort_reason == "overload" and not s.slo_met


def test_ok_request_without_tokens_counts_as_inf_and_is_noted() -> None:
    reqs = [rec(i, i * 0.1, 0.1, [0.01]) for i in range(5)]
    reqs.append(RequestRecord(5, 0.55, 0.55, 8, 4, "ok"))
    s = summarize(run_of(reqs), SLO, warmup_s=0, cooldown_s=0)
    assert s.ttft.n_inf == 1 and s.notes and "no token" in s.notes[0]


def test_to_dict_is_json_and_round_trips() -> None:
    reqs = [rec(i, i * 0.1, 0.1, [0.01]) for i in range(10)]
    reqs.append(rec(10, 0.45, 0.1, [], status="cancelled"))
    s = summarize(run_of(reqs), SLO, warmup_s=0.1, cooldown_s=0.1)
    d = s.to_dict()
    text = json.dumps(d)
    back = LoadSummary.from_dict(json.loads(text))
    assert back == s
    assert d["ttft"]["p99_ms"] == math.inf and d["window"]["length_s"] == s.window.length_s


def test_latency_stats_of_empty_is_nan_not_zero() -> None:
    st = LatencyStats.of([])
    assert st.n == 0 and math.isnan(st.p99_ms) and math.isnan(st.mean_ms)


def test_empty_run_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        summarize(run_of([]), SLO, warmup_s=0, cooldown_s=0)
    assert info.value.what == "run.requests"


def test_window_left_empty_by_warmup_is_a_usage_error() -> None:
    reqs = [rec(i, i * 0.1, 0.1, [0.01]) for i in range(10)]
    with pytest.raises(UsageError) as info:
        summarize(run_of(reqs), SLO, warmup_s=0.5, cooldown_s=0.5)
    assert info.value.what == "window" and "warmup" in info.value.fix


def test_negative_warmup_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        steady_window([rec(0, 0.0, 0.1, [])], -1.0, 0.0)


def test_single_request_run_has_no_window() -> None:
    with pytest.raises(UsageError):
        summarize(run_of([rec(0, 0.0, 0.1, [0.01])]), SLO, warmup_s=0, cooldown_s=0)


def test_command_line_names_pytest_for_python_m_runs() -> None:
    from pytest_moeperf.session import command_line

    assert command_line(["/x/lib/pytest/__main__.py", "perf_tests", "--gpu"]) == (
        "pytest perf_tests --gpu"
    )
    assert command_line(["/venv/bin/pytest", "-k", "ab"]) == "pytest -k ab"
    assert command_line(["moeperf", "compare"]) == "moeperf compare"


def test_sent_tokens_count_the_window_s_sends_not_the_queue_at_its_edges() -> None:
    """A backlog sent before the window finishing inside it adds to output_tok_s, not to
    sent_tok_s; requests sent inside but finishing after the window still count there."""
    steady = [rec(i, 1.0 + i * 0.1, 0.05, [0.01]) for i in range(81)]  # 10 req/s, 2 tokens each
    backlog = [rec(100 + i, 0.0 + i * 0.01, 1.5, [0.01]) for i in range(20)]  # done at ~1.5-1.7 s
    late = [rec(200 + i, 8.5 + i * 0.01, 3.0, [0.01]) for i in range(5)]  # done after the window
    s = summarize(run_of(steady + backlog + late), SLO, warmup_s=1.0, cooldown_s=0.5)
    start, end = s.window.start_s, s.window.end_s
    assert (start, end) == (pytest.approx(1.0), pytest.approx(8.5))
    sent = [r for r in steady + backlog + late if start <= r.send_s <= end]
    assert s.sent_tok_s == pytest.approx(sum(r.output_tokens for r in sent) / (end - start))
    assert s.output_tok_s > s.sent_tok_s + 3  # the backlog's 40 tokens land in the window
    assert LoadSummary.from_dict(json.loads(json.dumps(s.to_dict()))).sent_tok_s == s.sent_tok_s
    old = {k: v for k, v in s.to_dict().items() if k != "sent_tok_s"}
    assert math.isnan(LoadSummary.from_dict(old).sent_tok_s)  # recorded before it existed


def test_command_line_keeps_the_quotes_a_shell_needs() -> None:
    """Recorded H200 commands lost the quotes of ``-k "a or b"`` and of the reason text."""
    import shlex

    from pytest_moeperf.session import command_line

    argv = ["/v/bin/pytest", "-k", "h200_fixed_in_tree or h200_fixed_fp8_in_tree",
            "--moeperf-reason", "first H200 baselines (issue 16): 3 runs"]  # fmt: skip
    line = command_line(argv)
    assert shlex.split(line) == ["pytest", *argv[1:]]


def test_tokens_per_chunk_and_the_clients_send_lag_are_recorded() -> None:
    # two requests of 4 tokens: one streamed token by token, one read late in 2 chunks
    a = rec(0, 0.0, 0.1, [0.01, 0.01, 0.01])
    b = rec(1, 1.0, 0.1, [0.01, 0.01, 0.01])
    b.token_times_s = [1.1, 1.1, 1.13, 1.13]
    b.scheduled_s = 0.99  # sent 10 ms late
    s = summarize(run_of([a, b]), SLO, warmup_s=0.0, cooldown_s=0.0)
    assert s.tokens_per_chunk == pytest.approx(8 / 6)
    assert 0.0 < s.send_lag_p99_ms <= 10.0 + 1e-6
    back = LoadSummary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.tokens_per_chunk == s.tokens_per_chunk
