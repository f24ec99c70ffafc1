"""Recompute MBU in a recorded baseline from its own boundary probes, with today's formula.

Why: the first H200 fp8 baseline (2026-12-04) was recorded while MBU counted fp8 weights as
bf16 (``metrics.mbu.step_dtypes`` fixed it). MBU is a pure function of the boundary probe's
stored summary (mean TPOT, output tok/s, mean tokens), the model's shape and the rated
bandwidth, so it can be re-derived exactly, without another GPU run. Every other figure stays
as measured; the provenance gets an ``amended`` entry saying what changed and why.

    python benchmarks/h200/rederive_mbu.py BASELINE.json --spec perf_tests/specs/X.yaml \
        --model-config PATH/config.json --bandwidth-tb-s 4.8 --why "..."
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pytest_moeperf.metrics.mbu import step_dtypes
from pytest_moeperf.metrics.model_shape import load_model_shape
from pytest_moeperf.run.figures import MbuInputs, decode_mbu
from pytest_moeperf.spec.loader import load_spec


def boundary_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The summary of the met probe at the run's boundary rate (what MBU was computed from)."""
    rate = run["boundary_rate"]
    met = [p for p in run["probes"] if p.get("met") and p["rate"] == rate]
    if len(met) != 1:
        raise SystemExit(f"run {run.get('index')}: {len(met)} met probes at {rate} req/s")
    return dict(met[0]["summary"])


def rederive(doc: dict[str, Any], inputs: MbuInputs) -> list[tuple[float, float | None]]:
    """Rewrite every run's mbu and the metric's run list in place; returns (old, new) pairs."""
    pairs = []
    for run in doc["runs"]:
        new = decode_mbu(boundary_summary(run), inputs)
        pairs.append((run["metrics"]["mbu"], new))
        run["metrics"]["mbu"] = new
    doc["metrics"]["mbu"] = [run["metrics"]["mbu"] for run in doc["runs"]]
    return pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("baseline", type=Path)
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--model-config", type=Path, required=True)
    ap.add_argument("--bandwidth-tb-s", type=float, required=True)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--why", required=True)
    a = ap.parse_args(argv)
    spec = load_spec(a.spec)
    dt = step_dtypes(spec.model.dtype, spec.engine_arg("quantization"),
                     spec.engine_arg("kv-cache-dtype"))  # fmt: skip
    shape = load_model_shape(a.model_config)
    inputs = MbuInputs(shape, dt.weights, a.gpus, a.bandwidth_tb_s * 1e12,
                       f"{a.bandwidth_tb_s} TB/s", dt.kv, dt.lm_head)  # fmt: skip
    doc = json.loads(a.baseline.read_text())
    pairs = rederive(doc, inputs)
    doc["provenance"].setdefault("amended", []).append({
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "what": "mbu re-derived from the stored boundary probes "
                f"(weights {dt.weights}, KV {dt.kv}, LM head {dt.lm_head}): "
                + ", ".join(f"{o:.4f} -> {n:.4f}" for o, n in pairs if n is not None),
        "why": a.why,
        "by": "benchmarks/h200/rederive_mbu.py",
    })  # fmt: skip
    a.baseline.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    news = [n for _, n in pairs if n is not None]
    print(f"{a.baseline}: mbu {[round(o, 4) for o, _ in pairs]} -> {[round(n, 4) for n in news]}"
          f" (median {statistics.median(news):.4f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
