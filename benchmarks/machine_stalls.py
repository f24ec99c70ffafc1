"""Is it the client or the machine? The plugin's send lag beside an independent heartbeat.

Usage (the embedded default on a small VM; ~1 min a run plus one server start):
    .venv/bin/python benchmarks/machine_stalls.py --rate 14 --seconds 30 --runs 2 [--renice 10]

Starts one vLLM server with the spec's flags (the plugin's launcher and warm-up), then, per run,
sends the plugin's own Poisson load at ``--rate`` while a separate, idle Python process sleeps
10 ms at a time and records how late each wake-up was. If the heartbeat is late by about as much
as the client's sends, the machine stalled every process, not the client alone. With
``--renice N`` every other run lowers the server's priority by N (each of its threads), to see
whether the client's share of the CPU is the limit. With ``--spin`` every other run has one
SCHED_IDLE busy loop per CPU beside it (it yields to any other thread, so it only keeps idle
vCPUs from halting): whether the stalls are the hypervisor waking a halted vCPU late. Runs
alternate, so both kinds share the VM's slower swings. Prints one line per run;
docs/steady-state.md has the figures of 2026-12-05 and 2026-12-06.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "h200"))

HEARTBEAT = """
import sys, time
late, end = [], time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.perf_counter(); time.sleep(0.01); late.append(time.perf_counter() - t - 0.01)
late.sort(); n = len(late)
print(f"{late[n // 2] * 1e3:.1f} {late[int(n * 0.99)] * 1e3:.1f} {late[-1] * 1e3:.1f}")
"""


SPIN = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while True:
    pass
"""


def spinners(on: bool) -> list[subprocess.Popen[bytes]]:
    """One SCHED_IDLE busy loop per CPU of this process when ``on``."""
    cpus = sorted(os.sched_getaffinity(0)) if on else []
    return [subprocess.Popen([sys.executable, "-c", SPIN, str(c)]) for c in cpus]


def renice(pids: list[int], n: int) -> None:
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            subprocess.run(["renice", "-n", str(n), "-p", task.name], capture_output=True)


def main() -> None:
    import numpy as np
    from long_run_check import prepare, warm_server  # type: ignore[import-not-found]

    from pytest_moeperf.load.requests import build_requests
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.load.serverstats import wait_idle

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "perf_tests" / "specs" / "cpu-smoke.yaml"))
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--renice", type=int, default=0)
    ap.add_argument("--spin", action="store_true", help="every other run beside idle spinners")
    a = ap.parse_args()
    _, spec, model_dir, factory = prepare(a.spec, "moeperf-results/machine-stalls")
    try:
        url, served, vocab = warm_server(spec, factory, model_dir, "machine stalls")
        group = str(factory.servers[0].pgid)  # the server's session: API, engine, worker
        found = subprocess.run(["pgrep", "-g", group], capture_output=True, text=True)
        pids = [int(x) for x in found.stdout.split()]
        print("run | server nice | spinners | send lag p50/p99 ms | TTFT p50/p99 ms | "
              "heartbeat late p50/p99/max ms")  # fmt: skip
        for k in range(a.runs):
            nice = a.renice if (a.renice and k % 2) else 0
            renice(pids, nice)
            wait_idle(url)
            spin = spinners(a.spin and k % 2 == 1)
            hb = subprocess.Popen([sys.executable, "-c", HEARTBEAT, str(a.seconds)],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
            reqs = build_requests(spec.workload, vocab_size=vocab,
                                  max_model_len=spec.model.max_model_len, rate=a.rate,
                                  burstiness=1.0, n=int(a.rate * a.seconds),
                                  seed_offset=100 + k)  # fmt: skip
            try:
                run = run_load(url, served, reqs, mode="poisson", target=a.rate)
                beat = hb.communicate()[0].split()
            finally:
                for sp in spin:
                    sp.kill()
                    sp.wait()
            lag = [r.send_s - r.scheduled_s for r in run.requests]
            ttft = [r.first_token_s - r.send_s for r in run.requests if r.first_token_s]
            p = lambda xs, q: f"{np.percentile(xs, q) * 1e3:.0f}"  # noqa: E731
            print(f"{k + 1} | {nice} | {len(spin)} | {p(lag, 50)} / {p(lag, 99)} | {p(ttft, 50)} / "
                  f"{p(ttft, 99)} | {' / '.join(beat)}", flush=True)  # fmt: skip
    finally:
        factory.stop_all()


if __name__ == "__main__":
    main()
