"""The steady-state rule's fill-up on a real server: what a window that opens early measures.

Usage (the embedded CPU model):
    python benchmarks/fill_check.py --out DIR [--rate 1.5] [--seconds 150] [--scale 1.0]

Starts one vLLM server as the plugin does (``perf_tests/specs/cpu-smoke.yaml`` with chat-mix-v1
lengths at ``--scale``, max_model_len 2,048), warms it up, sends one seeded Poisson load for
``--seconds``, and reads the same records through windows of ``--window`` seconds that open at
several times after the first send, and at the fill-up that ``load.steady.fill_up_s`` computes
(from the workload's planned lengths and the load's median TTFT and TPOT). For each window: the
mean number of requests in the system, output tokens produced in it over what the sent rate asks
for (rate x mean output length), and p99 TPOT and TTFT of the requests sent in it. A window
that opens before the fill-up holds fewer requests, so it reads a lighter load than the rate's.
Writes DIR/fill-check.json and DIR/fill-check.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "h200"))


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.99 * len(xs)) - 1)] if xs else math.nan


def window_row(recs, t0: float, length: float) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Figures of the window [first send + t0, + length] of one load's records."""
    from pytest_moeperf.load.steady import in_system_series

    first = min(r.send_s for r in recs)
    start, end = first + t0, first + t0 + length
    inside = [r for r in recs if r.ok and start <= r.send_s <= end]
    tokens = sum(1 for r in recs if r.ok for t in r.token_times_s if start <= t <= end)
    asked = len(inside) / length * statistics.mean(r.output_tokens for r in inside)
    series = in_system_series(recs, start, end)
    return {
        "opens_s": t0, "length_s": length, "sends": len(inside),
        "mean_in_system": statistics.mean(n for _, n in series),
        "tokens_over_asked": tokens / length / asked if asked else math.nan,
        "tpot_p99_ms": 1e3 * p99([t for r in inside if (t := r.tpot_s) is not None]),
        "ttft_p99_ms": 1e3 * p99([t for r in inside if (t := r.ttft_s) is not None]),
    }  # fmt: skip


def main() -> int:
    from due_rule_check import spec_text  # the same spec: cpu-smoke with chat-mix lengths
    from long_run_check import prepare, warm_server

    from pytest_moeperf.load.requests import build_requests, planned_output_lengths
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.load.steady import fill_up_s

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()
    out_dir = Path(a.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "spec.yaml"
    spec_path.write_text(spec_text(a.scale))
    out, spec, model_dir, factory = prepare(str(spec_path), str(out_dir))
    try:
        url, served, vocab = warm_server(spec, factory, model_dir, "fill check")
        reqs = build_requests(spec.workload, vocab_size=vocab,
                              max_model_len=spec.model.max_model_len, rate=a.rate,
                              burstiness=1.0, n=int(a.rate * a.seconds), seed_offset=7)  # fmt: skip
        run = run_load(url, served, reqs, mode="poisson", target=a.rate)
    finally:
        factory.stop_all()
    recs = run.requests
    lengths = planned_output_lengths(spec.workload, spec.model.max_model_len)
    fill = fill_up_s(recs, lengths)
    opens = sorted({0.0, 5.0, 10.0, 20.0, 40.0, 60.0, round(fill, 1)})
    rows = [window_row(recs, t0, a.window) for t0 in opens
            if t0 + a.window <= a.seconds * 0.95]  # fmt: skip
    doc = {"rate": a.rate, "seconds": a.seconds, "scale": a.scale, "fill_up_s": fill,
           "requests": len(recs), "ok": sum(r.ok for r in recs), "windows": rows}  # fmt: skip
    (out / "fill-check.json").write_text(json.dumps(doc, indent=1))
    lines = [
        f"{a.rate:g} req/s for {a.seconds:g} s, chat-mix x{a.scale:g}: {doc['ok']} of "
        f"{len(recs)} ok; fill-up (90 %) {fill:.1f} s after the first send",
        "opens s | sends | mean in system | tokens / asked | p99 TPOT ms | p99 TTFT ms",
    ]
    for r in rows:
        mark = " <- fill-up" if abs(r["opens_s"] - round(fill, 1)) < 1e-9 else ""
        lines.append(f"{r['opens_s']:7.1f} | {r['sends']:5d} | {r['mean_in_system']:14.1f} | "
                     f"{r['tokens_over_asked']:14.2f} | {r['tpot_p99_ms']:11.1f} | "
                     f"{r['ttft_p99_ms']:11.0f}{mark}")  # fmt: skip
    (out / "fill-check.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
