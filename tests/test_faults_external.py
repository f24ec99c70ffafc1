"""External servers that are not what the URL promises: one line each, never a traceback.

Issue 18, item 5: not listening, not HTTP, garbage JSON, an empty model list, ``https://``,
port 99999 and ``http://[::1`` all ended in tracebacks (``list index out of range``, a 30 s TLS
timeout, ``httpx.InvalidURL``). One pytester run per misuse, as pytest-asyncio tests its own.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["pytester"]

SPEC = """\
name: ext-faults
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
workload: {trace: fixed, num_requests: 8, seed: 0, input_tokens: 16, output_tokens: 8}
arrival: {process: poisson, rate: 2.0}
slo: {ttft_p99_ms: 2000, tpot_p99_ms: 200}
search: {rate_min: 2.0, rate_max: 4.0, tolerance: 0.4, max_probes: 2, probe_requests: 8}
runs: 1
"""
TEST = """\
import pytest

@pytest.mark.moeperf_spec("ext.yaml")
def test_ext(moeperf):
    moeperf.run()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Models(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[Any]:
    """answering(status, body) -> base URL of a server answering every GET like that."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(status: int, body: bytes) -> str:
        handler = type("H", (_Models,), {"status": status, "body": body})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def not_http() -> Iterator[str]:
    """A TCP port that answers like an SSH daemon, then closes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    sock.close()


def _run(pytester: pytest.Pytester, url: str) -> Any:
    (pytester.path / "ext.yaml").write_text(SPEC)
    pytester.makepyfile(test_ext=TEST)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-server-url", url,
                                         timeout=120)  # fmt: skip


def _one_line(result: Any, *parts: str) -> None:
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out, out[-3000:]
    lines = [ln for ln in out.splitlines() if all(p in ln for p in parts)]
    assert lines, (parts, out[-3000:])


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://127.0.0.1:8443", "https is not supported (the load client does not speak TLS)"),
        ("http://127.0.0.1:99999", "is not a valid URL"),
        ("http://[::1", "is not a valid URL"),
        ("127.0.0.1:8000", "must start with http://"),
    ],
)
def test_a_malformed_url_is_a_usage_error(pytester: pytest.Pytester, url: str,
                                          problem: str) -> None:  # fmt: skip
    result = _run(pytester, url)
    assert result.ret != 0
    _one_line(result, "--moeperf-server-url", problem)


def test_nothing_listening(pytester: pytest.Pytester) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    result = _run(pytester, url)
    result.assert_outcomes(failed=1)
    _one_line(result, f"moeperf_server_url = '{url}'", "nothing answers there",
              "start the server, or correct the host and port")  # fmt: skip


def test_not_http(pytester: pytest.Pytester, not_http: str) -> None:
    result = _run(pytester, not_http)
    result.assert_outcomes(failed=1)
    _one_line(result, "does not speak HTTP", "give the URL of the OpenAI-compatible HTTP server")


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (200, b"hello", "GET {url}/v1/models answered 'hello', not JSON"),
        (200, b'{"object": "list", "data": []}', "GET {url}/v1/models lists no model"),
        (200, b'{"data": [{"object": "model"}]}', "the first model has no id"),
        (200, b"[1, 2, 3]", "GET {url}/v1/models lists no model"),
        (404, b"not found", "GET {url}/v1/models answered HTTP 404"),
    ],
)
def test_a_server_that_is_not_openai(pytester: pytest.Pytester, answering: Any, status: int,
                                     body: bytes, problem: str) -> None:  # fmt: skip
    url = answering(status, body)
    result = _run(pytester, url)
    result.assert_outcomes(failed=1)
    _one_line(result, f"moeperf_server_url = '{url}'", problem.format(url=url))
