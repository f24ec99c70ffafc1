"""How often the overload trend rule stops a probe that would have met its SLO, and how often it
stops one that would not: seeded simulations of a queue, the rule as built against variants.

Usage:
    python benchmarks/abort_trend_study.py [--seeds 200] [--out DIR]

A probe is ``--span`` seconds of Poisson arrivals at rho x capacity into a FIFO queue of 16
slots, each request holding its slot 2-6 s (uniform), its first token 0.1 s + Exp(0.1 s) after
it gets a slot: TTFT is the queueing delay, which is what a rising TTFT on a batching server is.
Each probe runs in full; its p99 TTFT against 2 s says whether it *would* have met. The rule
(``AbortPolicy._trend``) is then polled every 10 arrivals on the requests finished so far, as
the load driver polls it, and a stop is counted against the probe's fate: a *false stop* is a
stop of a probe that would have met (it moves the search's bracket down, the cost the abort
rules must avoid), a *caught* overload is a stop of one that would have missed (it saves time
only: the p99 rule stops most of those anyway). Variants: "old" (a line through every request,
95 %, the rule until 2026-12-06), the built rule (8 block medians, 99 %), and neighbours.
Writes DIR/abort-trend-study.json and prints a table.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_moeperf.load.records import RequestRecord  # noqa: E402
from pytest_moeperf.run.abort import AbortPolicy  # noqa: E402

SLOTS, HOLD_S = 16, 4.0  # capacity 4 req/s
TTFT_SLO_S = 2.0
VARIANTS = {
    "old: all requests, 95 %": AbortPolicy(trend_blocks=10**6, trend_confidence=0.95),
    "8 blocks, 95 %": AbortPolicy(trend_confidence=0.95),
    "8 blocks, 99 % (built)": AbortPolicy(),
    "6 blocks, 99 %": AbortPolicy(trend_blocks=6),
    "12 blocks, 99 %": AbortPolicy(trend_blocks=12),
}


def probe(rate: float, seed: int, span_s: float) -> list[RequestRecord]:
    """One probe's records, every request finished."""
    rng = random.Random(seed)
    t, free, recs = 0.0, [0.0] * SLOTS, []
    for i in range(int(rate * span_s)):
        t += rng.expovariate(rate)
        start = max(t, heapq.heappop(free))
        hold = HOLD_S * rng.uniform(0.5, 1.5)
        heapq.heappush(free, start + hold)
        first = start + 0.1 + rng.expovariate(10.0)
        recs.append(RequestRecord(i, t, t, 16, 200, "ok", first, start + hold, 200, None))
    return recs


def would_meet(recs: list[RequestRecord]) -> bool:
    import numpy as np

    return float(np.percentile([r.first_token_s - r.send_s for r in recs], 99)) <= TTFT_SLO_S  # type: ignore[operator]


def stops(recs: list[RequestRecord], policy: AbortPolicy, t_end: float) -> bool:
    """Whether the trend rule stops this probe at any poll (every 10 arrivals)."""
    for k in range(10, len(recs), 10):
        now = recs[k].send_s
        done = [r for r in recs[:k] if r.end_s is not None and r.end_s <= now]
        if policy._trend(done, TTFT_SLO_S, t_end, now) is not None:
            return True
    return False


def study(seeds: int, span_s: float, loads: tuple[float, ...]) -> list[dict[str, object]]:
    rows = []
    for rho in loads:
        rate = rho * SLOTS / HOLD_S
        met = 0
        counts = {name: [0, 0] for name in VARIANTS}
        for seed in range(seeds):
            recs = probe(rate, seed, span_s)
            ok = would_meet(recs)
            met += ok
            for name, policy in VARIANTS.items():
                counts[name][0 if ok else 1] += stops(recs, policy, span_s)
        rows.append({"load": rho, "probes": seeds, "would_meet": met,
                     "false_stops": {n: c[0] for n, c in counts.items()},
                     "caught": {n: c[1] for n, c in counts.items()}})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--span", type=float, default=40.0, help="seconds of sends a probe")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = study(args.seeds, args.span, (0.8, 0.9, 1.0, 1.2, 1.5))
    print("| load | would meet | " + " | ".join(VARIANTS) + " |")
    print("|---|---:|" + "---:|" * len(VARIANTS))
    for row in rows:
        cells = [f"{row['false_stops'][n]} / {row['caught'][n]}" for n in VARIANTS]  # type: ignore[index]
        head = f"| {row['load']:g} | {row['would_meet']} of {row['probes']} | "
        print(head + " | ".join(cells) + " |")
    print("cells: false stops (of probes that would meet) / caught (of probes that would miss)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "abort-trend-study.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
