"""How much does p99 TTFT move between probes at one rate: one schedule vs a draw per probe?

Usage:
    python benchmarks/h200/replicates.py --spec perf_tests/specs/h200-fixed-1024-128.yaml \\
        --rate 16 --seconds 25 --pairs 6 --out DIR
On the CPU the same runs on the embedded model (spec perf_tests/specs/cpu-smoke.yaml).

One server (the plugin's launcher, the spec's flags), warmed up as the plugin does, then
``pairs`` x 2 probes at ``rate``, alternating: one with the search's shared schedule
(``run.probe.SEARCH_SCHEDULE``, fresh prompts each time) and one with a schedule drawn afresh.
The pooled spread of log p99 TTFT within each kind is the server's own noise (shared schedule)
and the server's plus the draw's (fresh draws): whether common random numbers can narrow the
SLO search's band on this machine (docs/steady-state.md, "One schedule for every probe"). Each
probe also records its steady-state check, tokens per chunk (a late reader) and the client's
send lag, and, on a GPU, the SM clock and power before it. Written to DIR/replicates.json as
it goes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from long_run_check import (  # type: ignore[import-not-found]  # noqa: E402
    plugin_run,
    prepare,
    warm_server,
)


def gpu_state() -> dict[str, float] | None:
    """SM clock (MHz) and board power (W) of GPU 0 now; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"sm_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0}  # fmt: skip
    except Exception:  # no GPU, no NVML: the CPU run
        return None


def spread(rows: list[dict], kind: str) -> dict:  # type: ignore[type-arg]
    """sd of log p99 TTFT over the probes of one kind (finite ones), and their values."""
    vals = [r["ttft_p99_ms"] for r in rows if r["kind"] == kind]
    logs = [math.log(v) for v in vals if v and math.isfinite(v)]
    sd = statistics.stdev(logs) if len(logs) > 1 else None
    return {"ttft_p99_ms": vals, "sd_log": sd, "n": len(logs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from pytest_moeperf.run.probe import SEARCH_SCHEDULE

    out, spec, model_dir, factory = prepare(a.spec, a.out)
    rows: list[dict] = []  # type: ignore[type-arg]

    def save() -> None:
        doc = {"spec": spec.name, "rate": a.rate, "seconds": a.seconds, "probes": rows,
               "shared": spread(rows, "shared"), "fresh": spread(rows, "fresh")}  # fmt: skip
        (out / "replicates.json").write_text(json.dumps(doc, indent=1, default=str))

    try:
        url, served, vocab = warm_server(spec, factory, model_dir, "replicates")
        for i in range(2 * a.pairs):
            kind = "shared" if i % 2 == 0 else "fresh"
            before = gpu_state()
            t = time.monotonic()
            r = plugin_run(spec, url, served, a.rate, a.seconds, vocab, seed=500 + i,
                           schedule=SEARCH_SCHEDULE if kind == "shared" else None)  # fmt: skip
            r.update(kind=kind, index=i, gpu_before=before, wall_s=time.monotonic() - t)
            rows.append(r)
            print(f"{i:2d} {kind:6s} ttft p99 {r['ttft_p99_ms']:.0f} ms, tpot p99 "
                  f"{r['tpot_p99_ms']:.1f} ms, steady {r['steady']['steady']}, "
                  f"{r['tokens_per_chunk']:.2f} tokens/chunk", flush=True)  # fmt: skip
            save()
    finally:
        factory.stop_all()
        save()
    for kind in ("shared", "fresh"):
        s = spread(rows, kind)
        sd = "n/a" if s["sd_log"] is None else f"{100 * s['sd_log']:.1f} %"
        print(f"{kind}: sd of log p99 TTFT {sd} over {s['n']} probes")


if __name__ == "__main__":
    main()
