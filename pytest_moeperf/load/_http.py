"""A minimal HTTP/1.1 + SSE protocol for one keep-alive connection to an OpenAI-style server.

Why hand-written: a general client (httpx, aiohttp) spends most of its time per read in layers
we do not need, and at 100+ concurrent streams that cost turns into queueing delay that shows up
as fake ITL. Here each read is timestamped first, then only the framing is parsed: content chunks
are recognised by the bytes ``"choices":[{`` without decoding JSON; only the rare usage or error
event is decoded.
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

from pytest_moeperf.load._exchange import Exchange, loop_stamps
from pytest_moeperf.load.records import RequestStatus

if TYPE_CHECKING:
    from collections.abc import Callable

_HEADERS, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _TRAILER = 0, 1, 2, 3, 4
_MAX_HEAD = 65536
_MAX_ERROR_BODY = 4096
_CHOICES = b'"choices":'


class Connection(asyncio.Protocol):
    """One TCP connection; ``release`` hands it back to the pool after a clean response."""

    def __init__(self, t0: float, release: Callable[[Connection], None]) -> None:
        self.t0 = t0
        self._release = release
        self._stamps = loop_stamps()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.served = 0
        self.ex: Exchange | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.phase = _HEADERS
        self.head = b""
        self.pending = b""
        self.sse = b""
        self.chunk_left = 0
        self.crlf_left = 0
        self.length_left = 0
        self.keep_alive = True
        self.status_code = 0
        self.got_bytes = False
        self.err_body = bytearray()

    # -- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        # First thing: the timestamp must not include our parsing.
        sel = self._stamps
        now = (sel.last if sel is not None else perf_counter()) - self.t0
        ex = self.ex
        if ex is None or ex.finished:
            return
        self.got_bytes = True
        if (
            self.phase == _CHUNKED
            and not (self.pending or self.chunk_left or self.crlf_left or self.sse)
            and self._fast_token(data, now, ex)
        ):
            return
        try:
            if self.phase == _CHUNKED:
                self._chunked(data, now)
            elif self.phase == _HEADERS:
                self._headers(data, now)
            elif self.phase == _LENGTH:
                self._length(data, now)
            elif self.phase == _TRAILER:
                self._trailer(data)
            else:
                self._body(data, now)
        except (ValueError, IndexError) as exc:
            self._fail("stream_cut", now, f"malformed HTTP response: {exc}")

    def _fast_token(self, data: bytes, now: float, ex: Exchange) -> bool:
        """The common read: exactly one chunk holding one content event. False: parse fully."""
        i = data.find(b"\r\n", 0, 10)
        if i <= 0:
            return False
        try:
            size = int(data[:i], 16)
        except ValueError:
            return False
        end = i + 2 + size
        if (
            size < 8
            or len(data) != end + 2
            or not data.endswith(b"\r\n")
            or data.find(b"\n\n", i + 2) != end - 2
            or not data.startswith(b"data: {", i + 2)
            or data.find(b'"choices":[{', i + 2, end) < 0
        ):
            return False
        rec = ex.record
        if rec.first_token_s is None:
            rec.first_token_s = now
        rec.token_times_s.append(now)
        if ex.texts is not None:
            ex.texts.append(data[i + 8 : end - 2])  # between "data: " and the blank line
        return True

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        ex = self.ex
        if ex is None or ex.finished:
            return
        now = perf_counter() - self.t0
        if self.phase == _UNTIL_CLOSE and self.status_code != 200:
            self._finish_error(now)
        elif ex.done_seen:
            ex.finish("ok", now)
        elif not self.got_bytes and ex.attempt_reused:
            ex.retry()
        else:
            why = f"{type(exc).__name__}: {exc}" if exc else "server closed the connection"
            ex.finish("stream_cut", now, f"stream ended without data: [DONE] ({why})")

    # -- request side --------------------------------------------------------------------------
    def start(self, ex: Exchange, payload: bytes, remaining_s: float, timeout_s: float) -> None:
        """Send one request; the caller has checked that the connection is open and idle.

        ``remaining_s`` is what is left of ``timeout_s`` (the request's limit) after connecting.
        """
        self._reset()
        self.ex = ex
        ex.attempt_reused = self.served > 0
        self.served += 1
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(remaining_s, self._on_timeout, timeout_s)
        self.transport.write(payload)

    def cancel(self, now: float) -> None:
        self._fail("cancelled", now, "cancelled: the run was aborted")

    def _on_timeout(self, timeout_s: float) -> None:
        self._timer = None
        ex = self.ex
        if ex is None or ex.finished:
            return
        now = perf_counter() - self.t0
        if ex.done_seen:  # answered in full; only the chunked terminator never came
            ex.finish("ok", now)
            self._drop()
            return
        self._fail("timeout", now, f"no complete response within request_timeout_s={timeout_s}")

    def _fail(self, status: RequestStatus, now: float, error: str) -> None:
        ex = self.ex
        if ex is not None:
            ex.finish(status, now, error)
        self._drop()

    def _drop(self) -> None:
        self._cancel_timer()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- response parsing ------------------------------------------------------------------------
    def _headers(self, data: bytes, now: float) -> None:
        head = self.head + data
        i = head.find(b"\r\n\r\n")
        if i < 0:
            if len(head) > _MAX_HEAD:
                raise ValueError("response headers longer than 64 KiB")
            self.head = head
            return
        lines = head[:i].decode("latin-1").split("\r\n")
        rest = head[i + 4 :]
        self.status_code = int(lines[0].split(" ", 2)[1])
        if 100 <= self.status_code < 200:  # interim response: parse what follows afresh
            self.head = b""
            if rest:
                self._headers(rest, now)
            return
        chunked, length = False, -1
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "transfer-encoding":
                chunked = "chunked" in value
            elif name == "content-length":
                length = int(value)
            elif name == "connection" and "close" in value:
                self.keep_alive = False
        if chunked:
            self.phase = _CHUNKED
        elif length >= 0:
            self.phase = _LENGTH
            self.length_left = length
        else:
            self.phase = _UNTIL_CLOSE
            self.keep_alive = False
        if self.phase == _LENGTH and length == 0:
            self._body_end(now)
        elif rest:
            self.data_received_body(rest, now)

    def data_received_body(self, data: bytes, now: float) -> None:
        if self.phase == _CHUNKED:
            self._chunked(data, now)
        elif self.phase == _LENGTH:
            self._length(data, now)
        else:
            self._body(data, now)

    def _length(self, data: bytes, now: float) -> None:
        if len(data) >= self.length_left:
            self._body(data[: self.length_left], now)
            self.length_left = 0
            self._body_end(now)
        else:
            self.length_left -= len(data)
            self._body(data, now)

    def _chunked(self, data: bytes, now: float) -> None:
        if self.pending:
            data = self.pending + data
            self.pending = b""
        pos, n = 0, len(data)
        while pos < n:
            if self.chunk_left:
                end = pos + self.chunk_left
                if end <= n:
                    piece = data[pos:end]
                    self.chunk_left = 0
                    self.crlf_left = 2
                    pos = end
                else:
                    piece = data[pos:]
                    self.chunk_left -= n - pos
                    pos = n
                self._body(piece, now)
                if self.ex is None or self.ex.finished:
                    return
            elif self.crlf_left:
                take = min(self.crlf_left, n - pos)
                pos += take
                self.crlf_left -= take
            else:
                i = data.find(b"\r\n", pos)
                if i < 0:
                    if n - pos > 1024:
                        raise ValueError("chunk-size line longer than 1 KiB")
                    self.pending = data[pos:]
                    return
                size = int(data[pos:i].split(b";", 1)[0], 16)
                pos = i + 2
                if size == 0:
                    self.phase = _TRAILER
                    self._trailer(data[pos:])
                    return
                self.chunk_left = size

    def _trailer(self, data: bytes) -> None:
        """After the last chunk: optional trailers, then an empty line ends the response."""
        buf = self.pending + data
        if buf.startswith(b"\r\n") or b"\r\n\r\n" in buf:
            self.pending = b""
            self._body_end(perf_counter() - self.t0)
        else:
            self.pending = buf

    def _body(self, piece: bytes, now: float) -> None:
        if self.status_code != 200:
            if len(self.err_body) < _MAX_ERROR_BODY:
                self.err_body += piece[: _MAX_ERROR_BODY - len(self.err_body)]
            return
        buf = self.sse + piece if self.sse else piece
        start = 0
        while True:
            j = buf.find(b"\n\n", start)
            if j < 0:
                break
            self._event(buf, start, j, now)
            start = j + 2
        self.sse = buf[start:] if start < len(buf) else b""

    def _event(self, buf: bytes, s: int, e: int, now: float) -> None:
        while s < e and buf[s] in b"\r\n":
            s += 1
        if buf.startswith(b"data: ", s):
            p = s + 6
        elif buf.startswith(b"data:", s):
            p = s + 5
        else:
            return  # SSE comment (keep-alive ping) or a field we do not use
        k = buf.find(_CHOICES, p, e)
        if k >= 0:
            q = k + 10
            while buf[q] == 32:
                q += 1
            if buf[q] == 91:  # '['
                q += 1
                while buf[q] == 32:
                    q += 1
                if buf[q] == 123:  # '{': a content chunk, i.e. one or more tokens
                    ex = self.ex
                    assert ex is not None
                    rec = ex.record
                    if rec.first_token_s is None:
                        rec.first_token_s = now
                    rec.token_times_s.append(now)
                    if ex.texts is not None:
                        ex.texts.append(bytes(buf[p:e]))
                    return
        elif buf.startswith(b"[DONE]", p):
            assert self.ex is not None
            self.ex.done_seen = True
            return
        self._slow_event(buf[p:e])

    def _slow_event(self, raw: bytes) -> None:
        """The usage chunk, an error event, or something else: decode the JSON."""
        ex = self.ex
        assert ex is not None
        try:
            obj: Any = json.loads(raw)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            ex.usage_tokens = usage["completion_tokens"]
        err = obj.get("error")
        if err is not None and ex.record.status == "ok":
            ex.record.status = "http_error"
            if isinstance(err, dict):
                code = err.get("code")
                ex.record.http_status = code if isinstance(code, int) else 200
                ex.record.error = f"error event in stream: {err.get('message', err)}"
            else:
                ex.record.http_status = 200
                ex.record.error = f"error event in stream: {err}"

    def _body_end(self, now: float) -> None:
        ex = self.ex
        assert ex is not None
        self._cancel_timer()
        if self.status_code != 200:
            self._finish_error(now)
        elif ex.done_seen:
            ex.finish("ok", now)
        else:
            ex.finish("stream_cut", now, "response ended without data: [DONE]")
        self.ex = None
        if self.keep_alive and not self.closed:
            self._release(self)
        else:
            self._drop()

    def _finish_error(self, now: float) -> None:
        ex = self.ex
        assert ex is not None
        ex.record.http_status = self.status_code
        text = self.err_body.decode("utf-8", "replace").strip()
        ex.finish("http_error", now, f"HTTP {self.status_code}: {text[:500]}")
