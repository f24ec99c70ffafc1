"""The streaming client against the synthetic server and hand-written byte streams."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest
from sse_helpers import Serve

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.client import (
    StreamingClient,
    chunk_text,
    completion_body,
    completion_request,
    parse_base_url,
    stream_completion,
)
from pytest_moeperf.load.records import RequestRecord, RequestSpec


def spec(n_out: int = 8, index: int = 0, n_in: int = 5) -> RequestSpec:
    return RequestSpec(index, 0.0, tuple(range(index, index + n_in)), n_out)


def one(url: str, s: RequestSpec, timeout: float = 10.0) -> RequestRecord:
    return asyncio.run(stream_completion(url, "m", s, request_timeout_s=timeout))


class RawServer:
    """Answers each request with fixed bytes, written in the given pieces with pauses.

    For byte streams the synthetic server never produces: odd fragmentation, chunk extensions,
    SSE comments, JSON with spaces, missing [DONE], plain JSON bodies.
    """

    def __init__(self, pieces: list[bytes], close_after: bool = True, pause_s: float = 0.002):
        self.pieces = pieces
        self.close_after = close_after
        self.pause_s = pause_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            head, _, body = buf.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + body)
            for piece in self.pieces:
                conn.sendall(piece)
                time.sleep(self.pause_s)
            if self.close_after:
                conn.close()

    def close(self) -> None:
        self.sock.close()


def chunked(*events: bytes, ext: bytes = b"") -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(e), ext, e) for e in events) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
TOKEN = b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"a"}]}\n\n'
USAGE3 = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"


# -- the request we send
def test_body_carries_exact_prompt_ids_and_pins_output_length() -> None:
    body = json.loads(completion_body("my-model", RequestSpec(0, 0.0, (3, 1, 4, 1, 5), 17)))
    assert body == {
        "model": "my-model",
        "prompt": [3, 1, 4, 1, 5],
        "max_tokens": 17,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_model_name_is_json_escaped() -> None:
    body = json.loads(completion_body('we"ird\\name', spec()))
    assert body["model"] == 'we"ird\\name'


def test_request_has_matching_content_length() -> None:
    raw = completion_request("h", 8000, "/v1/completions", "m", spec())
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert f"Content-Length: {len(body)}".encode() in head


def test_base_url_root_and_v1_forms() -> None:
    assert parse_base_url("http://127.0.0.1:8000") == ("127.0.0.1", 8000, "/v1/completions")
    assert parse_base_url("http://h:1/v1/") == ("h", 1, "/v1/completions")
    assert parse_base_url("http://h/proxy") == ("h", 80, "/proxy/v1/completions")


def test_https_base_url_is_rejected() -> None:
    with pytest.raises(UsageError, match="TLS") as info:
        parse_base_url("https://h:8000")
    assert info.value.what == "base_url"


def test_base_url_without_host_is_rejected() -> None:
    with pytest.raises(UsageError, match="'http://'"):
        parse_base_url("http://")


def test_base_url_with_bad_port_is_rejected() -> None:
    with pytest.raises(UsageError, match="invalid port"):
        parse_base_url("http://h:99999")


def test_base_url_with_query_is_rejected() -> None:
    with pytest.raises(UsageError, match="query"):
        parse_base_url("http://h:1/?x=1")


def test_non_string_base_url_is_rejected() -> None:
    with pytest.raises(UsageError, match="must be a str"):
        parse_base_url(8000)


# -- normal streams
def test_token_count_and_timestamps(serve: Serve) -> None:
    url, srv = serve(delay_s=0.002)
    rec = one(url, spec(n_out=20))
    assert rec.status == "ok", rec.error
    assert rec.output_tokens == 20
    assert len(rec.token_times_s) == 20
    assert rec.first_token_s == rec.token_times_s[0]
    assert rec.end_s == rec.token_times_s[-1]
    assert rec.send_s < rec.first_token_s
    assert all(b >= a for a, b in zip(rec.token_times_s, rec.token_times_s[1:], strict=False))
    # One decode step of >= 2 ms between tokens: the timestamps must resolve it.
    gaps = [b - a for a, b in zip(rec.token_times_s, rec.token_times_s[1:], strict=False)]
    assert sorted(gaps)[len(gaps) // 2] > 0.001  # median: one late step can be caught up
    assert rec.input_tokens == 5 and rec.max_tokens == 20
    assert srv.stats.requests == 1


def test_several_tokens_per_chunk_are_padded_to_usage(serve: Serve) -> None:
    url, _ = serve(tokens_per_chunk=4, delay_s=0.002)
    rec = one(url, spec(n_out=10))
    assert rec.status == "ok"
    assert rec.output_tokens == 10  # from usage.completion_tokens
    assert len(rec.token_times_s) == 10
    assert len(set(rec.token_times_s)) == 3  # three chunks: 4 + 4 + 2 tokens
    assert rec.token_times_s[-3:] == [rec.token_times_s[-1]] * 3


def test_connection_is_reused_between_requests(serve: Serve) -> None:
    url, srv = serve()

    async def two() -> list[RequestRecord]:
        client = StreamingClient(url, "m", t0=time.perf_counter())
        try:
            return [await client.send(spec(index=i), 0.0) for i in range(3)]
        finally:
            client.close()

    recs = asyncio.run(two())
    assert [r.status for r in recs] == ["ok"] * 3
    assert srv.stats.connections == 1


def test_stale_keepalive_connection_is_retried_once(serve: Serve) -> None:
    url, srv = serve(idle_close_s=0.05)

    async def two() -> list[RequestRecord]:
        client = StreamingClient(url, "m", t0=time.perf_counter())
        try:
            first = await client.send(spec(index=0), 0.0)
            await asyncio.sleep(0.3)  # the server closes the idle connection meanwhile
            return [first, await client.send(spec(index=1), 0.0)]
        finally:
            client.close()

    recs = asyncio.run(two())
    assert [r.status for r in recs] == ["ok", "ok"]
    assert recs[1].output_tokens == 8
    assert srv.stats.connections == 2


# -- failures are recorded, never raised
def test_http_500_is_recorded(serve: Serve) -> None:
    url, _ = serve(fail_status=500)
    rec = one(url, spec())
    assert rec.status == "http_error"
    assert rec.http_status == 500
    assert rec.error is not None and "injected failure" in rec.error
    assert rec.output_tokens == 0 and rec.first_token_s is None


def test_stream_cut_mid_way_is_recorded(serve: Serve) -> None:
    url, _ = serve(cut_after=3, delay_s=0.001)
    rec = one(url, spec(n_out=10))
    assert rec.status == "stream_cut"
    assert rec.output_tokens == 3
    assert len(rec.token_times_s) == 3
    assert rec.error is not None and "[DONE]" in rec.error


def test_error_event_mid_stream_is_recorded(serve: Serve) -> None:
    url, _ = serve(error_after=2, delay_s=0.001)
    rec = one(url, spec(n_out=10))
    assert rec.status == "http_error"
    assert rec.http_status == 500
    assert rec.error is not None and "Internal server error" in rec.error
    assert rec.output_tokens == 2


def test_stalled_stream_times_out(serve: Serve) -> None:
    url, _ = serve(stall_after=2, delay_s=0.001)
    t = time.perf_counter()
    rec = one(url, spec(n_out=10), timeout=0.3)
    elapsed = time.perf_counter() - t
    assert rec.status == "timeout"
    assert 0.29 <= elapsed < 2.0
    assert rec.output_tokens == 2
    assert rec.error is not None and "request_timeout_s=0.3" in rec.error
    assert rec.end_s is not None and rec.end_s - rec.send_s >= 0.29


def test_connection_refused_is_recorded() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    rec = one(f"http://127.0.0.1:{port}", spec())
    assert rec.status == "connect_error"
    assert rec.error is not None and "Connect" in rec.error
    assert rec.http_status is None


def test_cancel_all_cancels_in_flight(serve: Serve) -> None:
    url, _ = serve(stall_after=1, delay_s=0.001)

    async def run() -> list[RequestRecord]:
        client = StreamingClient(url, "m", t0=time.perf_counter())
        tasks = [asyncio.ensure_future(client.send(spec(index=i), 0.0)) for i in range(3)]
        await asyncio.sleep(0.2)
        assert client.in_flight == 3
        client.cancel_all()
        return list(await asyncio.gather(*tasks))

    recs = asyncio.run(run())
    assert [r.status for r in recs] == ["cancelled"] * 3
    assert all(r.output_tokens == 1 for r in recs)


# -- parsing odd but legal byte streams
def raw_record(pieces: list[bytes], **kw: Any) -> RequestRecord:
    srv = RawServer(pieces, **kw)
    try:
        return one(srv.url, spec(), timeout=5.0)
    finally:
        srv.close()


def test_byte_by_byte_fragmentation_counts_the_same() -> None:
    body = HEAD + chunked(TOKEN, TOKEN, TOKEN, USAGE3, DONE)
    rec = raw_record([body[i : i + 1] for i in range(len(body))], pause_s=0.0)
    assert rec.status == "ok", rec.error
    assert rec.output_tokens == 3 and len(rec.token_times_s) == 3


def test_several_events_in_one_chunk_and_one_read() -> None:
    rec = raw_record([HEAD + chunked(TOKEN + TOKEN, TOKEN + USAGE3 + DONE)])
    assert rec.status == "ok"
    assert rec.output_tokens == 3


def test_chunk_extensions_comments_and_spaced_json() -> None:
    spaced = b'data: {"id": "x", "choices": [ {"index": 0, "text": "a"}]}\n\n'
    events = (b": ping\n\n", spaced, TOKEN, spaced, USAGE3, DONE)
    rec = raw_record([HEAD, chunked(*events, ext=b";name=val")])
    assert rec.status == "ok", rec.error
    assert rec.output_tokens == 3 and len(rec.token_times_s) == 3


def test_empty_text_chunk_still_counts_as_a_token() -> None:
    empty = b'data: {"id":"x","choices":[{"index":0,"text":""}]}\n\n'
    rec = raw_record([HEAD + chunked(empty, TOKEN, TOKEN, USAGE3, DONE)])
    assert rec.output_tokens == 3 and len(rec.token_times_s) == 3


def test_missing_usage_falls_back_to_chunk_count() -> None:
    rec = raw_record([HEAD + chunked(TOKEN, TOKEN, DONE)])
    assert rec.status == "ok"
    assert rec.output_tokens == 2


def test_response_without_done_is_a_stream_cut() -> None:
    rec = raw_record([HEAD + chunked(TOKEN, USAGE3)], close_after=False)
    assert rec.status == "stream_cut"
    assert rec.error is not None and "[DONE]" in rec.error


def test_non_streaming_json_answer_is_a_stream_cut() -> None:
    body = b'{"choices":[{"text":"abc"}]}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    rec = raw_record([head % len(body) + body], close_after=False)
    assert rec.status == "stream_cut"


def test_error_body_without_length_is_read_to_close() -> None:
    rec = raw_record([b"HTTP/1.1 503 Service Unavailable\r\n\r\n", b"overloaded"])
    assert rec.status == "http_error"
    assert rec.http_status == 503
    assert rec.error is not None and "overloaded" in rec.error


def test_garbage_response_is_a_stream_cut() -> None:
    rec = raw_record([HEAD + b"zz\r\nnot a chunk\r\n"])
    assert rec.status == "stream_cut"
    assert rec.error is not None and "malformed" in rec.error


def test_server_closing_before_answer_is_a_stream_cut() -> None:
    rec = raw_record([])
    assert rec.status == "stream_cut"
    assert rec.error is not None and "closed" in rec.error


def test_interim_100_continue_is_skipped() -> None:
    rec = raw_record([b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + chunked(TOKEN, USAGE3, DONE)])
    assert rec.status == "ok"
    assert rec.output_tokens == 3  # usage wins over the single chunk; padded
    assert len(rec.token_times_s) == 3


# -- text capture (the accuracy task's requests go through the same client)
def text_chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"


def one_chunk(data: bytes) -> bytes:
    """One HTTP chunk, not the end of the body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_text_is_captured_on_the_fast_and_the_slow_path() -> None:
    # One event in one chunk in one read (the fast path), then two events in one chunk and
    # events next to the terminator (the full parser).
    texts: list[bytes] = []
    reads = [HEAD, one_chunk(text_chunk("The ")),
             one_chunk(text_chunk("answer") + text_chunk(" is")),
             chunked(text_chunk(' "2"'), USAGE3, DONE)]  # fmt: skip
    rec, _, _ = _fed(reads, texts)
    assert rec.status == "ok", rec.error
    assert chunk_text(texts) == 'The answer is "2"'
    assert len(texts) == 4 and len(rec.token_times_s) == 4


def test_prepare_json_streams_with_the_served_model() -> None:
    client = StreamingClient("http://127.0.0.1:9", "served", t0=0.0)
    raw = client.prepare_json({"prompt": "hi", "max_tokens": 3, "model": "ignored"})
    head, _, body = raw.partition(b"\r\n\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {
        "prompt": "hi", "max_tokens": 3, "model": "served",
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def test_load_runs_keep_no_text() -> None:
    rec = raw_record([HEAD, one_chunk(text_chunk("x")), chunked(USAGE3, DONE)])
    assert rec.status == "ok" and rec.output_tokens == 3  # and nothing decoded or kept


@pytest.mark.parametrize(
    "event",
    [b'{"choices":[{"text":5}]}', b'{"choices":[]}', b"[1]", b"not json"],
)
def test_chunk_text_rejects_malformed_chunks(event: bytes) -> None:
    with pytest.raises(ValueError):
        chunk_text([event])


# -- the protocol fed by hand, and the read clock
class _FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True


def _fed(
    pieces: list[bytes], texts: list[bytes] | None = None
) -> tuple[RequestRecord, _FakeTransport, list[object]]:
    from pytest_moeperf.load._exchange import Exchange
    from pytest_moeperf.load._http import Connection

    released: list[object] = []

    async def run() -> tuple[RequestRecord, _FakeTransport]:
        conn = Connection(0.0, released.append)
        tr = _FakeTransport()
        conn.connection_made(tr)  # type: ignore[arg-type]
        rec = RequestRecord(0, 0.0, 0.0, 1, 3)
        ex = Exchange(rec, asyncio.get_running_loop().create_future(), texts)
        conn.start(ex, b"REQ", 5.0, 5.0)
        for p in pieces:
            conn.data_received(p)
        assert ex.future.done()
        return rec, tr

    rec, tr = asyncio.run(run())
    return rec, tr, released


def test_clean_response_returns_the_connection_to_the_pool() -> None:
    rec, tr, released = _fed([HEAD, chunked(TOKEN, TOKEN, TOKEN, USAGE3, DONE)])
    assert tr.written == b"REQ"
    assert rec.status == "ok" and len(released) == 1 and not tr.aborted


def test_connection_close_header_is_not_pooled() -> None:
    head = HEAD.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")
    rec, tr, released = _fed([head, chunked(TOKEN, TOKEN, TOKEN, USAGE3, DONE)])
    assert rec.status == "ok" and released == [] and tr.aborted


def test_stamping_selector_stamps_reads_at_wake_up(serve: Serve) -> None:
    from pytest_moeperf.load._exchange import StampingSelector
    from pytest_moeperf.load._worker import new_event_loop

    url, _ = serve(delay_s=0.002)
    loop = new_event_loop("stamping")
    try:
        sel = loop._selector  # type: ignore[attr-defined]
        assert isinstance(sel, StampingSelector)
        t0 = time.perf_counter()
        rec = loop.run_until_complete(StreamingClient(url, "m", t0=t0).send(spec(n_out=5), 0.0))
    finally:
        loop.close()
    assert rec.status == "ok" and len(rec.token_times_s) == 5
    # Every stamp is a wake-up time of the selector, never later than the last one.
    assert rec.token_times_s[-1] <= sel.last - t0


def test_uvloop_kind_gives_a_working_loop() -> None:
    from pytest_moeperf.load._worker import new_event_loop

    loop = new_event_loop("uvloop")
    try:
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()
