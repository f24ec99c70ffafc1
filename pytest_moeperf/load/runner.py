"""Run one load probe against a server: a Poisson schedule or a fixed concurrency.

Below a few hundred streamed tokens per millisecond one event loop is plenty, so small runs stay
in-process. Beyond that the work is spread over spawned worker processes, each with its own loop
and a shard of the requests; timestamps come from ``perf_counter`` (CLOCK_MONOTONIC, shared by
all processes) relative to one ``t0`` the parent hands out, so shards merge without skew.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any, Literal

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.client import parse_base_url
from pytest_moeperf.load.records import RequestRecord, RequestSpec, RunRecord

AbortCheck = Callable[[list[RequestRecord], float], "str | None"]
Progress = Callable[[int, int], None]

_SOURCE = "run_load()"
TICK_S = 0.1  # should_abort / on_progress cadence; the contract is "at least every 0.25 s"
START_MARGIN_S = 0.02
# Streamed tokens/s one worker process handles with headroom (see benchmarks/README.md).
TOKENS_PER_S_PER_WORKER = 20_000.0
SLOTS_PER_WORKER = 128


def default_workers(
    mode: str,
    concurrency: int | None,
    requests: Sequence[RequestSpec],
    target: float,
    cpus: int | None = None,
) -> int:
    """One process until one event loop would get busy; then one per share of the load.

    At most half the CPUs: the rest is for the parent, and often for the server itself.
    """
    cpus = max(1, (cpus or os.cpu_count() or 1) // 2)
    if mode == "concurrency":
        need = math.ceil((concurrency or 1) / SLOTS_PER_WORKER)
    else:
        arrivals = [s.arrival_s for s in requests]
        span = max(arrivals) if arrivals else 0.0
        mean_out = sum(s.max_tokens for s in requests) / max(1, len(requests))
        # The expected token rate when the server keeps up; a burst counts as one second.
        rate = len(requests) / span if span > 0 else float(len(requests))
        need = math.ceil(rate * mean_out / TOKENS_PER_S_PER_WORKER)
    return max(1, min(need, cpus, len(requests)))


def _validate(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    mode: str,
    concurrency: int | None,
    request_timeout_s: float,
    workers: int | None,
) -> None:
    parse_base_url(base_url, _SOURCE)
    if not isinstance(model, str) or not model:
        raise UsageError(
            _SOURCE, "model", model, "must be a non-empty str", "pass the served model name"
        )
    if mode not in ("poisson", "concurrency"):
        raise UsageError(
            _SOURCE, "mode", mode, "is not a load mode", "use 'poisson' or 'concurrency'"
        )
    if not requests:
        raise UsageError(
            _SOURCE, "requests", list(requests), "is empty", "pass at least one RequestSpec"
        )
    seen: set[int] = set()
    for spec in requests:
        if not isinstance(spec, RequestSpec):
            raise UsageError(
                _SOURCE, "requests[...]", spec, "is not a RequestSpec", "build RequestSpec items"
            )
        where = f"requests[index={spec.index}]"
        if spec.index in seen:
            raise UsageError(
                _SOURCE, f"{where}.index", spec.index, "is used twice", "give unique indices"
            )
        seen.add(spec.index)
        if not isinstance(spec.max_tokens, int) or spec.max_tokens < 1:
            raise UsageError(
                _SOURCE, f"{where}.max_tokens", spec.max_tokens, "must be >= 1", "ask >= 1 token"
            )
        if not spec.prompt_token_ids:
            raise UsageError(
                _SOURCE,
                f"{where}.prompt_token_ids",
                spec.prompt_token_ids,
                "is empty",
                "give at least one prompt token id",
            )
        if mode == "poisson" and not (math.isfinite(spec.arrival_s) and spec.arrival_s >= 0):
            raise UsageError(
                _SOURCE,
                f"{where}.arrival_s",
                spec.arrival_s,
                "must be a finite offset >= 0 in poisson mode",
                "build arrivals with arrival_offsets()",
            )
    if mode == "concurrency":
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise UsageError(
                _SOURCE,
                "concurrency",
                concurrency,
                "must be an int >= 1 in concurrency mode",
                "pass concurrency=N, the number of requests kept in flight",
            )
    elif concurrency is not None:
        raise UsageError(
            _SOURCE,
            "concurrency",
            concurrency,
            "is not used in poisson mode (open loop never waits for earlier requests)",
            "drop concurrency, or use mode='concurrency'",
        )
    if not (isinstance(request_timeout_s, (int, float)) and request_timeout_s > 0):
        raise UsageError(
            _SOURCE, "request_timeout_s", request_timeout_s, "must be > 0", "pass seconds, e.g. 600"
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise UsageError(
            _SOURCE, "workers", workers, "must be an int >= 1 or None", "leave it None for auto"
        )


class _Monitor:
    """Completed records plus the callbacks, ticked by whichever side runs the loop."""

    def __init__(self, total: int, should_abort: AbortCheck | None, on_progress: Progress | None):
        self.total = total
        self.completed: list[RequestRecord] = []
        self.should_abort = should_abort
        self.on_progress = on_progress
        self.reported = -1
        self.reason: str | None = None

    def progress(self) -> None:
        if self.on_progress is not None and len(self.completed) != self.reported:
            self.reported = len(self.completed)
            self.on_progress(self.reported, self.total)

    def tick(self, now_s: float) -> str | None:
        """Report progress, ask should_abort; the first reason given sticks."""
        self.progress()
        if self.reason is None and self.should_abort is not None:
            reason = self.should_abort(self.completed, now_s)
            if reason is not None:
                self.reason = str(reason)
        return self.reason


def _shards(
    requests: Sequence[RequestSpec], workers: int, concurrency: int | None
) -> list[tuple[list[RequestSpec], int]]:
    ordered = sorted(requests, key=lambda s: s.index)
    out = []
    for w in range(workers):
        slots = 0
        if concurrency is not None:
            slots = concurrency // workers + (1 if w < concurrency % workers else 0)
        out.append((ordered[w::workers], slots))
    return out


def _run_inprocess(cfg: object, mon: _Monitor) -> tuple[float, float]:
    from pytest_moeperf.load._worker import (
        DriveConfig,
        Driver,
        new_event_loop,
        quiet_gc,
        restore_gc,
    )

    assert isinstance(cfg, DriveConfig)
    import asyncio

    driver = Driver(cfg, 0.0, mon.completed.append)
    result: list[float] = []

    async def main() -> float:
        t0 = perf_counter() + START_MARGIN_S
        driver.set_t0(t0)
        result.append(t0)
        run = asyncio.ensure_future(driver.run())
        while not run.done():
            await asyncio.wait({run}, timeout=TICK_S)
            if not run.done() and mon.tick(perf_counter() - t0) is not None:
                driver.abort()
        return await run

    def go() -> None:
        loop = new_event_loop()
        try:
            result.append(loop.run_until_complete(main()))
        finally:
            _cancel_pending(loop)
            loop.close()

    old = quiet_gc()
    try:
        try:
            import asyncio

            asyncio.get_running_loop()
        except RuntimeError:
            go()
        else:  # called from inside a running loop: drive ours on a thread
            errors: list[BaseException] = []

            def target() -> None:
                try:
                    go()
                except BaseException as exc:
                    errors.append(exc)

            th = threading.Thread(target=target, name="moeperf-load")
            th.start()
            th.join()
            if errors:
                raise errors[0]
    finally:
        restore_gc(old)
    return result[0], result[1]


def _cancel_pending(loop: Any) -> None:
    """Cancel and reap the requests still in flight (Ctrl-C or SIGTERM mid-probe), as
    ``asyncio.run`` does: closing the loop over them printed "Task was destroyed but it is
    pending!" once per request."""
    import asyncio

    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not pending:
        return
    for t in pending:
        t.cancel()
    with contextlib.suppress(BaseException):
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


def _run_workers(cfgs: list[object], mon: _Monitor) -> tuple[float, float]:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from pytest_moeperf.load._worker import worker_main

    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    try:
        for cfg in cfgs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(child, cfg), daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            pipes.append(parent)
        for p in pipes:
            kind, value = p.recv()
            if kind == "error":
                raise RuntimeError(f"load worker failed while starting:\n{value}")
        t0 = perf_counter() + START_MARGIN_S
        for p in pipes:
            p.send(("go", t0))
        live = list(pipes)
        ends: list[float] = []
        aborted = False
        next_tick = perf_counter()
        while live:
            ready = wait(live, timeout=max(0.0, next_tick - perf_counter()))
            for p in [q for q in live if q in ready]:
                try:
                    kind, value = p.recv()
                except EOFError:
                    raise RuntimeError("a load worker died without reporting") from None
                if kind == "recs":
                    mon.completed.extend(value)
                elif kind == "done":
                    ends.append(value)
                    live.remove(p)
                else:
                    raise RuntimeError(f"load worker failed:\n{value}")
            if perf_counter() >= next_tick:
                next_tick = perf_counter() + TICK_S
                if live and not aborted and mon.tick(perf_counter() - t0) is not None:
                    aborted = True
                    for q in live:
                        q.send(("abort", mon.reason))
        return t0, max(ends)
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for p in pipes:
            p.close()


def run_load(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    *,
    mode: Literal["poisson", "concurrency"],
    concurrency: int | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
    target: float = 0.0,
    request_timeout_s: float = 600.0,
    workers: int | None = None,
    should_abort: AbortCheck | None = None,
    on_progress: Progress | None = None,
) -> RunRecord:
    """Send ``requests`` and record what happened to each one; never raises for I/O failures.

    ``burstiness``, ``seed`` and ``target`` only describe the run in the RunRecord (the schedule
    is already in ``arrival_s``); ``target`` defaults to ``concurrency`` in concurrency mode.
    After an abort, the records hold the finished and the cancelled requests; requests never
    sent have no record.
    """
    from pytest_moeperf.load._worker import DriveConfig

    _validate(base_url, model, requests, mode, concurrency, request_timeout_s, workers)
    if workers is None:
        workers = default_workers(mode, concurrency, requests, target)
    workers = min(workers, len(requests), concurrency or len(requests))
    mon = _Monitor(len(requests), should_abort, on_progress)
    cfgs: list[object] = [
        DriveConfig(base_url, model, mode, slots, float(request_timeout_s), shard)
        for shard, slots in _shards(requests, workers, concurrency)
    ]
    if workers == 1:
        t0, end_s = _run_inprocess(cfgs[0], mon)
    else:
        t0, end_s = _run_workers(cfgs, mon)
    t0_wall = time.time() - (perf_counter() - t0)  # the wall time that corresponds to t0
    records = sorted(mon.completed, key=lambda r: r.index)
    mon.progress()  # the final count; should_abort is only asked while the run goes on
    # A reason that came after the last request finished stopped nothing: not an abort.
    cut_short = len(records) < len(requests) or any(r.status == "cancelled" for r in records)
    reason = mon.reason if cut_short else None
    if target == 0.0 and mode == "concurrency" and concurrency is not None:
        target = float(concurrency)
    return RunRecord(
        mode=mode,
        target=float(target),
        burstiness=float(burstiness),
        seed=int(seed),
        duration_s=float(end_s),
        requests=records,
        t0_wall=t0_wall,
        aborted_early=reason is not None,
        abort_reason=reason,
    )
