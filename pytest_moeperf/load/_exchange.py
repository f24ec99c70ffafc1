"""What one streamed request needs besides the wire protocol: its state and the read timestamps.

Split from ``_http`` so the protocol module holds only the HTTP/1.1 + SSE framing.
"""

from __future__ import annotations

import asyncio
import selectors
from time import perf_counter

from pytest_moeperf.load.records import RequestRecord, RequestStatus


class StampingSelector(selectors.DefaultSelector):
    """Takes the time once, right after epoll returns, for every read of that loop iteration.

    With k sockets readable at once, a per-read timestamp would charge the last one for the
    k-1 reads handled before it (about 3 us each): at 128 streams that is 0.4 ms of fake
    latency. Stamping at the wake-up charges nobody; bytes that arrive while the iteration runs
    get a stamp at most one iteration early, instead of up to an iteration late.
    """

    last = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
        self.last = perf_counter()
        return ready


def loop_stamps() -> StampingSelector | None:
    """The running loop's stamping selector, if it has one (our stdlib loop, not uvloop)."""
    try:
        sel = getattr(asyncio.get_running_loop(), "_selector", None)
    except RuntimeError:  # built outside a loop (unit tests feeding bytes by hand)
        return None
    return sel if isinstance(sel, StampingSelector) else None


class Exchange:
    """One request on a connection: its record, the future the caller awaits, its state."""

    __slots__ = (
        "attempt_reused", "done_seen", "finished", "future", "record", "texts", "usage_tokens",
    )  # fmt: skip

    def __init__(
        self,
        record: RequestRecord,
        future: asyncio.Future[bool],
        texts: list[bytes] | None = None,
    ) -> None:
        self.record = record
        self.future = future
        # When a list is given, each content event's JSON (after "data: ") is kept, undecoded,
        # for callers that need the generated text (the accuracy task); load runs pass None.
        self.texts = texts
        self.finished = False
        self.done_seen = False
        self.usage_tokens: int | None = None
        self.attempt_reused = False

    def finish(self, status: RequestStatus, now: float, error: str | None = None) -> None:
        """Close the record once; later calls (a timeout racing a cut) are ignored."""
        if self.finished:
            return
        self.finished = True
        rec = self.record
        if rec.status == "ok":  # an error event seen mid-stream keeps its status
            rec.status = status
        if error is not None and rec.error is None:
            rec.error = error
        times = rec.token_times_s
        n = self.usage_tokens if self.usage_tokens is not None else len(times)
        if times and n > len(times):
            # The server packed several tokens into some chunks (stream interval, speculative
            # decoding); we cannot tell which, so the extra tokens take the last chunk's time.
            times.extend([times[-1]] * (n - len(times)))
        rec.output_tokens = n
        rec.end_s = times[-1] if (times and rec.status == "ok") else now
        if not self.future.done():
            self.future.set_result(True)

    def retry(self) -> None:
        """A reused keep-alive connection was closed by the server before answering."""
        self.finished = True
        if not self.future.done():
            self.future.set_result(False)
