"""Measure one *run* of a spec against an endpoint: an SLO search, or one fixed-concurrency load.

Shared by the plain perf test (N runs against one server) and the A/B gate (runs interleaved
over two servers), so both measure, warm-start and print progress the same way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import MoePerfError
from pytest_moeperf.hygiene.machine import MachineWatch
from pytest_moeperf.load.warmstart import Pace
from pytest_moeperf.metrics.energy import EnergyMeter, NotMeasuredMeter
from pytest_moeperf.run.figures import MbuInputs
from pytest_moeperf.run.probe import Endpoint, RunMeasurement
from pytest_moeperf.spec.model import Slo, Spec

#: A search run starts at the previous run's boundary on the same server, aims next at the
#: previous run's lowest miss, and keeps the probe length the previous run found it needed.
#: Pause before loading a server when the previous load went to another one. vLLM's workers
#: busy-poll their shared-memory queue for 1 s after their last step (``SpinCondition``,
#: ``busy_loop_s=1``); on the CPU backend every server's worker is bound to the same core, so a
#: run that started inside that second lost half its throughput (a CPU A/B of identical kernels
#: read -50 % for the side measured right after the other).
SWITCH_SETTLE_S = 1.5
#: Share of the CPUs taken by steal and other processes over a run that the run line names.
BUSY_MACHINE = 0.05
#: On a GPU the warm-up climbs batch sizes 1, 2, 4, ... up to this (or max-num-seqs): fused-MoE
#: picks a Triton tiling per batch size and compiles each on first use, which stalls the engine
#: for seconds; a single-level warm-up left the first Poisson probe (batches of 1-10) to pay.
WARM_MAX_BATCH = 64
#: On a GPU the warm-up ends with this many seconds of Poisson load at the search's first rate:
#: on the H200 (2026-12-03) the first probe after the closed-loop warm-up missed at 8 req/s
#: (prompt throughput 5-8.5k tok/s for 8.2k offered) while the same rate met in the next run,
#: with no Triton JIT logged during it. The cause is not known; the open-loop phase makes the
#: first measured probe the second open-loop load the server sees, as every later one is.
WARM_OPEN_LOOP_S = 20.0
#: Tokens per streamed chunk above which a probe's progress line says so (``tokens_per_chunk``
#: in ``metrics/summary.py``): the stream was read late, by the API server or this client.
MERGED_CHUNKS = 1.1
#: The first search run starts at this share of what the warm-up's highest closed-loop level
#: finished per second (never below ``search.rate_min``, which is then only the floor). Closed
#: loop at a few requests in flight finishes about as fast as the server can go; half of it is
#: likely to meet the SLO, and one x4 step brackets the boundary. From a fixed rate_min a fast
#: machine paid one or two probes climbing, and a slow one (a 3-5x slower VM, or the e2e test's
#: slowed server) could find "SLO not met at the lowest rate".
WARM_START_FRACTION = 0.5
#: Output tokens of every warm-up level but the last. Those levels are there to compile the
#: tiling of each decode batch size, which a few decode steps at that batch do; with chat-mix's
#: outputs (median 256, p90 1,024 tokens, ~25 s at the tail on an H100) two requests a level cost
#: 20-30 s each, and the ladder took ~3 of the ~7 minutes before chat-mix's first probe. The last
#: level keeps the workload's lengths: its throughput sets the search's first rate.
WARM_COMPILE_TOKENS = 16


def warm_levels(spec: Spec, gpu: bool) -> tuple[int, ...]:
    """Concurrency levels of the warm-up: the spec's (or 8) alone on the CPU, which compiles
    nothing per batch size; on a GPU, powers of two up to min(max-num-seqs, WARM_MAX_BATCH) and
    the spec's own level."""
    a = spec.arrival
    own = a.concurrency if a.process == "concurrency" and a.concurrency else 8
    if not gpu:
        return (own,)
    cap = max(1, min(spec.max_num_seqs, WARM_MAX_BATCH))
    levels = {1 << i for i in range(cap.bit_length()) if 1 << i <= cap}
    return tuple(sorted(levels | {min(own, spec.max_num_seqs)}))


def probe_budget(spec: Spec, quick: bool = False) -> tuple[int, int]:
    """(requests a probe sends at least, probes a search may make): the spec's ``search``
    values, else the workload's size and 7; quick mode halves the first and caps the second."""
    search = spec.search
    requests = (search.probe_requests if search and search.probe_requests
                else spec.workload.num_requests or 40)  # fmt: skip
    probes = search.max_probes if search else 7
    if quick:
        requests, probes = max(10, requests // 2), min(probes, 4)
    return requests, probes


@dataclass
class RunDriver:
    """Everything a run needs besides the endpoint; ``say`` prints one progress line."""

    spec: Spec
    slo: Slo
    meter: EnergyMeter
    vocab_size: int
    mbu_inputs: MbuInputs | None
    probe_requests: int
    max_probes: int
    say: Callable[[str], None] = lambda line: None
    #: (endpoint, run number, probe number, rate) before each probe: the probe-start hook.
    probe_start: Callable[[Endpoint, int, int, float], None] | None = None
    #: warm-up concurrency levels (``warm_levels``); empty: the CPU's single level
    warm: tuple[int, ...] = ()
    #: where every load's records are written (``--moeperf-records``), or None
    records_dir: Path | None = None
    #: reads the machine beside each run (``hygiene/machine.py``); None: not read
    machine_watch: Callable[[], MachineWatch] | None = MachineWatch
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _warm: dict[str, tuple[float, float | None, float | None]] = field(default_factory=dict)
    #: per server: rate -> the longer send span a too-short probe there needed (measure_run)
    _longer: dict[str, dict[float, float]] = field(default_factory=dict)
    #: per server: the paces (median TTFT, TPOT) seen so far, which size warm starts
    _paces: dict[str, list[Pace]] = field(default_factory=dict)
    _last_load: tuple[str, float] | None = None  # (server URL, when its last load ended)

    @property
    def fixed_concurrency(self) -> int | None:
        """The concurrency of a fixed-load spec (``arrival.process: concurrency``), else None."""
        a = self.spec.arrival
        return a.concurrency if a.process == "concurrency" else None

    @property
    def spec_rate_min(self) -> float:
        s = self.spec
        return s.search.rate_min if s.search else (s.arrival.rate or 1.0)

    def warm_up(self, endpoint: Endpoint, label: str, *, seeded: bool = False) -> None:
        """Unmeasured closed-loop load on a fresh server: the first batches pay for Triton JIT
        compiles and cold caches (a first run on an H200 came out half as fast as the next).
        ``seeded``: the first search will start from a baseline's bracket (``seed_bracket``
        says so), so the warm-up line does not name another start (a night's log said both)."""
        from pytest_moeperf.run.probe import measure_fixed

        levels = self.warm or warm_levels(self.spec, gpu=False)
        self._settle(endpoint)
        sent, thr = 0, 0.0
        w = self.spec.workload
        short = replace(self.spec, workload=replace(w, max_output_tokens=min(
            WARM_COMPILE_TOKENS, w.max_output_tokens or WARM_COMPILE_TOKENS)))  # fmt: skip
        for i, c in enumerate(levels):
            n = max(4, 2 * c)
            spec = self.spec if i == len(levels) - 1 else short
            run = measure_fixed(endpoint, spec, self.slo, index=999 + i,
                                meter=NotMeasuredMeter("warm-up"), vocab_size=self.vocab_size,
                                concurrency=c, num_requests=n, mbu_inputs=None)  # fmt: skip
            fixed = run.fixed or {}
            if not fixed.get("n_ok"):
                raise WarmUpFailed(endpoint.base_url, fixed)
            sent += n
            thr = float(fixed.get("request_throughput") or 0.0)
        if (pace := _fixed_pace(fixed, levels[-1])) is not None:
            self._paces.setdefault(endpoint.base_url, []).append(pace)
        at = f"concurrency {levels[0]}" if len(levels) == 1 else (
            f"concurrency {', '.join(map(str, levels))} in turn, "
            f"{short.workload.max_output_tokens} output tokens below {levels[-1]}")  # fmt: skip
        start, first = self.spec_rate_min, ""
        if self.fixed_concurrency is None and thr > 0:
            why = "search.rate_min"
            if WARM_START_FRACTION * thr > start:
                start = WARM_START_FRACTION * thr
                why = (f"{WARM_START_FRACTION:g} x the {thr:.3g} req/s finished at concurrency "
                       f"{levels[-1]}")  # fmt: skip
            top = self.spec.search.rate_max if self.spec.search else None
            if top is not None and start > top:
                start, why = top, why + ", capped at search.rate_max"
            self._warm[endpoint.base_url] = (start, None, None)  # the first run's start
            first = "" if seeded else f"; the first search starts at {start:.3g} req/s ({why})"
        if len(levels) > 1:  # a GPU: then the open-loop pattern the probes use
            paces = self._paces.setdefault(endpoint.base_url, [])
            sent += self._open_loop(endpoint, start, math.ceil(start * WARM_OPEN_LOOP_S), paces)
            at += f", then Poisson at {start:.3g} req/s for {WARM_OPEN_LOOP_S:g} s"
        self._last_load = (endpoint.base_url, self.clock())
        self.say(f"{label}: warmed up ({sent} requests at {at}, not measured){first}")

    def seed_bracket(self, endpoint: Endpoint, label: str, met: float, missed: float,
                     source: str) -> None:  # fmt: skip
        """The first search starts from a stored baseline's bracket, as later runs start from
        the first's: a nightly whose server is unchanged certifies it in two probes a run,
        where a search from the warm-up's rate took 7 (H100 chat-mix, 2026-12-06). Each probe
        is still a fresh load; the boundary rests on this run's probes only."""
        if self.fixed_concurrency is not None:
            return
        _, _, span = self._warm.get(endpoint.base_url, (self.spec_rate_min, None, None))
        self._warm[endpoint.base_url] = (met, missed, span)
        self.say(f"{label}: the first search starts from the baseline's bracket, met {met:.3g}, "
                 f"missed {missed:.3g} req/s ({source})")  # fmt: skip

    def _open_loop(self, endpoint: Endpoint, rate: float, n: int, paces: list[Pace]) -> int:
        """Unmeasured Poisson load (its own seeds, never a probe's requests); returns n and
        adds its pace to ``paces``."""
        from pytest_moeperf.load.requests import build_requests
        from pytest_moeperf.load.runner import run_load
        from pytest_moeperf.load.serverstats import wait_idle

        s = self.spec
        requests = build_requests(s.workload, vocab_size=self.vocab_size,
                                  max_model_len=s.model.max_model_len, rate=rate,
                                  burstiness=s.arrival.burstiness, n=n,
                                  seed_offset=10**7)  # fmt: skip
        wait_idle(endpoint.base_url)
        run = run_load(endpoint.base_url, endpoint.model, requests, mode="poisson",
                       burstiness=s.arrival.burstiness, seed=s.workload.seed + 1,
                       target=rate)  # fmt: skip
        if (pace := Pace.of(run.requests, rate, "warm-up Poisson load")) is not None:
            paces.append(pace)
        return n

    def run(
        self, endpoint: Endpoint, index: int, label: str, *, concurrency: int | None = None
    ) -> RunMeasurement:
        """Run ``index`` against ``endpoint``; the same index sends the same requests.

        ``concurrency`` forces a fixed-load run (a sweep level) whatever the spec says.
        """
        self._settle(endpoint)
        watch = self.machine_watch() if self.machine_watch is not None else None
        if watch is not None:
            watch.start()
        try:
            run = self._run(endpoint, index, label, concurrency)
        finally:
            self._last_load = (endpoint.base_url, self.clock())
            during = watch.stop() if watch is not None else None
        run.machine = during
        if during is not None and during.left < 1 - BUSY_MACHINE:
            self.say(f"{label}: the machine was busy during the run: {during.text()}")
        return run

    def _settle(self, endpoint: Endpoint) -> None:
        """Wait out the previous server's idle spin when the load moves to another server."""
        if self._last_load is None or self._last_load[0] == endpoint.base_url:
            return
        left = SWITCH_SETTLE_S - (self.clock() - self._last_load[1])
        if left > 0:
            self.sleep(left)

    def _run(
        self, endpoint: Endpoint, index: int, label: str, concurrency: int | None
    ) -> RunMeasurement:
        from pytest_moeperf.run.probe import measure_fixed

        level = concurrency or self.fixed_concurrency
        if level is not None:
            # the spec's level gets the spec's request count; a sweep level gets four waves
            n = max(self.probe_requests, 2 * level) if concurrency is None else max(8, 4 * level)
            run = measure_fixed(
                endpoint,
                self.spec,
                self.slo,
                index=index,
                meter=self.meter,
                vocab_size=self.vocab_size,
                concurrency=level,
                num_requests=n,
                mbu_inputs=self.mbu_inputs,
            )
            s = run.fixed or {}
            self.say(
                f"{label}: concurrency {level}: {run.metrics['output_tok_s']:.4g} tok/s "
                f"(ttft p99 {_ms(s, 'ttft')}, tpot p99 {_ms(s, 'tpot')})"
            )
            return run
        start, hint, span = self._warm.get(endpoint.base_url, (self.spec_rate_min, None, None))
        run = self._search(endpoint, index, label, start, hint, span)
        assert run.search is not None
        lo, hi = run.search.bracket
        if lo is not None:
            self._warm[endpoint.base_url] = (lo, hi, run.probe_span_s)
            goodput = run.metrics.get("slo_goodput_tok_s")
            if goodput is not None and run.search.estimate is not None and hi is None:
                self.say(f"{label}: SLO met at search.rate_max {lo:.4g} req/s, SLO goodput "
                         f"{goodput:.4g} tok/s: both are floors, the boundary is higher (raise "
                         "search.rate_max to find it)")  # fmt: skip
            elif goodput is not None and run.search.estimate is not None:
                self.say(f"{label}: SLO boundary {run.search.estimate:.4g} req/s (met {lo:.3g}, "
                         f"missed {hi:.3g}), SLO goodput {goodput:.4g} tok/s")  # fmt: skip
        if not run.complete and run.incomplete_reason:
            self.say(f"{label}: does not count: {run.incomplete_reason}")
        return run

    def _search(
        self, endpoint: Endpoint, index: int, label: str, start: float,
        hint_hi: float | None = None, span: float | None = None,
    ) -> RunMeasurement:  # fmt: skip
        from pytest_moeperf.metrics.summary import failed_text
        from pytest_moeperf.run.probe import measure_run

        def progress(k: int, rate: float, res: Any) -> None:
            s = res.summary
            st = s.get("steady") or {}
            keep = st.get("completion_ratio")
            kept = f", finished {100 * keep:.0f} % of due" if keep == keep and keep else ""
            merged = s.get("tokens_per_chunk") or 0.0
            if merged > MERGED_CHUNKS:  # the stream was read late: say so where it is seen
                kept += f", {merged:.1f} tokens a chunk"
            kept += _preempted_text(s.get("server"))
            kept += _lag_text(s.get("send_lag_p99_ms"), self.slo.ttft_p99_ms)
            kept += _warm_text(s.get("warm_start"))
            why = f": {res.reason}" if not res.met and res.reason else ""
            self.say(
                f"{label} probe {k + 1} rate {rate:.3g} req/s: "
                f"{'met' if res.met else 'missed'} (ttft p99 {_ms(s, 'ttft')}, "
                f"tpot p99 {_ms(s, 'tpot')}, attainment "
                f"{100 * s['slo_attainment']:.0f} %{kept}{failed_text(s)}){why}"
            )

        def started(k: int, rate: float) -> None:
            if self.probe_start is not None:
                self.probe_start(endpoint, index + 1, k, rate)

        return measure_run(
            endpoint,
            self.spec,
            self.slo,
            index=index,
            meter=self.meter,
            vocab_size=self.vocab_size,
            rate_min=self.spec_rate_min,
            probe_requests=self.probe_requests,
            max_probes=self.max_probes,
            mbu_inputs=self.mbu_inputs,
            on_probe=progress,
            on_probe_start=started,
            start_rate=start,
            hint_hi=hint_hi,
            min_span_s=span,
            say=self.say,
            longer_at=self._longer.setdefault(endpoint.base_url, {}),
            paces=self._paces.setdefault(endpoint.base_url, []),
            records_dir=self.records_dir,
        )


class WarmUpFailed(MoePerfError):
    """Not one warm-up request succeeded: measuring would only report 'SLO not met'."""

    def __init__(self, base_url: str, fixed: dict[str, Any]) -> None:
        failed = ", ".join(f"{k} {v}" for k, v in sorted((fixed.get("failed_by_status")
                                                          or {}).items()))  # fmt: skip
        first = fixed.get("first_error") or "no error text"
        super().__init__(
            f"every warm-up request to {base_url} failed ({failed or 'no answer'}); first error: "
            f"{first}. Check that the server serves /v1/completions for this model and that "
            "the spec's prompt lengths fit its max_model_len"
        )


def _fixed_pace(fixed: dict[str, Any], level: int) -> Pace | None:
    """The pace of a closed-loop warm-up level (median TTFT and TPOT), if it had both."""
    ttft, tpot = (fixed.get(k, {}).get("p50_ms") for k in ("ttft", "tpot"))
    if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in (ttft, tpot)):
        return None
    return Pace(ttft / 1e3, tpot / 1e3, None, f"warm-up at concurrency {level}")


def _ms(summary: dict[str, Any], key: str) -> str:
    v = summary.get(key, {}).get("p99_ms")
    if v is None or v != v:  # NaN: no request had it (TPOT of one-token outputs)
        return "not measured"
    return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def _preempted_text(server: Any) -> str:
    """ ", N preemptions (KV cache peak X %)" when the server preempted during the probe.

    A preempted request is recomputed: a boundary with preemptions sits at the KV cache's
    capacity, where a small change in arrivals tips the server over (H100, 2026-12-05: the
    plugin met 20.3 req/s at 11 preemptions and 99.9 % KV use, vLLM's bench missed it).
    """
    if not isinstance(server, dict) or not server.get("preemptions"):
        return ""
    peak = server.get("max_kv_cache_usage")
    kv = f" (KV cache peak {100 * peak:.0f} %)" if isinstance(peak, int | float) else ""
    return f", {server['preemptions']} preemptions{kv}"


def _warm_text(warm: Any) -> str:
    """ ", warm start N requests, window from T s" for a warm-started probe."""
    if not isinstance(warm, dict) or not warm.get("requests"):
        return ""
    fill = warm.get("fill_s")
    when = f", window from {fill:.1f} s" if isinstance(fill, int | float) and fill < 1e9 else ""
    return f", warm start {warm['requests']} requests{when}"


#: A client that sends this late (p99, as a share of the TTFT SLO) is named on the probe line.
LATE_SEND_SHARE = 0.05


def _lag_text(lag_ms: Any, ttft_slo_ms: float) -> str:
    """ ", client sent p99 X ms late" when the load client fell behind its own schedule.

    Then the offered load was not the schedule's and the client's own contention is in the
    figures: on a 2-vCPU VM the client's p99 send lag was 0.5-2 s in every probe near the
    boundary, and a 60 s run at the reported rate saw 3.1 s and missed where vLLM's bench met.
    """
    if not isinstance(lag_ms, int | float) or not lag_ms > LATE_SEND_SHARE * ttft_slo_ms:
        return ""
    return f", client sent p99 {lag_ms:.0f} ms late"
