"""Streaming client for vLLM's OpenAI ``/v1/completions``: a RequestSpec in, a RequestRecord out.

Errors never escape ``send``: a load run must see every failure as data (status, HTTP code,
text), because a server that drops requests under load is exactly what the SLO search measures.
Connections are kept alive and reused, as ``vllm bench serve`` does, so TTFT does not include
a TCP handshake per request.
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter
from typing import Any
from urllib.parse import urlsplit

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load._exchange import Exchange
from pytest_moeperf.load._http import Connection
from pytest_moeperf.load.records import RequestRecord, RequestSpec


def parse_base_url(base_url: object, source: str = "run_load()") -> tuple[str, int, str]:
    """(host, port, request path) for an ``http://host:port[/prefix]`` server root.

    A root ending in ``/v1`` is accepted too, since OpenAI clients are configured that way.
    """
    fix = "pass the server root, e.g. 'http://127.0.0.1:8000'"
    if not isinstance(base_url, str):
        raise UsageError(source, "base_url", base_url, "must be a str", fix)
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(
            source,
            "base_url",
            base_url,
            "must be an http:// URL with a host (the load client does not speak TLS)",
            fix,
        )
    try:
        port = parts.port or 80
    except ValueError:
        raise UsageError(source, "base_url", base_url, "has an invalid port", fix) from None
    if parts.query or parts.fragment:
        raise UsageError(source, "base_url", base_url, "must not have a query or fragment", fix)
    prefix = parts.path.rstrip("/")
    path = prefix + "/completions" if prefix.endswith("/v1") else prefix + "/v1/completions"
    return parts.hostname, port, path


def completion_body(model: str, spec: RequestSpec) -> bytes:
    """The JSON body: token-id prompt (exact input length), greedy, exactly max_tokens out.

    ``ignore_eos`` alone pins the output length: vLLM then neither stops on EOS nor adds the
    generation config's EOS ids as stop tokens, so ``min_tokens`` is not needed.
    """
    ids = ",".join(map(str, spec.prompt_token_ids))
    return (
        f'{{"model":{json.dumps(model)},"prompt":[{ids}],"max_tokens":{spec.max_tokens},'
        '"temperature":0,"ignore_eos":true,"stream":true,'
        '"stream_options":{"include_usage":true}}'
    ).encode()


def completion_request(host: str, port: int, path: str, model: str, spec: RequestSpec) -> bytes:
    """Request line, headers and body as one buffer, so sending is a single write."""
    return post_request(host, port, path, completion_body(model, spec))


def post_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """A streaming POST of a JSON body, as one buffer."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: pytest-moeperf\r\n"
        "Accept: text/event-stream\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class StreamingClient:
    """A keep-alive connection pool plus the request lifecycle, on the running event loop.

    All times in the records are ``perf_counter() - t0``; ``t0`` is shared by every worker
    process of a run (CLOCK_MONOTONIC is system-wide), so their records line up.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        t0: float,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.host, self.port, self.path = parse_base_url(base_url, "StreamingClient()")
        self.model = model
        self.t0 = t0
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[Connection] = []
        self._active: dict[Exchange, Connection | None] = {}

    def prepare(self, spec: RequestSpec) -> bytes:
        """Encode a request ahead of its send time, so the send itself costs one write."""
        return completion_request(self.host, self.port, self.path, self.model, spec)

    def prepare_json(self, body: dict[str, Any]) -> bytes:
        """Any ``/v1/completions`` body (text prompt, stop sequences: the accuracy task).

        ``model``, ``stream`` and ``stream_options`` are set here: the parser needs a stream.
        """
        full = {**body, "model": self.model, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        return post_request(self.host, self.port, self.path, json.dumps(full).encode())

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def _release(self, conn: Connection) -> None:
        self._idle.append(conn)

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: Connection(self.t0, self._release), self.host, self.port
        )
        return conn

    async def _connect(self, ex: Exchange) -> Connection | None:
        """A fresh connection, or None when it failed or the exchange was cancelled meanwhile."""
        task: asyncio.Future[Any] = asyncio.ensure_future(self._open())
        try:
            await asyncio.wait(
                {task, ex.future},
                timeout=min(self.connect_timeout_s, self.request_timeout_s),
                return_when=asyncio.FIRST_COMPLETED,
            )
        except asyncio.CancelledError:
            task.cancel()
            raise
        now = perf_counter() - self.t0
        if not task.done():
            task.cancel()
            if not ex.future.done():
                ex.finish("connect_error", now, f"connect to {self.host}:{self.port} timed out")
            return None
        exc = task.exception()
        if exc is not None:
            ex.finish("connect_error", now, f"{type(exc).__name__}: {exc}")
            return None
        conn: Connection = task.result()
        if ex.finished:  # cancelled while connecting
            conn._drop()
            return None
        return conn

    async def send(
        self,
        spec: RequestSpec,
        scheduled_s: float,
        payload: bytes | None = None,
        *,
        texts: list[bytes] | None = None,
    ) -> RequestRecord:
        """Run one request to completion and return its record; never raises for I/O errors.

        With ``texts``, the raw JSON of every content event is appended to it (``chunk_text``
        decodes them); load runs leave it None and never decode a token.
        """
        loop = asyncio.get_running_loop()
        if payload is None:
            payload = self.prepare(spec)
        rec = RequestRecord(
            index=spec.index,
            scheduled_s=scheduled_s,
            send_s=perf_counter() - self.t0,
            input_tokens=spec.input_tokens,
            max_tokens=spec.max_tokens,
        )
        for attempt in range(2):  # the second only when a reused connection had gone stale
            ex = Exchange(rec, loop.create_future(), texts)
            self._active[ex] = None
            try:
                conn = None
                while self._idle and attempt == 0:
                    cand = self._idle.pop()
                    if not cand.closed:
                        conn = cand
                        break
                if conn is None:
                    conn = await self._connect(ex)
                    if conn is None:
                        return rec
                self._active[ex] = conn
                elapsed = perf_counter() - self.t0 - rec.send_s
                conn.start(
                    ex, payload, max(self.request_timeout_s - elapsed, 1e-3), self.request_timeout_s
                )
                if await ex.future:
                    return rec
            finally:
                del self._active[ex]
            rec.token_times_s.clear()
            rec.first_token_s = None
            if texts is not None:
                texts.clear()
        return rec

    def cancel_all(self) -> None:
        """Finish every in-flight request as ``cancelled`` and close its connection."""
        now = perf_counter() - self.t0
        for ex, conn in list(self._active.items()):
            if conn is not None:
                conn.cancel(now)
            else:
                ex.finish("cancelled", now, "cancelled: the run was aborted")

    def close(self) -> None:
        """Close idle keep-alive connections (in-flight ones belong to their requests)."""
        for conn in self._idle:
            conn._drop()
        self._idle.clear()


def chunk_text(events: list[bytes]) -> str:
    """The generated text of a stream kept with ``send(texts=...)``: ``choices[0].text`` joined.

    Raises ValueError for an event that is not a completion chunk (a malformed stream).
    """
    parts = []
    for raw in events:
        try:
            text = json.loads(raw)["choices"][0].get("text")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            what = f"not a completion chunk ({type(exc).__name__}): {raw[:200]!r}"
            raise ValueError(what) from None
        if not isinstance(text, str | None):
            raise ValueError(f"choices[0].text is {type(text).__name__}")
        parts.append(text or "")
    return "".join(parts)


async def stream_completion(
    base_url: str, model: str, spec: RequestSpec, *, request_timeout_s: float = 600.0
) -> RequestRecord:
    """One request on its own connection, times relative to the call; for probes and tests."""
    client = StreamingClient(
        base_url, model, t0=perf_counter(), request_timeout_s=request_timeout_s
    )
    try:
        return await client.send(spec, 0.0)
    finally:
        client.close()
