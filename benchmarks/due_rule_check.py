"""The steady-state rule's "due, not sent" on a real server with mixed output lengths.

Usage (the embedded CPU model; a GPU spec works the same way):
    python benchmarks/due_rule_check.py --out DIR [--rates 2,4,8] [--seconds 30] [--scale 0.5]

Starts one vLLM server as the plugin does (spec ``perf_tests/specs/cpu-smoke.yaml`` with its
workload replaced by chat-mix-v1 at ``--scale``: input median 1,024 x scale, output median
256 x scale, p90 four times that), warms it up, then sends one seeded Poisson load per rate for
``--seconds`` and judges it with ``load.steady``. For each rate it prints what the probe rule
counts (finished over *due* at the window's pace) beside what it counted before 2026-12-05
(finished over *sent* in the window), the verdict and p99 TTFT, and writes DIR/due-rule.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "h200"))


def spec_text(scale: float) -> str:
    """cpu-smoke.yaml with chat-mix-v1 lengths at ``scale`` and room for them."""
    import yaml

    doc = yaml.safe_load((ROOT / "perf_tests" / "specs" / "cpu-smoke.yaml").read_text())
    doc["name"] = f"cpu-chat-mix-x{scale:g}"
    doc["model"]["max_model_len"] = 2048
    doc["workload"] = {"trace": "chat-mix-v1", "num_requests": 40, "seed": 0, "scale": scale}
    return yaml.safe_dump(doc, sort_keys=False)


def main() -> int:
    from long_run_check import plugin_run, prepare, warm_server

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rates", default="2,4,8")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--scale", type=float, default=0.5)
    a = ap.parse_args()
    out_dir = Path(a.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "spec.yaml"
    spec_path.write_text(spec_text(a.scale))
    out, spec, model_dir, factory = prepare(str(spec_path), str(out_dir))
    rows = []
    try:
        url, served, vocab = warm_server(spec, factory, model_dir, "due-rule check")
        for i, rate in enumerate(float(r) for r in a.rates.split(",")):
            r = plugin_run(spec, url, served, rate, a.seconds, vocab, seed=100 + i)
            st = r["steady"]
            r["finished_over_sent"] = st["completed_rps"] / st["offered_rps"]
            rows.append(r)
            (out / "due-rule.json").write_text(json.dumps(rows, indent=1, default=str))
            print(f"{rate:g} req/s: finished/due {st['completion_ratio']:.2f}, finished/sent "
                  f"{r['finished_over_sent']:.2f}, steady {st['steady']}"
                  f"{' (too short)' if st['too_short'] else ''}, p99 TTFT "
                  f"{r['ttft_p99_ms']:.0f} ms, TPOT {r['tpot_p99_ms']:.0f} ms; "
                  f"{'; '.join(st['reasons']) or 'no reason against'}", flush=True)  # fmt: skip
    finally:
        factory.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
