"""What the server itself says during a probe: its queue, and what changes a request's cost.

vLLM exports Prometheus text on ``/metrics``. Two things come from it that the client cannot
see: the waiting queue (``vllm:num_requests_waiting``: a queue that grows over the window means
the server is falling behind even while the client's p99s still look fine) and the counters that
change what a request costs (prefix-cache hits: a cached prompt skips its prefill; preemptions:
a preempted request recomputes). A probe samples the gauges every ``interval_s`` on a thread and
reads the counters before and after; ``wait_idle`` holds a probe until the previous one's
requests have left the engine, so no probe inherits another's queue.

Servers without ``/metrics`` (other OpenAI-compatible servers) give no samples: the probe says
so and the client-side checks still apply.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: Gauges sampled during a probe, and counters read before and after it.
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions")
#: name, labels (quoted values may hold any character, ``}`` and escaped quotes included),
#: value.
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')

Fetch = Callable[[str], str | None]


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of every sample of each metric name (all label sets; ``_total`` suffix dropped).

    Summing over labels adds up the engines of a data-parallel server and the models of a
    multi-model one; vLLM's per-engine gauges are meant to be added.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name = m.group(1)
        if name.endswith("_total"):
            name = name[: -len("_total")]
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


def http_fetch(timeout_s: float = 2.0) -> Fetch:
    """GET ``url`` and return its text, or None on any failure (a probe never dies of it)."""

    def fetch(url: str) -> str | None:
        import httpx

        try:
            r = httpx.get(url, timeout=timeout_s)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError):  # a bad URL: no HTTPError
            return None
        return r.text if r.status_code == 200 else None

    return fetch


@dataclass
class ServerStats:
    """Gauges over one probe (wall clock times) and the counters' changes across it."""

    available: bool
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)

    def delta(self, name: str) -> float | None:
        if name not in self.before or name not in self.after:
            return None
        return self.after[name] - self.before[name]

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens served from the prefix cache during the probe."""
        q, h = self.delta("vllm:prefix_cache_queries"), self.delta("vllm:prefix_cache_hits")
        if q is None or h is None or q <= 0:
            return None
        return h / q

    @property
    def preemptions(self) -> int | None:
        d = self.delta("vllm:num_preemptions")
        return None if d is None else round(d)

    def series(self, name: str, t0_wall: float) -> list[tuple[float, float]]:
        """(seconds since the probe's t0, value) of one gauge."""
        return [(t - t0_wall, v[name]) for t, v in self.samples if name in v]

    def to_dict(self) -> dict[str, Any]:
        """The per-probe record: counters' changes and gauge extremes (not every sample)."""
        waiting = [v.get("vllm:num_requests_waiting", 0.0) for _, v in self.samples]
        kv = [v.get("vllm:kv_cache_usage_perc", 0.0) for _, v in self.samples]
        return {
            "available": self.available,
            "samples": len(self.samples),
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "prefix_cache_queries": self.delta("vllm:prefix_cache_queries"),
            "preemptions": self.preemptions,
            "max_waiting": max(waiting) if waiting else None,
            "max_kv_cache_usage": max(kv) if kv else None,
        }


class Sampler:
    """Samples ``/metrics`` on a daemon thread between ``start()`` and ``stop()``."""

    def __init__(self, base_url: str, *, interval_s: float = 0.5, fetch: Fetch | None = None,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.fetch = fetch or http_fetch()
        self.clock = clock
        self.stats = ServerStats(available=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> dict[str, float] | None:
        text = self.fetch(self.url)
        if text is None:
            return None
        values = parse_prometheus(text)
        return values if any(k.startswith("vllm:") for k in values) else None

    def start(self) -> None:
        first = self._read()
        self.stats = ServerStats(available=first is not None)
        if first is None:
            return
        self.stats.before = {k: first[k] for k in COUNTERS if k in first}
        self._thread = threading.Thread(target=self._loop, name="moeperf-metrics", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            values = self._read()
            if values is not None:
                self.stats.samples.append((self.clock(), {k: values[k] for k in GAUGES
                                                          if k in values}))  # fmt: skip

    def stop(self) -> ServerStats:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.stats.available:
            last = self._read()
            if last is not None:
                self.stats.after = {k: last[k] for k in COUNTERS if k in last}
        return self.stats


@dataclass(frozen=True)
class IdleResult:
    """How long a probe waited for the engine to empty; ``idle`` False means it never did."""

    idle: bool
    waited_s: float
    available: bool
    last: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["last"] = dict(self.last)
        return d


def wait_idle(base_url: str, *, timeout_s: float = 120.0, poll_s: float = 0.25,
              fetch: Fetch | None = None, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> IdleResult:  # fmt: skip
    """Wait until the engine runs and queues no request (two reads in a row), or time out.

    An aborted probe cancels its requests on the client; the engine frees them a little later.
    Without ``/metrics`` there is nothing to wait on: ``available`` is False.
    A read that fails once ``/metrics`` has answered (a busy server's can time out) counts as
    not idle, so the wait goes on until the engine empties or ``timeout_s`` passes.
    """
    fetch = fetch or http_fetch()
    url = base_url.rstrip("/") + "/metrics"
    start = clock()
    quiet = 0
    last: dict[str, float] = {}
    while True:
        text = fetch(url)
        values = parse_prometheus(text) if text is not None else {}
        if not any(k.startswith("vllm:") for k in values):
            if not last:  # no /metrics at all: nothing to wait on
                return IdleResult(True, clock() - start, False)
            quiet = 0  # it answered before (a busy server's /metrics can time out): not idle yet
        else:
            last = {k: values.get(k, 0.0) for k in GAUGES[:2]}
            quiet = quiet + 1 if sum(last.values()) == 0 else 0
        if quiet >= 2:
            return IdleResult(True, clock() - start, True, last)
        if clock() - start >= timeout_s:
            return IdleResult(False, clock() - start, True, last)
        sleep(poll_s)
