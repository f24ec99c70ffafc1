"""Is the load client ever the bottleneck? Ours vs ``vllm bench serve``, same server, same run.

1. Starts ``sse_server.py`` in its own process (decode steps with no delay: it streams as fast as
   its one core allows).
2. Sustained streamed tokens/s of ``run_load`` at each concurrency, for 1 and 2 worker processes.
3. The same for vLLM's own benchmark client (``vllm.benchmarks.serve``, backend ``vllm``, random
   dataset, ``--ignore-eos``), run as a subprocess with a tiny local tokenizer.
4. Timestamp overhead: a second server with ``--stamp`` and a per-step delay (a realistic
   ITL) records when it wrote each token; the overhead of a token is our timestamp minus that
   write time (loopback delivery included, so this is an upper bound on read-to-stamp time).

Writes ``benchmarks/results/bench_client.json`` and prints a table. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from time import perf_counter
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_moeperf.load.records import RequestRecord, RequestSpec  # noqa: E402
from pytest_moeperf.load.runner import run_load  # noqa: E402

LOOPS = ("stamping", "uvloop")
VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def start_server(*extra: str) -> tuple[subprocess.Popen[str], int]:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sse_server.py"), "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"sse_server did not start: {line!r}")
    return proc, int(line.split()[1])


def make_tokenizer(path: Path, vocab: int = 4096) -> None:
    """A word-level tokenizer whose tokens are t0..tN: enough for vLLM's random dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"t{i}": i for i in range(vocab)}
    words["[UNK]"] = vocab
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}
    cfg["model_max_length"] = 1 << 20
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def specs(n: int, input_len: int, output_len: int) -> list[RequestSpec]:
    # The first prompt id is the request index: the stamping server keys its records by it.
    return [RequestSpec(i, 0.0, (i, *range(1, input_len)), output_len) for i in range(n)]


def ours(
    port: int, n: int, conc: int, inp: int, out: int, workers: int, loop: str
) -> dict[str, Any]:
    """run_load's streamed tokens/s, and (one worker, in this process) its CPU per token."""
    os.environ["MOEPERF_LOOP"] = loop  # read by every new load loop, workers inherit it
    cpu = time.process_time()
    run = run_load(
        f"http://127.0.0.1:{port}",
        "synthetic",
        specs(n, inp, out),
        mode="concurrency",
        concurrency=conc,
        workers=workers,
    )
    cpu = time.process_time() - cpu
    tokens = sum(r.output_tokens for r in run.requests if r.ok)
    row = {"tok_s": tokens / run.duration_s, "duration_s": run.duration_s, "tokens": tokens}
    row["failed"] = sum(not r.ok for r in run.requests)
    if workers == 1:
        row["cpu_us_per_token"] = cpu / tokens * 1e6
    return row


def run_and_time_cpu(cmd: list[str], env: dict[str, str], start: str, end: str) -> float:
    """Run cmd; return its CPU seconds between the output lines ``start`` and ``end``.

    That leaves out vLLM's ~12 s of imports and dataset set-up, which is not client work.
    """
    import psutil  # type: ignore[import-untyped]

    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    ps = psutil.Process(proc.pid)
    t_start = t_end = None
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-50:], line]
        if t_start is None and start in line:
            c = ps.cpu_times()
            t_start = c.user + c.system
        elif t_start is not None and t_end is None and end in line:
            c = ps.cpu_times()
            t_end = c.user + c.system
    if proc.wait() != 0 or t_start is None or t_end is None:
        raise RuntimeError("vllm bench serve failed:\n" + "".join(tail))
    return float(t_end - t_start)


def vllm_client(port: int, tok_dir: Path, n: int, conc: int, inp: int, out: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-c", VLLM_BENCH, "--backend", "vllm"]
        cmd += ["--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions"]
        cmd += ["--model", "synthetic", "--tokenizer", str(tok_dir), "--dataset-name", "random"]
        cmd += ["--random-input-len", str(inp), "--random-output-len", str(out)]
        cmd += ["--random-range-ratio", "0", "--num-prompts", str(n)]
        cmd += ["--max-concurrency", str(conc), "--request-rate", "inf", "--ignore-eos"]
        cmd += ["--num-warmups", "0", "--disable-tqdm", "--save-result", "--result-dir", d]
        cmd += ["--result-filename", "r.json"]
        env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", PYTHONUNBUFFERED="1")
        cpu = run_and_time_cpu(cmd, env, "Starting main benchmark run", "Serving Benchmark Result")
        res = json.loads((Path(d) / "r.json").read_text())
    return {
        "tok_s": res["output_throughput"],
        "duration_s": res["duration"],
        "failed": res["num_prompts"] - res["completed"],
        "tokens": res["total_output_tokens"],
        "cpu_us_per_token": cpu / res["total_output_tokens"] * 1e6,
        "command": " ".join([*cmd[:2], "<vllm.benchmarks.serve main>", *cmd[3:]]),
    }


def overhead(port: int, n: int, conc: int, out: int, delay_ms: float, loop: str) -> dict[str, Any]:
    """Per-token (our timestamp - server write time), in microseconds."""
    os.environ["MOEPERF_LOOP"] = loop
    t0s: list[float] = []

    def grab_t0(done: list[RequestRecord], now_s: float) -> None:
        if not t0s:
            t0s.append(perf_counter() - now_s)  # run_load's t0 on this process's clock

    run = run_load(
        f"http://127.0.0.1:{port}",
        "synthetic",
        specs(n, 8, out),
        mode="concurrency",
        concurrency=conc,
        workers=1,
        should_abort=grab_t0,
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats") as resp:
        stamps = json.loads(resp.read())["stamps"]
    t0 = t0s[0]
    deltas: list[float] = []
    for r in run.requests:
        server = stamps.get(str(r.index), [])
        deltas += [(t0 + c - s) * 1e6 for c, s in zip(r.token_times_s, server, strict=False)]
    deltas.sort()

    def pct(p: float) -> float:
        return deltas[min(len(deltas) - 1, int(p / 100 * len(deltas)))]

    toks = sum(r.output_tokens for r in run.requests)
    return {
        "concurrency": conc,
        "loop": loop,
        "delay_ms": delay_ms,
        "tokens": len(deltas),
        "tok_s": toks / run.duration_s,
        "p50_us": pct(50),
        "p90_us": pct(90),
        "p99_us": pct(99),
        "max_us": deltas[-1],
    }


def loop_overhead(port: int, n: int, conc: int, out: int) -> dict[str, Any]:
    """Epoll return -> our timestamp, per read, on the stdlib loop with a stamping selector.

    This is exactly the client's own share of a token's delay (other callbacks that ran first in
    the same loop iteration, plus the recv). uvloop cannot be instrumented this way; it spends
    less per callback than the stdlib loop, so its share is smaller.
    """
    import asyncio
    import selectors

    from pytest_moeperf.load import _http
    from pytest_moeperf.load._worker import DriveConfig, Driver

    class StampSelector(selectors.EpollSelector):
        last = 0.0

        def select(self, timeout: float | None = None) -> Any:
            ready = super().select(timeout)
            StampSelector.last = perf_counter()
            return ready

    deltas: list[float] = []
    orig = _http.Connection.data_received

    def stamped(self: _http.Connection, data: bytes) -> None:
        deltas.append(perf_counter() - StampSelector.last)
        orig(self, data)

    loop = asyncio.SelectorEventLoop(StampSelector())
    _http.Connection.data_received = stamped  # type: ignore[method-assign]
    try:
        cfg = DriveConfig(
            f"http://127.0.0.1:{port}", "synthetic", "concurrency", conc, 600.0, specs(n, 8, out)
        )
        driver = Driver(cfg, perf_counter() + 0.01, lambda r: None)
        loop.run_until_complete(driver.run())
    finally:
        _http.Connection.data_received = orig  # type: ignore[method-assign]
        loop.close()
    deltas.sort()
    us = [d * 1e6 for d in deltas]
    return {
        "concurrency": conc,
        "reads": len(us),
        "p50_us": us[len(us) // 2],
        "p99_us": us[int(0.99 * len(us))],
        "max_us": us[-1],
    }


def pinned_server(*extra: str) -> tuple[subprocess.Popen[str], int]:
    """Server on CPU 0 and this process on the others, so they do not take turns on one core."""
    proc, port = start_server(*extra)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(proc.pid, {cpus[0]})
        os.sched_setaffinity(0, set(cpus[1:]))
    return proc, port


def throughput_row(port: int, tok_dir: Path, conc: int, args: argparse.Namespace) -> dict[str, Any]:
    n, inp, out = conc * args.requests_per_slot, args.input_len, args.output_len
    row: dict[str, Any] = {"concurrency": conc, "requests": n}
    for loop in LOOPS:
        row[f"ours_{loop}_w1"] = ours(port, n, conc, inp, out, 1, loop)
    for w in args.workers:
        if w > 1:
            row[f"ours_stamping_w{w}"] = ours(port, n, conc, inp, out, w, "stamping")
    if args.skip_vllm:
        return row
    small = vllm_client(port, tok_dir, n, conc, inp, out)
    row["vllm"] = small
    ours_keys = [k for k in row if k.startswith("ours_")]
    row["ratio_tok_s"] = max(row[k]["tok_s"] for k in ours_keys) / small["tok_s"]
    row["ratio_cpu_per_token"] = {
        k: small["cpu_us_per_token"] / row[k]["cpu_us_per_token"]
        for k in ours_keys
        if "cpu_us_per_token" in row[k]
    }
    return row


def print_tables(result: dict[str, Any]) -> None:
    print(
        f"\n{'conc':>5} {'client':>20} {'tok/s':>9} {'x vllm':>7} {'cpu us/tok':>11} {'x vllm':>7}"
    )
    for row in result["throughput"]:
        v = row.get("vllm")
        for key in [k for k in row if k.startswith("ours_")] + (["vllm"] if v else []):
            r = row[key]
            cpu = r.get("cpu_us_per_token")
            tr = f"{r['tok_s'] / v['tok_s']:7.2f}" if v else "      -"
            cr = f"{v['cpu_us_per_token'] / cpu:7.2f}" if (v and cpu) else "      -"
            cpu_s = f"{cpu:11.2f}" if cpu else "          -"
            print(f"{row['concurrency']:>5} {key:>20} {r['tok_s']:>9.0f} {tr} {cpu_s} {cr}")
    print(f"\n{'conc':>5} {'loop':>9} {'tok/s':>7} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}")
    for o in result["overhead"]:
        print(
            f"{o['concurrency']:>5} {o['loop']:>9} {o['tok_s']:>7.0f} {o['p50_us']:>8.1f} "
            f"{o['p90_us']:>8.1f} {o['p99_us']:>8.1f}"
        )
    print(f"\n{'conc':>5} {'reads':>8} {'dispatch p50 us':>16} {'p99 us':>8} (per-read stamps)")
    for o in result["loop_overhead"]:
        print(f"{o['concurrency']:>5} {o['reads']:>8} {o['p50_us']:>16.1f} {o['p99_us']:>8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--requests-per-slot", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--delay-ms", type=float, default=10.0, help="decode step, overhead runs")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_client.json"))
    args = ap.parse_args()

    result: dict[str, Any] = {"args": vars(args), "cpus": os.cpu_count(), "throughput": []}
    result["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    result["load_avg_start"] = os.getloadavg()
    server, port = start_server()
    try:
        with tempfile.TemporaryDirectory() as td:
            tok_dir = Path(td) / "tok"
            make_tokenizer(tok_dir)
            for conc in args.concurrency:
                row = throughput_row(port, tok_dir, conc, args)
                result["throughput"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        server.kill()
        server.wait()
    result["overhead"] = []
    result["loop_overhead"] = []
    all_cpus = os.sched_getaffinity(0)
    for conc in [1, *args.concurrency]:
        n = max(2 * conc, 16)
        for loop in (*LOOPS, "dispatch"):
            if loop == "dispatch" and conc == 1:
                continue
            # A fresh server each time: its write log is keyed by request index.
            server, port = pinned_server("--stamp", "--delay-ms", str(args.delay_ms))
            try:
                if loop == "dispatch":
                    result["loop_overhead"].append(loop_overhead(port, n, conc, args.output_len))
                    continue
                row = overhead(port, n, conc, args.output_len, args.delay_ms, loop)
                result["overhead"].append(row)
                print(json.dumps(row), flush=True)
            finally:
                server.kill()
                server.wait()
                os.sched_setaffinity(0, all_cpus)
    result["load_avg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print_tables(result)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
