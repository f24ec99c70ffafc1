"""Do two starts of one vLLM build on one GPU serve alike? And if not, what differs?

Usage:
    python benchmarks/h200/restarts.py --spec perf_tests/specs/h200-fixed-1024-128.yaml \\
        --rates 16,20,23 --seconds 25 --out DIR
On the CPU the same runs on the embedded model (spec perf_tests/specs/cpu-smoke.yaml).

Why: on 2026-12-06 the same build on the same H200, two server starts eight minutes apart, met
the SLO up to 20-23 and 14.7-15.9 req/s (docs/results/h200-night-2026-12-06): a nightly that
compares one start against another cannot see less than that. Three starts here, in turn:
``cold`` (this machine's first: torch.compile and Triton compile from nothing), ``cached`` (the
same caches, now filled: what every later start on one machine does) and ``recompiled`` (fresh,
empty cache folders again). Each is warmed up as the plugin does, then gets the same probes, the
same seeded requests, at each rate. Per probe: p99 TTFT/TPOT, throughput, tokens per streamed
chunk (above 1: the API server fell behind), the CPU seconds each process of the server's
process group and of this client used (is a Python process the bottleneck?), vLLM's own
counters (/metrics deltas), and the GPU's SM clock and power. Per start: its log lines about
compile, CUDA graphs and the KV cache, and a host CPU speed check (a neighbour on the VM's cores
would show there). Written to DIR/restarts.json as it goes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from long_run_check import plugin_run, prepare  # type: ignore[import-not-found]  # noqa: E402
from replicates import gpu_state  # type: ignore[import-not-found]  # noqa: E402

#: Server log lines that can differ between starts of one build.
START_LINES = re.compile(
    r"KV cache|Maximum concurrency|torch\.compile|Compil|graph captur|Graph capturing|"
    r"cache directory|Loading weights took|Model loading took|init engine|Using configuration from"
    r"|memory profiling|Available KV cache|Using .* backend|Using FlashAttention|max_num_batched",
    re.IGNORECASE,
)
#: vLLM counters worth a delta per probe (histogram sums and counts, totals).
METRIC = re.compile(r"^(vllm:[a-z_]+(?:_sum|_count|_total))(\{[^}]*\})? ([0-9.eE+-]+)$")


def cpu_speed() -> dict[str, float]:
    """Single-thread Python and numpy GEMM speed of the host now (best of a few)."""
    import numpy as np

    loop = []
    for _ in range(5):
        t = time.perf_counter()
        s = 0
        for i in range(1_000_000):
            s += i
        loop.append(time.perf_counter() - t)
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    gemm = []
    for _ in range(5):
        t = time.perf_counter()
        a @ a
        gemm.append(time.perf_counter() - t)
    load = os.getloadavg()
    return {"py_loop_ms": 1000 * min(loop), "gemm_gflops": 2 * 1024**3 / min(gemm) / 1e9,
            "loadavg_1m": load[0]}  # fmt: skip


def group_cpu(pgids: set[int]) -> dict[str, float]:
    """CPU seconds (user + system) so far of every live process in these process groups,
    keyed ``pid:comm``; the clock tick from sysconf."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        f = raw[raw.rindex(")") + 2 :].split()
        if int(f[2]) in pgids:  # f[0] is state: pgrp is the 5th field of stat
            out[f"{d.name}:{comm}"] = (int(f[11]) + int(f[12])) / tick
    return out


def scrape(url: str) -> dict[str, float]:
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m:  # the model's path and the engine index say nothing here
            labels = re.sub(r'(model_name|engine)="[^"]*",?', "", m.group(2) or "").strip("{},")
            out[m.group(1) + (f"{{{labels}}}" if labels else "")] = float(m.group(3))
    return out


def timeline(run: Any) -> dict[str, Any]:
    """When the server stalled: the longest gaps in which no request got a token while some
    were in flight, and per request (send s, TTFT ms, tokens), to see what a p99 TTFT missed
    on (a few multi-second stalls, or a queue that grew)."""
    reqs = run.requests
    ticks = sorted(t for r in reqs for t in r.token_times_s)
    gaps = sorted(((b - a, a) for a, b in itertools.pairwise(ticks)), reverse=True)
    rows = [[round(r.send_s, 3), None if r.ttft_s is None else round(1000 * r.ttft_s),
             r.output_tokens] for r in reqs]  # fmt: skip
    return {"longest_token_gaps_s": [[round(g, 3), round(at, 2)] for g, at in gaps[:8]],
            "requests": rows}  # fmt: skip


def start_lines(log: str) -> list[str]:
    return [ln.strip()[-300:] for ln in log.splitlines() if START_LINES.search(ln)][:80]


def one_start(spec: Any, factory: Any, model_dir: Path, name: str, env: dict[str, str],
              rates: list[float], seconds: float) -> dict[str, Any]:  # fmt: skip
    from pytest_moeperf.metrics.energy import NotMeasuredMeter
    from pytest_moeperf.metrics.hardware import visible_gpus
    from pytest_moeperf.run.driver import RunDriver, warm_levels
    from pytest_moeperf.run.probe import Endpoint
    from pytest_moeperf.run.record import vocab_size

    row: dict[str, Any] = {"name": name, "env": env, "cpu_before": cpu_speed(), "probes": []}
    t = time.monotonic()
    server = factory(model_dir, spec.vllm_args(), name=name, env=env,
                     served_model_name=spec.model.served_name, check_config=False)  # fmt: skip
    row["startup_s"] = time.monotonic() - t
    row["log"] = start_lines(server.log_text())
    vocab = vocab_size(model_dir)
    drv = RunDriver(spec, spec.slo, NotMeasuredMeter("warm-up"), vocab, None, 60, 5,
                    say=print, warm=warm_levels(spec, gpu=bool(visible_gpus())))  # fmt: skip
    t = time.monotonic()
    drv.warm_up(Endpoint(server.base_url, server.model_name), name)
    row["warm_s"] = time.monotonic() - t
    groups = {server.pgid or -1, os.getpgid(0)}
    for i, rate in enumerate(rates):
        before, m0, c0 = gpu_state(), scrape(server.base_url), group_cpu(groups)
        t = time.monotonic()
        runs: list[Any] = []
        r = plugin_run(spec, server.base_url, server.model_name, rate, seconds, vocab,
                       seed=900 + i, keep=runs)  # fmt: skip
        wall = time.monotonic() - t
        c1, m1 = group_cpu(groups), scrape(server.base_url)
        cpu = {k: round((c1[k] - c0.get(k, 0.0)) / wall, 3) for k in c1 if c1[k] > c0.get(k, 0)}
        moved = {k: m1[k] - m0.get(k, 0.0) for k in m1 if m1[k] != m0.get(k)}
        r["timeline"] = timeline(runs[0]) if runs else None
        r.update(wall_s=wall, gpu_before=before, gpu_after=gpu_state(), vllm_metrics=moved,
                 cpu_cores_busy=dict(sorted(cpu.items(), key=lambda kv: -kv[1])[:12]))  # fmt: skip
        row["probes"].append(r)
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["cpu_cores_busy"].items())[:4])
        print(f"{name} {rate:5.1f} req/s: ttft p99 {r['ttft_p99_ms']:.0f} ms, tpot p99 "
              f"{r['tpot_p99_ms']:.1f} ms, {r['request_throughput']:.2f} req/s done, "
              f"{r['tokens_per_chunk']:.2f} tok/chunk, met {r['meets_slo_in_steady_state']}, "
              f"longest gaps {(r['timeline'] or {}).get('longest_token_gaps_s', [])[:3]}; "
              f"cores busy: {top}", flush=True)  # fmt: skip
    row["cpu_after"] = cpu_speed()
    factory.stop_all()
    factory.servers.clear()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--rates", default="16,20,23")
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--starts", default="cold,cached,recompiled")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out, spec, model_dir, factory = prepare(a.spec, a.out)
    rates = [float(x) for x in a.rates.split(",")]
    starts: list[dict[str, Any]] = []

    def save() -> None:
        doc = {"spec": spec.name, "rates": rates, "seconds": a.seconds, "starts": starts,
               "server_args": spec.vllm_args()}  # fmt: skip
        (out / "restarts.json").write_text(json.dumps(doc, indent=1, default=str))

    try:
        for name in a.starts.split(","):
            env: dict[str, str] = {}
            if name == "recompiled":  # empty compile caches: what the cold start had
                fresh = tempfile.mkdtemp(prefix="moeperf-recompile-")
                env = {"VLLM_CACHE_ROOT": f"{fresh}/vllm", "TRITON_CACHE_DIR": f"{fresh}/triton",
                       "TORCHINDUCTOR_CACHE_DIR": f"{fresh}/inductor"}  # fmt: skip
            starts.append(one_start(spec, factory, model_dir, name, env, rates, a.seconds))
            save()
    finally:
        factory.stop_all()
        save()


if __name__ == "__main__":
    main()
