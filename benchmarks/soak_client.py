"""Does the load generator leak? Steady traffic against the real vLLM CPU server for N minutes.

A nightly run drives a server for an hour or more through ``run_load``; a client that keeps a
little of every request (a socket, a buffer, a task) grows until it perturbs its own timestamps or
is killed. This benchmark:

1. starts the real vLLM OpenAI server on the embedded tiny Qwen3-MoE (eager mode), or uses
   ``--server-url``;
2. sends seeded Poisson traffic at ``--rate`` req/s through the plugin's load client
   (``pytest_moeperf.load.runner.run_load``), in back-to-back batches of ``--batch-s`` seconds
   (the records of a batch are summarized and dropped, as the plugin does between probes);
3. samples this process (the load generator: at these rates ``run_load`` stays in-process) every
   ``--sample-s`` seconds: RSS, open fds, threads, gc counts and live objects, and with
   ``--tracemalloc`` the traced Python heap;
4. reports growth after warm-up: the median RSS of the last ``--window-min`` minutes against the
   median of the first ``--window-min`` minutes after ``--warmup-min``. Goal: < 5 %.

Run it under the vLLM lock (it holds the 2 cores for the whole run):
    flock /tmp/moeperf-vllm.lock .venv/bin/python benchmarks/soak_client.py --minutes 30
Writes ``benchmarks/results/soak_client.json``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_moeperf.load.arrivals import arrival_offsets  # noqa: E402
from pytest_moeperf.load.records import RequestSpec, RunRecord  # noqa: E402
from pytest_moeperf.load.runner import run_load  # noqa: E402

GOAL_PCT = 5.0
SERVER_ARGS = [
    "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "16", "--enforce-eager",
]  # fmt: skip


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def sample(t0: float, traced: bool) -> dict[str, Any]:
    """One snapshot of this process; ~ms even with 100k live objects."""
    row: dict[str, Any] = {
        "t_s": round(time.monotonic() - t0, 2),
        "rss_kb": _status_kb("VmRSS"),
        "hwm_kb": _status_kb("VmHWM"),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "gc_counts": list(gc.get_count()),
        # run_load freezes the heap it starts with (gc.freeze); frozen objects are live too.
        "gc_objects": len(gc.get_objects()) + gc.get_freeze_count(),
    }
    if traced:
        import tracemalloc

        cur, peak = tracemalloc.get_traced_memory()
        row["traced_kb"] = cur // 1024
        row["traced_peak_kb"] = peak // 1024
    return row


class Sampler(threading.Thread):
    """Samples every ``every_s`` seconds until stopped; the first sample is at t=0."""

    def __init__(self, every_s: float, traced: bool) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.every_s = every_s
        self.traced = traced
        self.t0 = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while True:
            self.rows.append(sample(self.t0, self.traced))
            if self.stopped.wait(self.every_s):
                self.rows.append(sample(self.t0, self.traced))
                return


def batch_requests(
    n: int, rate: float, seed: int, input_tokens: int, output_tokens: int, vocab: int
) -> list[RequestSpec]:
    import numpy as np

    rng = np.random.default_rng([seed, 1])
    ids = rng.integers(10, vocab, size=(n, input_tokens)).tolist()
    arrivals = arrival_offsets(n, rate, 1.0, seed)
    return [
        RequestSpec(index=i, arrival_s=t, prompt_token_ids=tuple(ids[i]), max_tokens=output_tokens)
        for i, t in enumerate(arrivals)
    ]


def batch_row(k: int, run: RunRecord, started_s: float) -> dict[str, Any]:
    """What a batch did; the records themselves are dropped after this."""
    ok = [r for r in run.requests if r.ok]
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    statuses = Counter(r.status for r in run.requests)
    return {
        "batch": k,
        "start_s": round(started_s, 2),
        "duration_s": round(run.duration_s, 2),
        "requests": len(run.requests),
        "ok": len(ok),
        "statuses": dict(statuses),
        "output_tokens": sum(r.output_tokens for r in ok),
        "ttft_p50_ms": round(ttfts[len(ttfts) // 2] * 1e3, 1) if ttfts else None,
        "ttft_max_ms": round(ttfts[-1] * 1e3, 1) if ttfts else None,
    }


def growth(rows: list[dict[str, Any]], warmup_s: float, window_s: float) -> dict[str, Any]:
    """RSS growth after warm-up: median of the last window vs the first window after warm-up."""
    post = [r for r in rows if r["t_s"] >= warmup_s]
    if len(post) < 2:
        return {"error": "too few samples after warm-up: run longer or lower --warmup-min"}
    end = post[-1]["t_s"]
    first = [r["rss_kb"] for r in post if r["t_s"] < warmup_s + window_s]
    last = [r["rss_kb"] for r in post if r["t_s"] > end - window_s]
    base, final = statistics.median(first), statistics.median(last)
    peak = max(r["rss_kb"] for r in post)
    ts = [r["t_s"] for r in post]
    rss = [r["rss_kb"] for r in post]
    slope = statistics.linear_regression(ts, rss).slope if len(set(ts)) > 1 else 0.0
    out = {
        "baseline_rss_kb": base,
        "final_rss_kb": final,
        "peak_rss_kb_after_warmup": peak,
        "growth_pct": round((final - base) / base * 100.0, 3),
        "peak_over_baseline_pct": round((peak - base) / base * 100.0, 3),
        "slope_kb_per_hour": round(slope * 3600.0, 1),
        "fds_first_last": [post[0]["fds"], post[-1]["fds"]],
        "threads_first_last": [post[0]["threads"], post[-1]["threads"]],
        "gc_objects_first_last": [post[0]["gc_objects"], post[-1]["gc_objects"]],
    }
    if "traced_kb" in post[0]:
        out["traced_kb_first_last"] = [post[0]["traced_kb"], post[-1]["traced_kb"]]
    return out


def start_server(workdir: Path) -> Any:
    from pytest_moeperf.server.embedded import ensure_embedded_model
    from pytest_moeperf.server.process import ServerConfig, VllmServer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    server = VllmServer(
        ServerConfig(
            model=str(ensure_embedded_model()),
            args=list(SERVER_ARGS),
            log_path=workdir / "soak-server.log",
            startup_timeout_s=600,
        )
    )
    return server.start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="traffic duration")
    ap.add_argument("--rate", type=float, default=3.0, help="Poisson arrivals, req/s")
    ap.add_argument("--batch-s", type=float, default=60.0, help="seconds of arrivals per run_load")
    ap.add_argument("--sample-s", type=float, default=10.0, help="sampling period")
    ap.add_argument("--warmup-min", type=float, default=None, help="default: min(5, minutes/4)")
    ap.add_argument("--window-min", type=float, default=None, help="default: min(3, minutes/6)")
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--tracemalloc", action="store_true", help="also trace the Python heap")
    ap.add_argument("--server-url", default=None, help="use a running server instead")
    ap.add_argument("--model", default=None, help="served model name with --server-url")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak_client.json"))
    args = ap.parse_args()
    warmup_min = args.warmup_min if args.warmup_min is not None else min(5.0, args.minutes / 4)
    window_min = args.window_min if args.window_min is not None else min(3.0, args.minutes / 6)
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start()

    server = None
    with tempfile.TemporaryDirectory(prefix="moeperf-soak-") as tmp:
        try:
            if args.server_url:
                base_url, model = args.server_url, args.model or "model"
            else:
                t = time.monotonic()
                server = start_server(Path(tmp))
                base_url, model = server.base_url, server.model_name
                print(f"server up in {time.monotonic() - t:.0f} s at {base_url}", flush=True)
            sampler = Sampler(args.sample_s, args.tracemalloc)
            sampler.start()
            batches: list[dict[str, Any]] = []
            per_batch = max(1, round(args.rate * args.batch_s))
            end = sampler.t0 + args.minutes * 60.0
            k = 0
            while time.monotonic() < end:
                reqs = batch_requests(
                    per_batch, args.rate, k, args.input_tokens, args.output_tokens, 1000
                )
                started = time.monotonic() - sampler.t0
                run = run_load(base_url, model, reqs, mode="poisson", seed=k, target=args.rate,
                               request_timeout_s=120.0)  # fmt: skip
                row = batch_row(k, run, started)
                del run, reqs
                batches.append(row)
                rss = sampler.rows[-1]["rss_kb"] / 1024 if sampler.rows else float("nan")
                print(f"batch {k}: {row['ok']}/{row['requests']} ok, {row['statuses']}, "
                      f"ttft p50 {row['ttft_p50_ms']} ms, rss {rss:.1f} MiB",
                      flush=True)  # fmt: skip
                k += 1
            sampler.stopped.set()
            sampler.join()
        finally:
            if server is not None:
                server.stop()
    rows = sampler.rows
    result = growth(rows, warmup_min * 60.0, window_min * 60.0)
    total = sum(b["requests"] for b in batches)
    ok = sum(b["ok"] for b in batches)
    failed: Counter[str] = Counter()
    for b in batches:
        failed.update({s: n for s, n in b["statuses"].items() if s != "ok"})
    verdict = "met" if result.get("growth_pct", float("inf")) < GOAL_PCT else "NOT met"
    out = {
        "what": "load-generator memory under steady traffic, real vLLM CPU server",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "args": vars(args),
        "warmup_min": warmup_min,
        "window_min": window_min,
        "requests": total,
        "ok": ok,
        "failed_by_status": dict(failed),
        "goal_pct": GOAL_PCT,
        "verdict": verdict,
        "growth": result,
        "batches": batches,
        "samples": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("batches", "samples")}, indent=1))
    pct = result.get("growth_pct")
    print(f"RSS growth after warm-up: {pct} % (goal < {GOAL_PCT} %): {verdict}")
    return 0 if verdict == "met" else 1


if __name__ == "__main__":
    sys.exit(main())
