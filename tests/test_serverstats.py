"""load.serverstats: vLLM /metrics text, the Sampler thread and wait_idle, against real HTTP
servers in threads (changing, 404, down, hanging, garbage): a clear result, never a traceback."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from pytest_moeperf.load.serverstats import (
    COUNTERS,
    GAUGES,
    IdleResult,
    Sampler,
    ServerStats,
    http_fetch,
    parse_prometheus,
    wait_idle,
)

#: What vLLM 0.32 (prometheus_client 0.26) serves, cut to the metrics read here plus one histogram.
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 120.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7963248613926315e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.8999999999999999
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""


def vllm_text(running: float, waiting: float, *, queries: float = 120.0, hits: float = 30.0,
              preemptions: float = 0.0, kv: float = 0.1) -> str:  # fmt: skip
    lab = '{engine="0",model_name="m"}'
    return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{lab} {running}\n"
            f"vllm:num_requests_waiting{lab} {waiting}\nvllm:kv_cache_usage_perc{lab} {kv}\n"
            f"vllm:prefix_cache_queries_total{lab} {queries}\n"
            f"vllm:prefix_cache_hits_total{lab} {hits}\n"
            f"vllm:num_preemptions_total{lab} {preemptions}\n")  # fmt: skip


# --- parsing --------------------------------------------------------------------------------


def test_parse_real_vllm_text() -> None:
    v = parse_prometheus(VLLM_TEXT)
    assert {k: v[k] for k in GAUGES} == {"vllm:num_requests_running": 3.0,
                                         "vllm:num_requests_waiting": 0.0,
                                         "vllm:kv_cache_usage_perc": 0.1}  # fmt: skip
    assert {k: v[k] for k in COUNTERS} == {"vllm:prefix_cache_queries": 120.0,
                                           "vllm:prefix_cache_hits": 30.0,
                                           "vllm:num_preemptions": 0.0}  # fmt: skip
    assert "vllm:prefix_cache_queries_total" not in v  # _total dropped
    assert v["vllm:prefix_cache_queries_created"] == pytest.approx(1.7963248613926315e9)
    assert v["vllm:time_to_first_token_seconds_count"] == 2.0
    assert v["vllm:time_to_first_token_seconds_sum"] == pytest.approx(0.9)
    assert v["vllm:time_to_first_token_seconds_bucket"] == 3.0  # le="+Inf" label is no value
    assert v["process_cpu_seconds"] == 12.5
    assert not any(k.startswith("#") or k.startswith("HELP") for k in v)


def test_parse_sums_engines_and_models() -> None:
    text = ('vllm:num_requests_running{engine="0",model_name="a"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="a"} 4.0\n'
            'vllm:num_requests_running{engine="0",model_name="b"} 0.5\n')  # fmt: skip
    assert parse_prometheus(text) == {"vllm:num_requests_running": 7.5}


def test_parse_skips_nan_and_infinities() -> None:
    text = ('vllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:kv_cache_usage_perc{engine="1"} 0.25\n'
            "vllm:a +Inf\nvllm:b -Inf\nvllm:c Nan\nvllm:d 1e-3\nvllm:e -2\n")  # fmt: skip
    assert parse_prometheus(text) == {"vllm:kv_cache_usage_perc": 0.25, "vllm:d": 0.001,
                                      "vllm:e": -2.0}  # fmt: skip


def test_parse_labels_with_escapes_commas_braces() -> None:
    text = ('vllm:num_requests_waiting{model_name="say \\"hi\\", ok",engine="0"} 2.0\n'
            'vllm:num_requests_waiting{model_name="a}b{c",engine="1"} 3.0\n'
            'vllm:num_requests_waiting{model_name="back\\\\slash\\nnl",engine="2"} 4.0\n'
            'vllm:num_requests_running{model_name="/models/Qwen 3 (MoE), v2"} 1.0\n')  # fmt: skip
    assert parse_prometheus(text) == {"vllm:num_requests_waiting": 9.0,
                                      "vllm:num_requests_running": 1.0}  # fmt: skip


def test_parse_timestamps_crlf_blank_lines_and_no_labels() -> None:
    text = ("\r\n# a comment\r\nvllm:num_requests_waiting 5 1700000000000\r\n\r\n"
            "vllm:num_requests_running{} 2\r\n   \r\n")  # fmt: skip
    assert parse_prometheus(text) == {"vllm:num_requests_waiting": 5.0,
                                      "vllm:num_requests_running": 2.0}  # fmt: skip


@pytest.mark.parametrize("garbage", [
    "", "<html><body><h1>404 Not Found</h1></body></html>", "Internal Server Error",
    '{"detail": "Not Found"}', "vllm:num_requests_running{engine=\"0\" 3.0", "\x00\xff\ufffd" * 50,
    "vllm:num_requests_running three", "=== 1 2 3 ===",
])  # fmt: skip
def test_parse_garbage_gives_no_vllm_value(garbage: str) -> None:
    assert not any(k.startswith("vllm:") for k in parse_prometheus(garbage))


def test_parse_pathological_lines_are_fast() -> None:
    lines = ['x{a="' + '\\"' * 50_000 + " 1", "x{" + 'a="b",' * 20_000 + " 1", "{" * 100_000]
    t0 = time.thread_time()  # the parser's CPU, not the other processes on the cores
    assert parse_prometheus("\n".join(lines)) == {}
    assert time.thread_time() - t0 < 2.0


# --- ServerStats ----------------------------------------------------------------------------


def test_server_stats_deltas_and_record() -> None:
    s = ServerStats(True, [(10.0, {"vllm:num_requests_waiting": 2.0}), (10.5, {}),
                           (11.0, {"vllm:num_requests_waiting": 7.0,
                                   "vllm:kv_cache_usage_perc": 0.5})],
                    before={"vllm:prefix_cache_queries": 100.0, "vllm:prefix_cache_hits": 10.0,
                            "vllm:num_preemptions": 1.0},
                    after={"vllm:prefix_cache_queries": 300.0, "vllm:prefix_cache_hits": 60.0,
                           "vllm:num_preemptions": 3.0000001})  # fmt: skip
    assert s.prefix_cache_hit_rate == 0.25 and s.preemptions == 2
    assert s.series("vllm:num_requests_waiting", 10.0) == [(0.0, 2.0), (1.0, 7.0)]
    assert s.to_dict() == {"available": True, "samples": 3, "prefix_cache_hit_rate": 0.25,
                           "prefix_cache_queries": 200.0, "preemptions": 2, "max_waiting": 7.0,
                           "max_kv_cache_usage": 0.5}  # fmt: skip
    same = {"vllm:prefix_cache_queries": 5.0, "vllm:prefix_cache_hits": 0.0}
    no_queries = ServerStats(True, before=same, after=same)
    assert no_queries.prefix_cache_hit_rate is None and no_queries.preemptions is None
    assert ServerStats(False).to_dict() == {
        "available": False, "samples": 0, "prefix_cache_hit_rate": None,
        "prefix_cache_queries": None, "preemptions": None, "max_waiting": None,
        "max_kv_cache_usage": None}  # fmt: skip


# --- real HTTP servers in threads -----------------------------------------------------------

Respond = Callable[[int], tuple[int, str]]


class MetricsServer:
    """http.server on 127.0.0.1: ``respond(n)`` answers the n-th GET /metrics (from 0)."""

    def __init__(self, respond: Respond) -> None:
        self.respond, self.hits, self.lock = respond, 0, threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    code, body = 404, "Not Found"
                else:
                    with owner.lock:
                        n, owner.hits = owner.hits, owner.hits + 1
                    code, body = owner.respond(n)
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:  # quiet
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def wait_hits(self, n: int, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.hits < n:
            assert time.monotonic() < deadline, f"only {self.hits} of {n} reads"
            time.sleep(0.005)


@pytest.fixture
def serve() -> Iterator[Callable[[Respond], MetricsServer]]:
    servers: list[MetricsServer] = []

    def start(respond: Respond) -> MetricsServer:
        servers.append(MetricsServer(respond))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def down_url() -> str:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def hanging_url() -> Iterator[str]:
    """Accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


FAST = http_fetch(timeout_s=0.5)
BAD_URLS = ("http://127.0.0.1:abc", "http://" + "h" * 64 + ".local", "http://[::1")
_CLIENT = httpx.Client(timeout=0.5)


def quick(url: str) -> str | None:
    """http_fetch's contract on one client (http_fetch builds one, with an SSL context, per read:
    40-90 ms of CPU that would make the many-read tests slow)."""
    try:
        r = _CLIENT.get(url)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def test_http_fetch_results(serve: Callable[[Respond], MetricsServer], down_url: str,
                            hanging_url: str) -> None:  # fmt: skip
    srv = serve(lambda n: (200, VLLM_TEXT))
    assert FAST(srv.url + "/metrics") == VLLM_TEXT
    assert FAST(srv.url + "/other") is None  # 404
    failing = serve(lambda n: (500, VLLM_TEXT))
    assert FAST(failing.url + "/metrics") is None and failing.hits == 1
    assert FAST(down_url + "/metrics") is None
    t0 = time.monotonic()
    assert http_fetch(timeout_s=0.2)(hanging_url + "/metrics") is None
    assert time.monotonic() - t0 < 2.0
    for bad in BAD_URLS:  # InvalidURL, UnicodeError (a host label over 63 characters)
        assert FAST(bad + "/metrics") is None
    assert FAST("not a url") is None


def test_sampler_follows_a_changing_server(serve: Callable[[Respond], MetricsServer]) -> None:
    """The n-th read sees n waiting, 10 n more queries and 5 n more hits: the samples, the
    counters' changes and the hit rate (0.5) follow exactly."""

    def respond(n: int) -> tuple[int, str]:
        return 200, vllm_text(1.0, n, queries=120 + 10 * n, hits=30 + 5 * n, preemptions=n // 2)

    srv = serve(respond)
    clock = itertools.count(100.0, 0.5)
    sampler = Sampler(srv.url + "/", interval_s=0.01, fetch=FAST, clock=lambda: next(clock))
    sampler.start()
    assert sampler.url == srv.url + "/metrics" and sampler.stats.available
    srv.wait_hits(6)
    stats = sampler.stop()
    reads = srv.hits
    assert stats.before == {"vllm:prefix_cache_queries": 120.0, "vllm:prefix_cache_hits": 30.0,
                            "vllm:num_preemptions": 0.0}  # fmt: skip
    assert stats.delta("vllm:prefix_cache_queries") == 10.0 * (reads - 1)
    assert stats.prefix_cache_hit_rate == 0.5 and stats.preemptions == (reads - 1) // 2
    waiting = stats.series("vllm:num_requests_waiting", 100.0)
    assert [v for _, v in waiting] == [float(n) for n in range(1, len(waiting) + 1)]
    assert [t for t, _ in waiting] == [0.5 * k for k in range(len(waiting))]
    assert len(waiting) == reads - 2  # the first read is `before`, the last `after`
    assert all(set(v) == set(GAUGES) for _, v in stats.samples)
    assert stats.to_dict()["max_waiting"] == float(len(waiting))
    time.sleep(0.05)
    assert srv.hits == reads  # the thread has stopped


def unavailable_checks(sampler: Sampler, started: float) -> None:
    sampler.start()
    stats = sampler.stop()
    assert time.monotonic() - started < 3.0
    assert not stats.available and stats.samples == [] and stats.after == {}
    assert stats.to_dict()["available"] is False and stats.prefix_cache_hit_rate is None


@pytest.mark.parametrize("answer", [(404, "Not Found"), (200, "<html>hello</html>"),
                                    (200, "process_cpu_seconds_total 12.5\n"),
                                    (500, VLLM_TEXT)])  # fmt: skip
def test_sampler_without_vllm_metrics(serve: Callable[[Respond], MetricsServer],
                                      answer: tuple[int, str]) -> None:  # fmt: skip
    srv = serve(lambda n: answer)
    unavailable_checks(Sampler(srv.url, interval_s=0.01, fetch=FAST), time.monotonic())
    time.sleep(0.05)
    assert srv.hits == 1  # one look at start; no thread, no read at stop


def test_sampler_server_down_hanging_or_bad_url(down_url: str, hanging_url: str) -> None:
    unavailable_checks(Sampler(down_url, interval_s=0.01), time.monotonic())  # default fetch
    hang = Sampler(hanging_url, interval_s=0.01, fetch=http_fetch(timeout_s=0.2))
    unavailable_checks(hang, time.monotonic())
    for bad in BAD_URLS:
        unavailable_checks(Sampler(bad, fetch=FAST), time.monotonic())


def test_sampler_server_gone_mid_probe(serve: Callable[[Respond], MetricsServer]) -> None:
    """/metrics answering 404 from the 5th read on, then the server shut down."""
    srv = serve(lambda n: (200, vllm_text(2.0, 1.0)) if n < 4 else (404, "gone"))
    sampler = Sampler(srv.url, interval_s=0.01, fetch=quick)
    sampler.start()
    srv.wait_hits(8)
    stats = sampler.stop()
    assert stats.available and len(stats.samples) == 3  # reads 1-3; later ones skipped
    assert stats.after == {} and stats.delta("vllm:num_preemptions") is None
    assert stats.prefix_cache_hit_rate is None and stats.preemptions is None
    assert stats.to_dict()["max_waiting"] == 1.0
    up = serve(lambda n: (200, vllm_text(2.0, 1.0)))
    sampler = Sampler(up.url, interval_s=0.01, fetch=quick)
    sampler.start()
    up.wait_hits(3)
    up.stop()
    stats = sampler.stop()
    assert stats.available and stats.samples and stats.after == {}


# --- wait_idle ------------------------------------------------------------------------------

BUSY, IDLE = vllm_text(3.0, 2.0), vllm_text(0.0, 0.0)
BUSY_LAST = {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 2.0}
IDLE_LAST = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}


def script(*answers: str | None) -> Respond:
    """The n-th read gets answers[n] (the last one forever after); None is a 404."""

    def respond(n: int) -> tuple[int, str]:
        a = answers[min(n, len(answers) - 1)]
        return (404, "Not Found") if a is None else (200, a)

    return respond


def test_wait_idle_needs_two_quiet_reads_in_a_row(
        serve: Callable[[Respond], MetricsServer]) -> None:  # fmt: skip
    srv = serve(script(BUSY, vllm_text(1.0, 0.0), IDLE, vllm_text(0.0, 1.0), IDLE, IDLE, BUSY))
    r = wait_idle(srv.url, timeout_s=5.0, poll_s=0.01, fetch=FAST)
    assert r.idle and r.available and dict(r.last) == IDLE_LAST
    assert srv.hits == 6 and r.waited_s < 3.0
    assert r.to_dict() == {"idle": True, "waited_s": r.waited_s, "available": True,
                           "last": dict(r.last)}  # fmt: skip


@pytest.mark.parametrize("answers", [(BUSY,), (BUSY, BUSY, None)], ids=["busy", "then-404"])
def test_wait_idle_times_out_on_a_busy_server(serve: Callable[[Respond], MetricsServer],
                                              answers: tuple[str | None, ...]) -> None:  # fmt: skip
    """Also when /metrics fails after a busy read (a timeout under load): not idle, the wait goes
    on (it used to return at once as 'no /metrics', and the probe inherited the busy queue)."""
    srv = serve(script(*answers))
    r = wait_idle(srv.url, timeout_s=0.3, poll_s=0.02, fetch=quick)
    assert not r.idle and r.available and 0.3 <= r.waited_s < 2.0
    assert dict(r.last) == BUSY_LAST


@pytest.mark.parametrize("answer", [None, "<html>hello</html>", "process_open_fds 7\n"])
def test_wait_idle_without_vllm_metrics(serve: Callable[[Respond], MetricsServer],
                                        answer: str | None) -> None:  # fmt: skip
    srv = serve(script(answer))
    assert wait_idle(srv.url, timeout_s=5.0, poll_s=0.01, fetch=FAST).available is False
    assert srv.hits == 1  # nothing to wait on


def test_wait_idle_server_down_hanging_or_bad_url(down_url: str, hanging_url: str) -> None:
    for url, fetch in [(down_url, None), (hanging_url, http_fetch(timeout_s=0.2)),
                       *((bad, FAST) for bad in BAD_URLS)]:  # fmt: skip
        t0 = time.monotonic()
        r = wait_idle(url, timeout_s=5.0, poll_s=0.01, fetch=fetch)
        assert (r.idle, r.available, dict(r.last)) == (True, False, {})
        assert time.monotonic() - t0 < 2.0


def test_wait_idle_rides_over_one_failed_read(serve: Callable[[Respond], MetricsServer]) -> None:
    blip = serve(script(BUSY, IDLE, None, IDLE, IDLE))
    r = wait_idle(blip.url, timeout_s=5.0, poll_s=0.01, fetch=quick)
    assert r.idle and r.available and blip.hits == 5


def test_wait_idle_on_an_injected_clock() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    r = wait_idle("http://x", timeout_s=1.0, poll_s=0.25, fetch=lambda url: BUSY,
                  clock=lambda: now[0], sleep=sleep)  # fmt: skip
    assert r == IdleResult(False, 1.0, True, BUSY_LAST) and sleeps == [0.25] * 4
    texts = iter([BUSY, IDLE, IDLE])
    r = wait_idle("http://x", fetch=lambda url: next(texts), clock=lambda: now[0], sleep=sleep)
    assert r == IdleResult(True, 0.5, True, IDLE_LAST) and sleeps == [0.25] * 6
