"""A machine that left one side less of its CPUs: what the runs record and what the gate says.

Usage (the embedded default; two pytest sessions, ~5 minutes on 2 cores):
    .venv/bin/python benchmarks/machine_drift.py [--hogs 2] [--out moeperf-results/machine-drift]

Session 1 records a baseline of ``perf_tests/test_embedded.py`` into a throw-away folder on the
machine as it is. Session 2 compares against it while ``--hogs`` busy-loop processes run
beside it, started in their own session so that they are *other* processes, not the run's (as a
compile job beside a developer's run would be). Prints each run's shares of the CPUs lost to
steal and to other processes (``hygiene/machine.py``), and the comparison's verdicts with the
machine note (``verdict/machine_drift.py``); writes both sessions' results.json to ``--out``.
docs/verdicts.md ("A machine that changed between the two sides") has the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOG = "import time\nwhile True: pass\n"


def session(baseline_dir: Path, out: Path, name: str, *extra: str) -> dict[str, Any]:
    """One ``pytest perf_tests/test_embedded.py`` session; its results.json, parsed."""
    report = out / name / "report"
    cmd = [sys.executable, "-m", "pytest", "perf_tests/test_embedded.py", "-p",
           "no:cacheprovider", "--moeperf-baseline-dir", str(baseline_dir),
           "--moeperf-report", str(report), *extra]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    results = ROOT / "moeperf-results" / "results.json"
    data: dict[str, Any] = json.loads(results.read_text())
    shutil.copy(results, out / f"{name}.results.json")
    print(f"{name}: pytest exit {done.returncode}")
    return data


def describe(data: dict[str, Any]) -> None:
    (r,) = data["results"]
    for run in r.get("search_runs", []):
        m = run.get("machine") or {}
        print(f"  run {run.get('index', 0) + 1}: boundary {run.get('boundary_rate')} req/s, "
              f"steal {100 * m.get('steal', float('nan')):.0f} %, other processes "
              f"{100 * m.get('others', float('nan')):.0f} %")  # fmt: skip
    for v in r.get("verdicts", []):
        print(f"  {v['metric']}: {v['outcome']} ({100 * v['delta_rel']:+.1f} %)")
    for w in (r.get("baseline") or {}).get("warnings", []):
        if w.startswith("the machine left"):
            print(f"  note: {w}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hogs", type=int, default=2, help="busy-loop processes beside session 2")
    ap.add_argument("--out", type=Path, default=ROOT / "moeperf-results" / "machine-drift")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = session(Path(tmp), args.out, "quiet", "--moeperf-refresh-baselines",
                       "--moeperf-reason", "benchmarks/machine_drift.py, quiet side")  # fmt: skip
        describe(base)
        hogs = [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True)
                for _ in range(args.hogs)]  # fmt: skip
        try:
            busy = session(Path(tmp), args.out, "busy")
        finally:
            for h in hogs:
                h.kill()
        describe(busy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
