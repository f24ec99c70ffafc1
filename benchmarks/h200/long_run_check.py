"""Check a reported SLO boundary with long open-loop runs: at R it must hold, 10 % above not.

Usage (on a GPU machine with vLLM; see docs/steady-state.md):
    python benchmarks/h200/long_run_check.py --spec perf_tests/specs/h200-fixed-1024-128.yaml \
        --rate R --seconds 110 --out DIR [--bench-seconds 90]

Starts one vLLM server with the spec's own flags (prefix caching as the spec says), warms it
up as the plugin does, then runs, in turn: the plugin's own Poisson load at R, vLLM's
``bench serve --request-rate R`` (random, unique prompts of the spec's lengths), the plugin's load
at 1.1 R, and ``bench serve`` at 1.1 R. Each result is written to DIR as soon as it exists, so a
run cut short still returns what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 400.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit("server not ready in time")


def plugin_run(spec, url: str, model: str, rate: float, seconds: float, vocab: int, seed: int):  # type: ignore[no-untyped-def]
    from pytest_moeperf.load.probe import steady_check, summarize_steady
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.load.serverstats import Sampler, wait_idle
    from pytest_moeperf.spec.traces import build_requests

    idle = wait_idle(url)
    reqs = build_requests(
        spec.workload,
        vocab_size=vocab,
        max_model_len=spec.model.max_model_len,
        rate=rate,
        burstiness=1.0,
        n=int(rate * seconds),
        seed_offset=seed,
    )
    sampler = Sampler(url)
    sampler.start()
    run = run_load(url, model, reqs, mode="poisson", target=rate)
    stats = sampler.stop()
    summary = summarize_steady(run, spec.slo, spec)
    check = steady_check(run, summary, spec.slo, stats)
    s = summary.to_dict()
    return {
        "tool": "pytest-moeperf",
        "rate": rate,
        "seconds": seconds,
        "idle": idle.to_dict(),
        "requests": len(reqs),
        "ttft_p99_ms": s["ttft"]["p99_ms"],
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
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, default=110)
    ap.add_argument("--bench-seconds", type=float, default=90)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=8011)
    a = ap.parse_args()
    from pytest_moeperf.load.driver import RunDriver, warm_levels
    from pytest_moeperf.load.probe import Endpoint
    from pytest_moeperf.metrics.energy import NotMeasuredMeter
    from pytest_moeperf.record import vocab_size
    from pytest_moeperf.spec.loader import load_spec

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = load_spec(Path(a.spec))
    model_dir = ROOT / "perf_tests" / "models" / spec.model.path
    served = spec.model.served_name or str(model_dir)
    url = f"http://127.0.0.1:{a.port}"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--port",
        str(a.port),
        *spec.vllm_args(),
    ]
    log = open(out / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    results: list[dict] = []  # type: ignore[type-arg]

    def save() -> None:
        (out / "long-run-check.json").write_text(
            json.dumps(
                {
                    "spec": spec.name,
                    "rate": a.rate,
                    "server_args": spec.vllm_args(),
                    "results": results,
                },
                indent=1,
                default=str,
            )
        )

    try:
        wait_ready(url, proc)
        vocab = vocab_size(model_dir)
        drv = RunDriver(
            spec,
            spec.slo,
            NotMeasuredMeter("warm-up"),
            vocab,
            None,
            60,
            5,
            say=print,
            warm=warm_levels(spec, gpu=True),
        )
        drv.warm_up(Endpoint(url, served), "long-run check")
        w = spec.workload
        for rate, kind in (
            (a.rate, "plugin"),
            (a.rate, "bench"),
            (1.1 * a.rate, "plugin"),
            (1.1 * a.rate, "bench"),
        ):
            t = time.monotonic()
            if kind == "plugin":
                r = plugin_run(spec, url, served, rate, a.seconds, vocab, seed=77)
            else:
                r = bench_run(
                    url,
                    served,
                    str(model_dir),
                    rate,
                    a.bench_seconds,
                    w.input_tokens or 1024,
                    w.output_tokens or 128,
                    out,
                )
            r["wall_s"] = time.monotonic() - t
            results.append(r)
            print(json.dumps(r, default=str)[:600], flush=True)
            save()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        save()


if __name__ == "__main__":
    main()
