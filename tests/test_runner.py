"""run_load: open-loop schedules, the concurrency cap, aborts, worker processes, validation."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest
from sse_helpers import Serve

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load._worker import drain
from pytest_moeperf.load.arrivals import arrival_offsets
from pytest_moeperf.load.records import RequestRecord, RequestSpec, RunRecord
from pytest_moeperf.load.runner import default_workers, run_load


def specs(n: int, n_out: int = 8, arrivals: list[float] | None = None) -> list[RequestSpec]:
    # The first prompt id is the index: the synthetic server keys its arrival log by it.
    arr = arrivals if arrivals is not None else [0.0] * n
    return [RequestSpec(i, arr[i], (i, 1, 2, 3), n_out) for i in range(n)]


# -- poisson (open loop)
def test_poisson_sends_never_earlier_than_scheduled(serve: Serve) -> None:
    url, srv = serve(delay_s=0.001)
    arr = arrival_offsets(30, 60.0, 1.0, seed=2)
    run = run_load(url, "m", specs(30, arrivals=arr), mode="poisson", seed=2, target=60.0)
    assert [r.status for r in run.requests] == ["ok"] * 30
    lags = [r.send_s - r.scheduled_s for r in run.requests]
    assert min(lags) >= 0.0
    assert max(lags) < 0.05  # a loaded CI box; typical lag is ~1 ms (timer resolution)
    assert [r.scheduled_s for r in run.requests] == arr
    # The server saw them in schedule order, spaced like the schedule.
    seen = sorted(srv.stats.arrivals.items(), key=lambda kv: kv[1])
    assert [k for k, _ in seen] == sorted(range(30), key=lambda i: (arr[i], i))
    span = seen[-1][1] - seen[0][1]
    assert span == pytest.approx(arr[-1] - arr[0], abs=0.05)
    assert run.target == 60.0 and run.seed == 2 and run.mode == "poisson"


def test_poisson_is_open_loop(serve: Serve) -> None:
    # Each request takes >= 0.4 s; ten arrive within 0.1 s: all ten must be in flight at once.
    url, srv = serve(delay_s=0.01)
    arr = [i * 0.01 for i in range(10)]
    run = run_load(url, "m", specs(10, n_out=40, arrivals=arr), mode="poisson")
    assert all(r.ok for r in run.requests)
    assert srv.stats.max_active == 10
    assert max(r.send_s for r in run.requests) < 0.3


def test_burst_at_time_zero(serve: Serve) -> None:
    url, srv = serve()
    run = run_load(url, "m", specs(20), mode="poisson")
    assert all(r.ok for r in run.requests)
    assert srv.stats.requests == 20


# -- concurrency (closed loop)
def test_concurrency_cap_is_respected_and_reached(serve: Serve) -> None:
    url, srv = serve(delay_s=0.002)
    run = run_load(url, "m", specs(24, n_out=10), mode="concurrency", concurrency=4)
    assert len(run.requests) == 24
    assert all(r.ok and r.output_tokens == 10 for r in run.requests)
    assert srv.stats.max_active == 4
    assert run.target == 4.0
    assert srv.stats.connections == 4  # kept alive and reused


def test_concurrency_mode_ignores_arrivals(serve: Serve) -> None:
    url, _ = serve()
    run = run_load(url, "m", specs(4, arrivals=[5.0] * 4), mode="concurrency", concurrency=4)
    assert run.duration_s < 2.0
    assert all(r.scheduled_s < 1.0 for r in run.requests)


def test_run_record_is_sorted_and_complete(serve: Serve) -> None:
    url, _ = serve()
    before = time.time()
    run = run_load(url, "m", specs(12), mode="concurrency", concurrency=3)
    assert [r.index for r in run.requests] == list(range(12))
    assert before - 1 <= run.t0_wall <= time.time()
    assert run.duration_s >= max(r.end_s or 0.0 for r in run.requests)
    assert not run.aborted_early and run.abort_reason is None
    assert RunRecord.from_dict(run.to_dict()) == run


def test_failures_are_records_not_exceptions() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    run = run_load(f"http://127.0.0.1:{port}", "m", specs(3), mode="concurrency", concurrency=2)
    assert [r.status for r in run.requests] == ["connect_error"] * 3


# -- abort and progress
def test_should_abort_cancels_in_flight_and_stops_sending(serve: Serve) -> None:
    url, srv = serve(delay_s=0.005)
    calls: list[tuple[int, float]] = []

    def should_abort(done: list[RequestRecord], now_s: float) -> str | None:
        calls.append((len(done), now_s))
        return "p99 TTFT already over the SLO" if len(done) >= 4 else None

    arr = [i * 0.02 for i in range(100)]  # 2 s of arrivals; each request ~0.1 s
    run = run_load(url, "m", specs(100, 20, arr), mode="poisson", should_abort=should_abort)
    assert run.aborted_early
    assert run.abort_reason == "p99 TTFT already over the SLO"
    assert len(run.requests) < 100  # never-sent requests have no record
    # A request cancelled while its bytes are on the wire may or may not be counted by the
    # server; every completed one was, and nothing without a record is sent after the abort.
    time.sleep(0.2)  # ten more arrivals would have been due by now
    ok = sum(r.status == "ok" for r in run.requests)
    assert ok <= srv.stats.requests <= len(run.requests)
    statuses = {r.status for r in run.requests}
    assert statuses == {"ok", "cancelled"}
    assert run.duration_s < 1.0
    cancelled = [r for r in run.requests if r.status == "cancelled"]
    assert all(r.end_s is not None and r.error for r in cancelled)


def _finishes_within(seconds: float, fn: Any) -> Any:
    """Run ``fn`` on a daemon thread; fail (instead of hanging the suite) if it does not return.

    A busy loop inside one event-loop step cannot be interrupted by asyncio's own timeouts.
    """
    out: list[Any] = []
    th = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"did not return within {seconds} s"
    return out[0]


def test_drain_returns_once_tasks_are_done_even_if_still_in_the_set() -> None:
    # What an abort leaves: tasks that finished in this loop iteration, whose "leave the set"
    # callbacks have not run. ``while tasks: await gather(*tasks)`` never ended here.
    async def main() -> int:
        async def one() -> int:
            return 1

        tasks = {asyncio.ensure_future(one()) for _ in range(3)}
        await asyncio.wait(tasks)
        await drain(tasks)  # type: ignore[arg-type]
        return len(tasks)

    assert _finishes_within(5.0, lambda: asyncio.run(main())) == 3


@pytest.mark.parametrize("abort_after", [3, 7, 12])
def test_poisson_abort_with_requests_in_flight_returns_promptly(
    serve: Serve, abort_after: int
) -> None:
    # The H200 case: an abort while ~5 requests stream at a few req/s (on Python 3.12 the
    # drain after it spun forever for most of these seeds).
    url, _ = serve(delay_s=0.01)
    arr = arrival_offsets(300, 8.0, 1.0, seed=1)

    def abort(done: list[RequestRecord], now_s: float) -> str | None:
        return "overload" if len(done) >= abort_after else None

    run = _finishes_within(
        20.0,
        lambda: run_load(url, "m", specs(300, 128, arr), mode="poisson", should_abort=abort),
    )
    assert run.aborted_early and run.abort_reason == "overload"
    assert sum(r.status == "ok" for r in run.requests) >= abort_after
    assert {r.status for r in run.requests} <= {"ok", "cancelled"}
    assert run.duration_s < 10.0  # about abort_after / 8 s of sending, then the cancels


def test_should_abort_is_called_at_least_every_quarter_second(serve: Serve) -> None:
    url, _ = serve(delay_s=0.01)
    times: list[float] = []

    def watch(done: list[RequestRecord], now_s: float) -> None:
        times.append(now_s)

    run_load(url, "m", specs(8, n_out=80), mode="concurrency", concurrency=8, should_abort=watch)
    assert len(times) >= 3
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert max(gaps) <= 0.25


def test_should_abort_sees_records_while_running(serve: Serve) -> None:
    url, _ = serve(delay_s=0.002)
    seen: list[int] = []

    def watch(done: list[RequestRecord], now_s: float) -> None:
        seen.append(len(done))

    run_load(url, "m", specs(40, n_out=20), mode="concurrency", concurrency=2, should_abort=watch)
    assert any(0 < k < 40 for k in seen)


def test_on_progress_ends_with_the_total(serve: Serve) -> None:
    url, _ = serve()
    prog: list[tuple[int, int]] = []
    run_load(
        url,
        "m",
        specs(6),
        mode="concurrency",
        concurrency=2,
        on_progress=lambda d, t: prog.append((d, t)),
    )
    assert prog[-1] == (6, 6)
    assert all(t == 6 for _, t in prog)


def test_abort_after_the_last_request_is_not_an_abort(serve: Serve) -> None:
    url, _ = serve()
    run = run_load(
        url,
        "m",
        specs(2),
        mode="concurrency",
        concurrency=2,
        should_abort=lambda d, t: "late" if len(d) == 2 else None,
    )
    assert all(r.ok for r in run.requests)


def test_runs_inside_a_running_event_loop(serve: Serve) -> None:
    url, _ = serve()

    async def inside() -> RunRecord:
        return run_load(url, "m", specs(3), mode="concurrency", concurrency=3)

    run = asyncio.run(inside())
    assert all(r.ok for r in run.requests)


# -- worker processes
def test_workers_split_concurrency_and_merge_records(serve: Serve) -> None:
    url, srv = serve(delay_s=0.002)
    run = run_load(url, "m", specs(30, n_out=12), mode="concurrency", concurrency=6, workers=2)
    assert [r.index for r in run.requests] == list(range(30))
    assert all(r.ok and r.output_tokens == 12 and len(r.token_times_s) == 12 for r in run.requests)
    assert srv.stats.max_active <= 6
    # Both shards share one clock: every record lies inside the run.
    assert all(0.0 <= r.send_s <= (r.end_s or 0.0) <= run.duration_s for r in run.requests)


def test_workers_keep_the_poisson_schedule(serve: Serve) -> None:
    url, srv = serve(delay_s=0.001)
    arr = arrival_offsets(20, 50.0, 1.0, seed=4)
    run = run_load(url, "m", specs(20, arrivals=arr), mode="poisson", workers=2)
    lags = [r.send_s - r.scheduled_s for r in run.requests]
    assert all(r.ok for r in run.requests)
    assert min(lags) >= 0.0 and max(lags) < 0.05
    first = min(srv.stats.arrivals.values())
    for i, t in srv.stats.arrivals.items():  # the server's clock agrees with the schedule
        assert (t - first) == pytest.approx(arr[i] - arr[0], abs=0.05)


def test_workers_abort(serve: Serve) -> None:
    url, srv = serve(delay_s=0.005)

    def stop(done: list[RequestRecord], now_s: float) -> str | None:
        return "enough" if now_s > 0.3 else None

    arr = [i * 0.02 for i in range(100)]
    run = run_load(url, "m", specs(100, 20, arr), mode="poisson", workers=2, should_abort=stop)
    assert run.aborted_early and run.abort_reason == "enough"
    assert len(run.requests) < 60
    assert "cancelled" in {r.status for r in run.requests}
    assert srv.stats.requests == len(run.requests)


# -- default worker count
def test_default_workers_is_one_for_small_runs() -> None:
    assert default_workers("concurrency", 64, specs(64), 0.0, cpus=16) == 1
    assert default_workers("poisson", None, specs(10, arrivals=[1.0] * 10), 0.0, cpus=16) == 1


def test_default_workers_grows_with_load_and_is_capped_by_cpus() -> None:
    assert default_workers("concurrency", 512, specs(1024), 0.0, cpus=16) == 4
    assert default_workers("concurrency", 512, specs(1024), 0.0, cpus=4) == 2
    heavy = specs(1000, n_out=1000, arrivals=[i / 100 for i in range(1000)])  # 100k tok/s
    assert default_workers("poisson", None, heavy, 100.0, cpus=16) > 1


# -- misuse
def _bad(what: str, **kw: Any) -> UsageError:
    args: dict[str, Any] = {"base_url": "http://127.0.0.1:1", "model": "m", "requests": specs(2)}
    args.update(mode="concurrency", concurrency=2)
    args.update(kw)
    with pytest.raises(UsageError) as info:
        run_load(**args)
    assert info.value.source == "run_load()"
    assert info.value.what == what
    assert "Fix:" in str(info.value)
    return info.value


def test_unknown_mode() -> None:
    _bad("mode", mode="closed")


def test_concurrency_mode_needs_concurrency() -> None:
    _bad("concurrency", concurrency=None)


def test_zero_concurrency() -> None:
    _bad("concurrency", concurrency=0)


def test_concurrency_in_poisson_mode() -> None:
    _bad("concurrency", mode="poisson", concurrency=8)


def test_empty_requests() -> None:
    _bad("requests", requests=[])


def test_not_a_request_spec() -> None:
    _bad("requests[...]", requests=[{"index": 0}])


def test_duplicate_index() -> None:
    _bad("requests[index=0].index", requests=[specs(1)[0], specs(1)[0]])


def test_zero_max_tokens() -> None:
    _bad("requests[index=0].max_tokens", requests=[RequestSpec(0, 0.0, (1,), 0)])


def test_empty_prompt() -> None:
    _bad("requests[index=0].prompt_token_ids", requests=[RequestSpec(0, 0.0, (), 4)])


def test_negative_arrival_in_poisson_mode() -> None:
    req = [RequestSpec(0, -1.0, (1,), 4)]
    _bad("requests[index=0].arrival_s", mode="poisson", concurrency=None, requests=req)


def test_nonpositive_timeout() -> None:
    _bad("request_timeout_s", request_timeout_s=0)


def test_zero_workers() -> None:
    _bad("workers", workers=0)


def test_bad_base_url() -> None:
    _bad("base_url", base_url="127.0.0.1:8000")


def test_empty_model() -> None:
    _bad("model", model="")


def test_ctrl_c_mid_probe_reaps_the_requests_in_flight(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """KeyboardInterrupt (Ctrl-C; the plugin turns SIGTERM into one) propagates, and the loop is
    closed over no pending request: a SIGTERM mid-probe printed "Task was destroyed but it is
    pending!" once per request in flight."""
    import gc

    url, _ = serve(delay_s=0.01)

    def interrupt(done: list[RequestRecord], now_s: float) -> str | None:
        if now_s > 0.3:
            raise KeyboardInterrupt
        return None

    arr = [i * 0.01 for i in range(200)]
    with pytest.raises(KeyboardInterrupt):
        run_load(url, "m", specs(200, 40, arr), mode="poisson", should_abort=interrupt)
    gc.collect()
    destroyed = [r for r in caplog.records if "Task was destroyed" in r.getMessage()]
    assert not destroyed, f"{len(destroyed)} requests left pending"
