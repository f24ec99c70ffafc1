"""A synthetic OpenAI ``/v1/completions`` streaming server, fast enough to find client limits.

It speaks the SSE framing vLLM's API server emits (chunked transfer encoding, one
``data: {...}\\n\\n`` event per chunk, the usage chunk, then ``data: [DONE]``) with the same chunk
JSON, but produces tokens from pre-encoded bytes. Like a real engine it decodes in steps: each
step gives every active stream one token, then waits ``delay_s`` (0: just yields to the loop).
Streams whose socket buffer is full skip a step, as uvicorn honours back-pressure.

Faults for tests: an HTTP error status, a connection cut after k tokens, a stall after k tokens
(for every request, or for chosen ones),
several tokens per chunk, and closing idle keep-alive connections. ``/stats`` reports what it saw.

Run standalone: ``python benchmarks/sse_server.py --port 0 [--delay-ms 10] [--stamp]``; it
prints ``PORT <n>`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

_OK_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


# What vLLM streams when generation fails mid-way (json.dumps of an ErrorResponse).
_ERROR_EVENT = _chunk(
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\n'
)
_DONE = _chunk(b"data: [DONE]\n\n")


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class ServerConfig:
    delay_s: float = 0.0  # between decode steps
    fail_status: int | None = None  # answer every completion with this HTTP status
    cut_after: int | None = None  # close the connection after this many tokens
    stall_after: int | None = None  # stop sending (connection stays open) after this many
    error_after: int | None = None  # after this many tokens send vLLM's error event, then [DONE]
    tokens_per_chunk: int = 1  # >1: fewer content chunks than tokens, as with stream intervals
    stamp: bool = False  # record perf_counter() of every token write, for overhead measurement
    idle_close_s: float | None = None  # close keep-alive connections idle this long
    # Faults for single requests, keyed by the first prompt id: "http_500" (answered with a
    # 500), "cut" (connection closed after 2 tokens), "stall" (silent after 2 tokens).
    faults: dict[int, str] = field(default_factory=dict)
    # A capacity, like an engine's max-num-seqs: streams beyond this many wait, first come first
    # served, without tokens. None: every stream runs.
    max_running: int | None = None
    # Serve vLLM-style Prometheus gauges and counters on /metrics (running, waiting, and the
    # prefix-cache counters, with every prompt a miss).
    metrics: bool = False


@dataclass
class Stats:
    requests: int = 0
    active: int = 0
    max_active: int = 0
    connections: int = 0
    arrivals: dict[int, float] = field(default_factory=dict)  # first prompt id -> perf_counter
    stamps: dict[int, list[float]] = field(default_factory=dict)  # first prompt id -> writes
    prompt_tokens: int = 0


class _Stream:
    __slots__ = ("conn", "fault", "key", "last", "left", "mid", "sent", "stamps", "usage")

    def __init__(self, conn: _Conn, key: int, n_tokens: int, n_prompt: int, model: str) -> None:
        self.conn = conn
        self.key = key
        self.sent = 0
        self.fault = conn.server.config.faults.get(key)
        self.stamps: list[float] | None = None
        rid = f"cmpl-{key:032x}"
        created = int(time.time())

        def tok(finish: str | None) -> bytes:
            choice = {"index": 0, "text": " hi", "logprobs": None, "finish_reason": finish}
            choice.update(stop_reason=None, prompt_token_ids=None, token_ids=None)
            obj = {"id": rid, "object": "text_completion", "created": created, "model": model}
            obj["choices"] = [choice]
            return _chunk(_event(obj))

        self.left = n_tokens
        self.mid, self.last = tok(None), tok("length")
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_tokens}
        usage["completion_tokens"] = n_tokens
        obj = {"id": rid, "object": "text_completion", "created": created, "model": model}
        obj.update(choices=[], usage=usage)
        self.usage = _chunk(_event(obj)) + _DONE + b"0\r\n\r\n"


class SSEServer:
    """The server; ``start()`` on a running loop, or ``run_in_thread()`` for tests."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.stats = Stats()
        self.streams: list[_Stream] = []
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stepper: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._server = await self._loop.create_server(lambda: _Conn(self), host, port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        self._stepper = self._loop.create_task(self._step_loop())
        return self.port

    def add(self, stream: _Stream) -> None:
        self.streams.append(stream)
        s = self.stats
        s.active += 1
        s.max_active = max(s.max_active, s.active)
        self._wake.set()

    async def _step_loop(self) -> None:
        cfg = self.config
        k = max(1, cfg.tokens_per_chunk)
        while True:
            if not self.streams:
                self._wake.clear()
                await self._wake.wait()
            keep: list[_Stream] = []
            progressed = False
            running = 0
            for st in self.streams:
                conn = st.conn
                if conn.closed:
                    self.stats.active -= 1
                    continue
                if cfg.max_running is not None and running >= cfg.max_running:
                    keep.append(st)  # waiting for a slot
                    continue
                running += 1
                stall_after = 2 if st.fault == "stall" else cfg.stall_after
                cut_after = 2 if st.fault == "cut" else cfg.cut_after
                if conn.paused or (stall_after is not None and st.sent >= stall_after):
                    keep.append(st)
                    continue
                if cut_after is not None and st.sent >= cut_after:
                    conn.transport.close()
                    self.stats.active -= 1
                    continue
                if cfg.error_after is not None and st.sent >= cfg.error_after:
                    conn.transport.write(_ERROR_EVENT + _DONE + b"0\r\n\r\n")
                    self.stats.active -= 1
                    conn.stream = None
                    continue
                progressed = True
                st.left -= k
                st.sent += k
                if st.stamps is not None:
                    st.stamps.append(perf_counter())
                if st.left > 0:
                    conn.transport.write(st.mid)
                    keep.append(st)
                else:
                    conn.transport.write(st.last + st.usage)
                    self.stats.active -= 1
                    conn.stream = None
                    conn.touch()
            self.streams = keep
            await asyncio.sleep(cfg.delay_s if progressed else max(cfg.delay_s, 0.001))

    def metrics_text(self) -> bytes:
        """vLLM's names for the queue gauges and prefix-cache counters (Prometheus text)."""
        live = [st for st in self.streams if not st.conn.closed]
        cap = self.config.max_running
        running = len(live) if cap is None else min(cap, len(live))
        lab = '{engine="0",model_name="synthetic"}'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{lab} {running}",
            f"vllm:num_requests_waiting{lab} {len(live) - running}",
            f"vllm:prefix_cache_queries_total{lab} {self.stats.prompt_tokens}",
            f"vllm:prefix_cache_hits_total{lab} 0",
            f"vllm:num_preemptions_total{lab} 0",
        ]
        return ("\n".join(lines) + "\n").encode()

    def stats_json(self) -> bytes:
        s = self.stats
        d: dict[str, Any] = {"requests": s.requests, "active": s.active}
        d.update(max_active=s.max_active, connections=s.connections)
        d.update(arrivals=s.arrivals, stamps=s.stamps)
        return json.dumps(d).encode()

    def close(self) -> None:
        if self._stepper is not None:
            self._stepper.cancel()
        if self._server is not None:
            self._server.close()

    def run_in_thread(self) -> int:
        """Serve on a daemon thread with its own loop; returns the port. For tests."""
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()

        threading.Thread(target=main, daemon=True, name="sse-server").start()
        ready.wait(10)
        return self.port

    async def aclose(self) -> None:
        self.close()
        if self._stepper is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._stepper
        for st in self.streams:
            st.conn.transport.abort()

    def stop_thread(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)


class _Conn(asyncio.Protocol):
    def __init__(self, server: SSEServer) -> None:
        self.server = server
        self.buf = b""
        self.closed = False
        self.paused = False
        self.stream: _Stream | None = None
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.stats.connections += 1
        self.touch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._idle is not None:
            self._idle.cancel()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def touch(self) -> None:
        """Restart the idle timer (a keep-alive timeout like uvicorn's)."""
        idle = self.server.config.idle_close_s
        if idle is None:
            return
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(idle, self._idle_close)

    def _idle_close(self) -> None:
        if self.stream is None and not self.buf:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.buf[:i].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            end = i + 4 + length
            if len(self.buf) < end:
                return
            body, self.buf = self.buf[i + 4 : end], self.buf[end:]
            self._handle(head.split(" ", 2), body)

    def _send(self, status: str, body: bytes, ctype: str = "application/json") -> None:
        head = f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}"
        self.transport.write(head.encode() + b"\r\n\r\n" + body)
        self.touch()

    def _handle(self, line: list[str], body: bytes) -> None:
        method, path = line[0], line[1] if len(line) > 1 else "/"
        srv = self.server
        if path == "/health":
            return self._send("200 OK", b"")
        if path == "/v1/models":
            data = {"object": "list", "data": [{"id": "synthetic", "object": "model"}]}
            return self._send("200 OK", json.dumps(data).encode())
        if path == "/stats":
            return self._send("200 OK", srv.stats_json())
        if path == "/metrics" and srv.config.metrics:
            return self._send("200 OK", srv.metrics_text(), "text/plain; version=0.0.4")
        if path != "/v1/completions" or method != "POST":
            return self._send("404 Not Found", b'{"detail":"Not Found"}')
        now = perf_counter()
        req = json.loads(body)
        prompt = req.get("prompt") or [0]
        key = int(prompt[0]) if isinstance(prompt, list) and prompt else srv.stats.requests
        srv.stats.requests += 1
        srv.stats.arrivals[key] = now
        cfg = srv.config
        status = 500 if cfg.faults.get(key) == "http_500" else cfg.fail_status
        if status is not None:
            info: dict[str, Any] = {"message": "injected failure", "type": "InternalServerError"}
            info["code"] = status
            err = {"error": info}
            return self._send(f"{status} Injected", json.dumps(err).encode())
        n_prompt = len(prompt) if isinstance(prompt, list) else 1
        srv.stats.prompt_tokens += n_prompt
        st = _Stream(self, key, int(req.get("max_tokens") or 16), n_prompt, str(req.get("model")))
        if cfg.stamp:
            st.stamps = srv.stats.stamps.setdefault(key, [])
        self.stream = st
        if self._idle is not None:
            self._idle.cancel()
        self.transport.write(_OK_HEAD)
        srv.add(st)


async def _serve_forever(args: argparse.Namespace) -> None:
    cfg = ServerConfig(delay_s=args.delay_ms / 1000.0, stamp=args.stamp)
    srv = SSEServer(cfg)
    port = await srv.start(args.host, args.port)
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="time between decode steps")
    ap.add_argument("--stamp", action="store_true", help="record every token write time")
    ap.add_argument("--no-uvloop", action="store_true")
    args = ap.parse_args()
    if not args.no_uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    try:
        asyncio.run(_serve_forever(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
