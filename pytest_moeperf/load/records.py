"""Data that crosses module lines between the load generator, metrics, baselines and reports.

Times are seconds on one monotonic clock (``time.perf_counter``) relative to the start of the
run (``RunRecord.t0``); wall-clock time is kept only once, for provenance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

RequestStatus = Literal[
    "ok", "http_error", "stream_cut", "timeout", "connect_error", "cancelled", "cut"
]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: what to send and when (offset from the run start)."""

    index: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int

    @property
    def input_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class RequestRecord:
    """What happened to one request, as seen by the client.

    ``token_times_s`` holds the arrival time of every streamed token (a chunk carrying k tokens
    contributes k entries with the same time), so ITL and TPOT follow vLLM's definitions.
    Status ``cut``: streaming normally when the probe's drain ended (``search.drain_s``) and
    stopped by the client; it is neither finished nor failed (see ``tpot_s``,
    ``projected_e2el_s``).
    """

    index: int
    scheduled_s: float
    send_s: float
    input_tokens: int
    max_tokens: int
    status: RequestStatus = "ok"
    first_token_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    token_times_s: list[float] = field(default_factory=list)
    error: str | None = None
    http_status: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.send_s

    @property
    def e2el_s(self) -> float | None:
        if self.end_s is None:
            return None
        return self.end_s - self.send_s

    @property
    def cut(self) -> bool:
        return self.status == "cut"

    @property
    def projected_e2el_s(self) -> float | None:
        """A cut request's latency had it run to its length at its own TPOT; else ``e2el_s``."""
        if not self.cut:
            return self.e2el_s
        ttft, tpot = self.ttft_s, self.tpot_s
        if ttft is None or tpot is None:
            return None
        return ttft + (self.max_tokens - 1) * tpot

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (output - 1), vLLM's definition; None for one-token outputs. For
        a cut request, over the tokens it received (the last one's time for the latency)."""
        if self.cut:
            t = self.token_times_s
            if self.first_token_s is None or len(t) < 2:
                return None
            return (t[-1] - self.first_token_s) / (len(t) - 1)
        ttft, e2el = self.ttft_s, self.e2el_s
        if ttft is None or e2el is None or self.output_tokens < 2:
            return None
        return (e2el - ttft) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        return cls(**d)


@dataclass
class RunRecord:
    """One load run at one operating point (a Poisson rate or a fixed concurrency)."""

    mode: Literal["poisson", "concurrency"]
    target: float  # requests/s for poisson, in-flight requests for concurrency
    burstiness: float
    seed: int
    duration_s: float
    requests: list[RequestRecord]
    t0_wall: float  # time.time() at t0, for provenance only
    aborted_early: bool = False
    abort_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["requests"] = [r.to_dict() for r in self.requests]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        d = dict(d)
        d["requests"] = [RequestRecord.from_dict(r) for r in d["requests"]]
        return cls(**d)


def write_records(run: RunRecord, path: Path, **header: Any) -> None:
    """One load's records as gzipped JSON lines: a header (the run's fields and ``header``),
    then a request a line, times to the microsecond (``--moeperf-records``). On the GPU a
    probe's summary says *that* it stopped; only its records say on which requests. Token
    times are kept for cut requests only (their TPOT is read from them): a chat-mix-like probe
    of 220 requests (388 tokens mean) makes 6.5 KB without them and 375 KB with them, and the
    device returns 16 MiB a file."""
    import gzip
    import json

    def us(x: Any) -> Any:
        return round(x, 6) if isinstance(x, float) else x

    head = {k: us(v) for k, v in asdict(run).items() if k != "requests"}
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps({**head, **header}) + "\n")
        for r in run.requests:
            d = {k: us(v) for k, v in asdict(r).items()}
            d["token_times_s"] = [round(t, 6) for t in r.token_times_s] if r.cut else []
            f.write(json.dumps(d) + "\n")


def read_records(path: Path) -> tuple[dict[str, Any], RunRecord]:
    """``write_records``' file back: (its header, the RunRecord)."""
    import gzip
    import json

    with gzip.open(path, "rt", encoding="utf-8") as f:
        head = json.loads(f.readline())
        requests = [RequestRecord.from_dict(json.loads(line)) for line in f if line.strip()]
    fields = {k: head[k] for k in RunRecord.__dataclass_fields__ if k != "requests"}
    return head, RunRecord(**fields, requests=requests)
