"""How much a legitimate re-tiling moves greedy outputs on a GPU: the numbers behind the A/B
gate's output-equivalence allowance (``pytest_moeperf/ab/equivalence.py``, docs/ab-gate.md).

Usage (on the GPU, vLLM importable):
    python benchmarks/h200/equivalence_check.py --spec perf_tests/specs/h200-fixed-1024-128.yaml \
        --side default --side tuned=E128.json --side poor=perf_tests/moe_configs/h200-poor/*.json \
        --side control --out DIR [--eager]

Starts one server per side, one after another (one GPU holds one server of a 30B model), each
with its config file laid out under the name vLLM looks up on *this* GPU (so an H200 file can be
tried on an H100), proves from the log which file it loaded, and decodes the gate's fixed prompt
set greedily. ``default`` is vLLM's in-tree choice (no file); ``control`` repeats the first
side. Every side is compared with the first and judged as the gate would, with the control's
figures as the allowance; DIR/equivalence-check.json holds all outputs and figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "h200"))


def main() -> None:
    from dataclasses import asdict

    from long_run_check import prepare  # type: ignore[import-not-found]

    from pytest_moeperf.ab import equivalence as eq
    from pytest_moeperf.metrics.hardware import visible_gpus
    from pytest_moeperf.moeconfig.naming import expected_config_name
    from pytest_moeperf.run.record import vocab_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument(
        "--side",
        action="append",
        required=True,
        help="default | control | LABEL=CONFIG.json (the first side is the base)",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--eager", action="store_true", help="--enforce-eager: faster starts")
    a = ap.parse_args()  # fmt: skip
    out, spec, model_dir, factory = prepare(a.spec, a.out)
    cfg = json.loads((model_dir / "config.json").read_text())
    gpus = visible_gpus()
    device = gpus[0].name if gpus else "cpu"
    name = expected_config_name(cfg, dtype=None, device_name=device).file_name()
    args = spec.vllm_args() + (["--enforce-eager"] if a.eager else [])
    prompts = eq.prompt_set(spec, vocab_size(model_dir))
    sides: list[tuple[str, Path | None]] = []
    for s in a.side:
        label, _, path = s.partition("=")
        if label == "control":
            sides.append(("control", sides[0][1]))
        else:
            sides.append((label, Path(path).resolve() if path else None))
    doc: dict = {"spec": spec.name, "device": device, "file_name": name, "args": args,  # type: ignore[type-arg]
                 "sides": {}, "comparisons": {}}  # fmt: skip
    outputs: dict[str, list[eq.Greedy]] = {}
    try:
        for label, path in sides:
            t = time.monotonic()
            files = {name: path} if path else None
            server = factory(model_dir, args, name=label, moe_config_files=files,
                             served_model_name=spec.model.served_name)  # fmt: skip
            check = factory.checks[-1].message
            outputs[label] = eq.greedy_outputs(server.base_url, server.model_name, prompts)
            server.stop()
            doc["sides"][label] = {"config": str(path) if path else "default", "check": check,
                                   "wall_s": round(time.monotonic() - t, 1),
                                   "outputs": [asdict(g) for g in outputs[label]]}  # fmt: skip
            print(f"{label}: {check} ({doc['sides'][label]['wall_s']} s)", flush=True)
            (out / "equivalence-check.json").write_text(json.dumps(doc, indent=1, default=str))
        base = sides[0][0]
        ctrl = eq.compare(outputs[base], outputs["control"], "control") if (
            "control" in outputs) else None  # fmt: skip
        for label, _ in sides[1:]:
            if label == "control":
                continue
            verdict = eq.judge(eq.compare(outputs[base], outputs[label], label), ctrl)
            doc["comparisons"][label] = verdict.to_dict()
            print(f"{label} vs {base}: {verdict.line()}", *verdict.failures, sep="\n  ", flush=True)
        if ctrl is not None:
            doc["comparisons"]["control"] = ctrl.to_dict()
            print(f"control vs {base}: {ctrl.text()}", flush=True)
    finally:
        factory.stop_all()
        (out / "equivalence-check.json").write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
