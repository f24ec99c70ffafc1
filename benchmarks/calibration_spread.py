"""How much does the machine calibration move from session to session on one machine?

The calibration (pytest_moeperf/baseline/calibration.py) decides "same machine" vs "another
setup" with a tolerance; that tolerance must sit well above this run-to-run spread, or a
baseline would be refused on the machine that recorded it. Each sample is a fresh Python process
(a new torch thread pool, new page mappings), as a new pytest session would be:

    .venv/bin/python benchmarks/calibration_spread.py              # 12 sessions, ~30 s
    .venv/bin/python benchmarks/calibration_spread.py --sessions 30 --out results/x.json

It prints, per figure, the median, min and max over the sessions and the largest ratio between
two sessions (max/min - 1), for the estimator the plugin uses (the best of the repeats), and the
load average before and after (a busy machine widens everything).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ONE = (
    "import json; from pytest_moeperf.baseline.calibration import measure_host;"
    "m, s, t = measure_host(); print(json.dumps({'best': m, 'spread': s, 'threads': t}))"
)


def one_session() -> dict[str, Any]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", ONE], capture_output=True, text=True, check=True)
    d: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    d["wall_s"] = time.perf_counter() - t0
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "calibration_spread.json")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    samples = [one_session() for _ in range(args.sessions)]
    load_after = os.getloadavg()
    from pytest_moeperf.baseline.calibration import HOST_FIGURES, TOLERANCE

    summary: dict[str, Any] = {}
    for k in HOST_FIGURES:
        v = [s["best"][k] for s in samples]
        within = [s["spread"][k] for s in samples]
        summary[k] = {"median": statistics.median(v), "min": min(v), "max": max(v),
                      "max_over_min_minus_1": max(v) / min(v) - 1,
                      "within_session_spread_median": statistics.median(within)}  # fmt: skip
    result = {"machine": {"cpu": platform.processor() or platform.machine(),
                          "cpus": os.cpu_count(), "threads": samples[0]["threads"]},
              "load_before": load_before, "load_after": load_after, "tolerance": TOLERANCE,
              "sessions": len(samples),
              "wall_s_median": statistics.median(s["wall_s"] for s in samples),
              "summary": summary, "samples": samples}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{len(samples)} sessions, {samples[0]['threads']} thread(s), load "
        f"{load_before[0]:.2f} -> {load_after[0]:.2f}, tolerance ±{100 * TOLERANCE:.0f} %"
    )
    for k, s in summary.items():
        within = 100 * s["within_session_spread_median"]
        print(
            f"  {k:<12} median {s['median']:8.2f}  min {s['min']:8.2f}  max {s['max']:8.2f}  "
            f"max/min {100 * s['max_over_min_minus_1']:+6.1f} %  "
            f"(best over median of the repeats: {within:.0f} %)"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
