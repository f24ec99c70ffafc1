"""Warm start against a cold long load on a real server: does a warm 45 s probe read the same?

Usage (the embedded CPU model, or any spec with a real server):
    python benchmarks/warm_start_check.py --out DIR [--rate 1.5] [--spec PATH]
        [--cold-seconds 150] [--warm-seconds 45] [--warm-runs 2] [--window 30]

One server, warmed up as the plugin does. First a *cold* seeded Poisson load at ``--rate`` for
``--cold-seconds``, read through the window of ``--window`` seconds that opens at its fill-up
(``load.steady.fill_up_s``) and through the last full one before its 10 % cool-down: the
reference, a server that has filled up by itself. Then
``--warm-runs`` *warm* loads of ``--warm-seconds``, each begun with the steady-state population
sized at the cold load's pace (``load.warmstart``), read through the window that opens at
``warm_fill_up_s`` (as long as the load allows, at most ``--window``). Per window: mean requests
in the system and its ratio to rate x E[D] at the load's own pace, output tokens produced over
what the rate asks for, median and p99 TPOT, p99 TTFT. Without ``--spec``: cpu-smoke.yaml with
chat-mix-v1 lengths (``due_rule_check.spec_text``). Writes DIR/warm-start-check.json and .txt.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "h200"))


def p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)] if xs else math.nan


def window_row(recs: list[Any], opens: float, length: float, rate: float,
               lengths: tuple[int, ...], kind: str) -> dict[str, Any]:  # fmt: skip
    """Figures of the window [first send + opens, + length] of one load's records."""
    from pytest_moeperf.load.steady import in_system_series
    from pytest_moeperf.load.warmstart import Pace, durations, is_warm

    first = min(r.send_s for r in recs)
    start, end = first + opens, first + opens + length
    inside = [r for r in recs if r.ok and not is_warm(r) and start <= r.send_s <= end]
    pace = Pace.of(inside, rate, kind)
    steady = rate * statistics.fmean(durations(lengths, pace)) if pace else math.nan
    tokens = sum(1 for r in recs if r.ok for t in r.token_times_s if start <= t <= end)
    asked = rate * statistics.fmean(lengths)
    mean_n = statistics.fmean(n for _, n in in_system_series(recs, start, end))
    tpots = [t for r in inside if (t := r.tpot_s) is not None]
    ttfts = [t for r in inside if (t := r.ttft_s) is not None]
    return {
        "kind": kind, "opens_s": opens, "length_s": length, "sends": len(inside),
        "mean_in_system": mean_n, "in_system_over_steady": mean_n / steady,
        "tokens_over_asked": tokens / length / asked,
        "tpot_p50_ms": 1e3 * p(tpots, 0.5), "tpot_p99_ms": 1e3 * p(tpots, 0.99),
        "ttft_p50_ms": 1e3 * p(ttfts, 0.5), "ttft_p99_ms": 1e3 * p(ttfts, 0.99),
    }  # fmt: skip


def main() -> int:
    from due_rule_check import spec_text
    from long_run_check import prepare, warm_server

    from pytest_moeperf.load.requests import build_requests, planned_lengths
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.load.serverstats import wait_idle
    from pytest_moeperf.load.steady import fill_up_s
    from pytest_moeperf.load.warmstart import Pace, warm_fill_up_s, warm_population

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec")
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--cold-seconds", type=float, default=150.0)
    ap.add_argument("--warm-seconds", type=float, default=45.0)
    ap.add_argument("--warm-runs", type=int, default=2)
    ap.add_argument("--window", type=float, default=30.0)
    a = ap.parse_args()
    out_dir = Path(a.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = Path(a.spec) if a.spec else out_dir / "spec.yaml"
    if not a.spec:
        spec_path.write_text(spec_text(1.0))
    out, spec, model_dir, factory = prepare(str(spec_path), str(out_dir))
    pairs = planned_lengths(spec.workload, spec.model.max_model_len)
    lengths = tuple(o for _, o in pairs)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []

    def load(n: int, seed: int, warm: tuple[Any, ...] = ()) -> Any:
        reqs = build_requests(spec.workload, vocab_size=vocab,
                              max_model_len=spec.model.max_model_len, rate=a.rate,
                              burstiness=1.0, n=n, seed_offset=seed)  # fmt: skip
        wait_idle(url)
        return run_load(url, served, [*warm, *reqs], mode="poisson", target=a.rate)

    try:
        url, served, vocab = warm_server(spec, factory, model_dir, "warm-start check")
        cold = load(int(a.rate * a.cold_seconds), 7)
        fill = fill_up_s(cold.requests, lengths)
        rows.append(window_row(cold.requests, fill, a.window, a.rate, lengths, "cold"))
        last = rows[-1]
        late = 0.9 * a.cold_seconds - a.window  # the last full window: the most settled
        if late > fill + a.window / 2:
            rows.append(window_row(cold.requests, late, a.window, a.rate, lengths, "cold, late"))
        pace = Pace.of(cold.requests, a.rate, "cold load")
        assert pace is not None, "no request of the cold load finished"
        notes.append(f"cold: fill-up {fill:.1f} s; pace TTFT {1e3 * pace.ttft_s:.0f} ms, "
                     f"TPOT {1e3 * pace.tpot_s:.1f} ms (medians of the whole load)")  # fmt: skip
        for k in range(a.warm_runs):
            plan = warm_population(pairs, rate=a.rate, pace=pace, vocab_size=vocab,
                                   max_seqs=spec.max_num_seqs,
                                   seed=(spec.workload.seed, k, 9))  # fmt: skip
            run = load(int(a.rate * a.warm_seconds), 20 + k, plan.requests)
            wfill, info = warm_fill_up_s(run.requests, lengths, a.rate)
            span = a.warm_seconds * 0.9 - wfill
            rows.append(window_row(run.requests, wfill, min(a.window, span), a.rate, lengths,
                                   f"warm {k + 1}"))  # fmt: skip
            notes.append(f"warm {k + 1}: {len(plan.requests)} requests at t = 0 "
                         f"({sum(r.input_tokens for r in plan.requests)} prompt tokens), burst "
                         f"{info.get('burst_s', math.nan):.1f} s, window opens at "
                         f"{wfill:.1f} s")  # fmt: skip
    finally:
        factory.stop_all()
    doc = {"rate": a.rate, "spec": spec.name, "cold_seconds": a.cold_seconds,
           "warm_seconds": a.warm_seconds, "rows": rows, "notes": notes,
           "cold_tokens_over_asked": last["tokens_over_asked"]}  # fmt: skip
    (out / "warm-start-check.json").write_text(json.dumps(doc, indent=1))
    lines = [f"{spec.name} at {a.rate:g} req/s: cold {a.cold_seconds:g} s vs warm "
             f"{a.warm_seconds:g} s loads", *notes,
             "load       | opens s | window s | sends | in system (/ steady) | tokens / asked | "
             "TPOT p50 / p99 ms | TTFT p50 / p99 ms"]  # fmt: skip
    for r in rows:
        lines.append(f"{r['kind']:10} | {r['opens_s']:7.1f} | {r['length_s']:8.1f} | "
                     f"{r['sends']:5d} | {r['mean_in_system']:8.1f} "
                     f"({r['in_system_over_steady']:.2f})      | {r['tokens_over_asked']:14.2f} | "
                     f"{r['tpot_p50_ms']:7.1f} / {r['tpot_p99_ms']:7.1f} | "
                     f"{r['ttft_p50_ms']:5.0f} / {r['ttft_p99_ms']:5.0f}")  # fmt: skip
    (out / "warm-start-check.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
