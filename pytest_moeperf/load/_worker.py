"""The load driver on one event loop, and the entry point of a load worker process.

A worker owns a shard of the requests (every W-th index) and, in concurrency mode, a share of
the in-flight slots. Finished records go to the parent in small batches while the run goes on,
so the parent's ``should_abort`` sees them without waiting for the end of the run.
"""

from __future__ import annotations

import asyncio
import gc
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Literal

from pytest_moeperf.load._exchange import StampingSelector
from pytest_moeperf.load.client import StreamingClient
from pytest_moeperf.load.records import RequestRecord, RequestSpec

if TYPE_CHECKING:
    from multiprocessing.connection import Connection as Pipe

FLUSH_INTERVAL_S = 0.05


@dataclass
class DriveConfig:
    """What one driver needs; crosses the process boundary, so plain data only."""

    base_url: str
    model: str
    mode: Literal["poisson", "concurrency"]
    slots: int  # in-flight cap of this driver in concurrency mode, unused for poisson
    request_timeout_s: float
    specs: list[RequestSpec]


def new_event_loop(kind: str | None = None) -> asyncio.AbstractEventLoop:
    """The loop a load run uses: ``stamping`` (default) or ``uvloop``; env MOEPERF_LOOP.

    ``stamping`` is the stdlib loop with a selector that timestamps each wake-up (see
    StampingSelector): the most accurate token times. ``uvloop`` reads a little cheaper but
    cannot be hooked, so each read is stamped when its callback runs.
    """
    kind = kind or os.environ.get("MOEPERF_LOOP", "stamping")
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.SelectorEventLoop(StampingSelector())


async def sleep_until(t_abs: float) -> None:
    """Sleep to an absolute perf_counter time, never returning early (timers can fire early)."""
    while True:
        d = t_abs - perf_counter()
        if d <= 0:
            return
        await asyncio.sleep(d)


class Driver:
    """Sends one shard of a run: on schedule (poisson) or with a fixed number in flight."""

    def __init__(
        self, cfg: DriveConfig, t0: float, on_record: Callable[[RequestRecord], None]
    ) -> None:
        self.cfg = cfg
        self.on_record = on_record
        self.aborted = False
        self.client = StreamingClient(
            cfg.base_url, cfg.model, t0=t0, request_timeout_s=cfg.request_timeout_s
        )
        specs = cfg.specs
        if cfg.mode == "poisson":
            specs = sorted(specs, key=lambda s: (s.arrival_s, s.index))
        self.specs = specs
        self.payloads = [self.client.prepare(s) for s in specs]  # before t0, not on the clock
        self._scheduler: asyncio.Task[None] | None = None

    def set_t0(self, t0: float) -> None:
        self.client.t0 = t0

    def abort(self) -> None:
        """Stop sending and cancel what is in flight; cancelled records still get reported."""
        if self.aborted:
            return
        self.aborted = True
        if self._scheduler is not None:
            self._scheduler.cancel()
        self.client.cancel_all()

    async def run(self) -> float:
        """Run the shard; returns the time (relative to t0) when the last request ended."""
        t0 = self.client.t0
        await sleep_until(t0)
        try:
            if self.cfg.mode == "poisson":
                await self._poisson(t0)
            else:
                await self._concurrency(t0)
        finally:
            self.client.close()
        return perf_counter() - t0

    async def _poisson(self, t0: float) -> None:
        tasks: set[asyncio.Task[RequestRecord]] = set()
        done_cb = self._task_done
        loop = asyncio.get_running_loop()

        async def schedule() -> None:
            for spec, payload in zip(self.specs, self.payloads, strict=False):
                await sleep_until(t0 + spec.arrival_s)
                if self.aborted:
                    return
                task = loop.create_task(self.client.send(spec, spec.arrival_s, payload))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(done_cb)

        self._scheduler = loop.create_task(schedule())
        try:
            await self._scheduler
        except asyncio.CancelledError:
            if not self.aborted:
                raise
        await drain(tasks)

    def _task_done(self, task: asyncio.Task[RequestRecord]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.on_record(task.result())

    async def _concurrency(self, t0: float) -> None:
        it = iter(zip(self.specs, self.payloads, strict=False))

        async def slot() -> None:
            for spec, payload in it:
                if self.aborted:
                    return
                rec = await self.client.send(spec, perf_counter() - t0, payload)
                self.on_record(rec)

        await asyncio.gather(*(slot() for _ in range(max(1, self.cfg.slots))))


async def drain(tasks: set[asyncio.Task[RequestRecord]]) -> None:
    """Wait until every task in ``tasks`` is done, whether or not it has left the set yet.

    Not ``while tasks: await gather(*tasks)``: a finished task leaves the set in a done callback
    that runs on a later loop iteration, and since Python 3.12 ``gather`` of tasks that are all
    done returns an already-finished future, so that ``await`` never yields and the callbacks
    never run. On the H200 (Python 3.12) an aborted probe spun there for 15 minutes.
    """
    while pending := {t for t in tasks if not t.done()}:
        await asyncio.wait(pending)
    await asyncio.sleep(0)  # one iteration: the done callbacks (records) of the last ones run


def quiet_gc() -> tuple[int, int, int]:
    """Move existing objects out of the collector's sight and collect young ones less often.

    A full collection over a big heap (a pytest session) pauses the loop for milliseconds, and
    every pause is added to whichever token arrives meanwhile.
    """
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    return old


def restore_gc(old: tuple[int, int, int]) -> None:
    gc.set_threshold(*old)
    gc.unfreeze()


def worker_main(pipe: Pipe, cfg: DriveConfig) -> None:
    """Process entry point. Messages: -> ready, <- go t0 | abort, -> recs..., -> done | error."""
    try:
        _worker(pipe, cfg)
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
    finally:
        pipe.close()


def _worker(pipe: Pipe, cfg: DriveConfig) -> None:
    batch: list[RequestRecord] = []
    driver = Driver(cfg, 0.0, batch.append)
    quiet_gc()
    pipe.send(("ready", None))
    kind, value = pipe.recv()
    if kind != "go":  # aborted before the start: nothing was sent
        pipe.send(("done", 0.0))
        return
    assert isinstance(value, float)
    driver.set_t0(value)
    loop = new_event_loop()

    def on_message() -> None:
        try:
            msg_kind, _ = pipe.recv()
        except EOFError:  # the parent went away: stop like an abort
            msg_kind = "abort"
        if msg_kind == "abort":
            loop.remove_reader(pipe.fileno())
            driver.abort()

    def flush() -> None:
        if batch:
            pipe.send(("recs", batch[:]))
            batch.clear()

    async def flusher() -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            flush()

    async def main() -> float:
        loop.add_reader(pipe.fileno(), on_message)
        ft = loop.create_task(flusher())
        try:
            return await driver.run()
        finally:
            ft.cancel()
            loop.remove_reader(pipe.fileno())

    try:
        end_s = loop.run_until_complete(main())
    finally:
        loop.close()
    flush()
    pipe.send(("done", end_s))
