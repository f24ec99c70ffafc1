"""One measured run: the SLO boundary search over real load, with energy and MBU at the boundary.

A *run* (the unit the variance band is measured over) is one full search: every probe is a fresh
seeded open-loop Poisson load against the server, bracketed by the energy meter. The metrics of
the run are those of the probe at the boundary rate: SLO goodput is its output tok/s.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pytest_moeperf.errors import MoePerfError
from pytest_moeperf.hygiene.machine import MachineDuring
from pytest_moeperf.load.records import RequestRecord, RunRecord
from pytest_moeperf.load.warmstart import past_burst
from pytest_moeperf.metrics.energy import EnergyMeter, EnergyReading
from pytest_moeperf.run.abort import AbortCheck, AbortPolicy
from pytest_moeperf.run.figures import MbuInputs, boundary_metrics, energy_and_mbu, finite
from pytest_moeperf.run.search import ProbeResult, SearchResult
from pytest_moeperf.run.window import (
    DRAIN_CUT,
    drain_end,
    fill_up_info,
    mark_cut,
    needed_span,
    send_span,
    steady_check,
    summarize_steady,
    warm_plan,
    window_pace,
)
from pytest_moeperf.spec.model import Slo, Spec

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_moeperf.load.warmstart import Pace

#: Default shortest send span of a search probe: enough for a queue to build at that rate.
MIN_PROBE_SPAN_S = 5.0
#: The schedule (arrival pattern, lengths) of every search probe of every run: common random
#: numbers. With a fresh Poisson draw per probe, p99 TTFT near the boundary is dominated by
#: which bursts a 25 s draw happens to hold, and the H200 boundary moved 8-24 req/s between
#: runs (docs/results/h200-nightly-2026-12-04b); with one schedule, a probe at a higher rate
#: is the same traffic played faster, p99(rate) is one curve, and what differs between runs
#: (and between a baseline and a candidate) is the server. Prompts stay fresh per probe.
SEARCH_SCHEDULE = 0
#: How a run turns probes into its figures. A baseline measured another way is another
#: experiment: it is part of the key's spec hash (``keyed_spec_hash``), so its file is not
#: found and the test says there is no baseline, instead of judging one estimator against
#: another. 2: one schedule for all probes, the boundary interpolated inside the bracket,
#: goodput = rate x tokens per request.
MEASUREMENT_VERSION = 2


def keyed_spec_hash(spec: Spec, slo: Slo | None = None) -> str:
    """The spec's hash with ``MEASUREMENT_VERSION`` folded in (16 hex digits): the key field.

    ``slo``: the SLO the run judged by, folded in where it is not the spec's own (a
    ``moeperf_slo`` marker): the boundary, so every searched figure, belongs to its SLO, and a
    tightened marker compared with the old baseline read as a regression. Where they agree the
    hash is the spec's alone, so baselines recorded before this rule keep their key."""
    import hashlib

    def ms(v: float | None) -> str:  # a marker's 1000 and a spec's 1000.0 are one SLO
        return "none" if v is None else repr(float(v))

    own = "" if slo is None or slo == spec.slo else (
        f"/slo{ms(slo.ttft_p99_ms)},{ms(slo.tpot_p99_ms)},{ms(slo.e2el_p99_ms)}")  # fmt: skip
    return hashlib.sha256(f"{spec.hash()}/m{MEASUREMENT_VERSION}{own}".encode()).hexdigest()[:16]


class ServerDied(MoePerfError):
    """The server process exited while a probe was running.

    ``probe_number`` counts from 1 within the run, as the progress lines do; ``partial`` holds
    the run's finished probes and a last entry for the probe the server died in; ``load``
    names a fixed operating point ("concurrency 8") instead of the rate.
    """

    def __init__(self, probe_number: int, rate: float, partial: list[dict[str, Any]],
                 load: str | None = None) -> None:  # fmt: skip
        self.probe_number = probe_number
        self.rate = rate
        self.partial = partial
        where = load or f"rate {rate:g} req/s"
        super().__init__(f"server died during probe {probe_number} at {where}")


@dataclass
class Endpoint:
    """Where the load goes, and how to tell whether the server behind it is still alive."""

    base_url: str
    model: str
    alive: Callable[[], bool] = lambda: True
    server_pid: int | None = None  # leads the server's process group; None when external


@dataclass
class RunMeasurement:
    """One run: an SLO search (``search``) or one fixed-concurrency load (``fixed``)."""

    index: int
    search: SearchResult | None
    energy: list[dict[str, Any]]  # one reading per probe, in probe order
    metrics: dict[str, float | None]
    notes: list[str] = field(default_factory=list)
    fixed: dict[str, Any] | None = None  # the load summary of a fixed-concurrency run
    probe_span_s: float | None = None  # the send span the run's probes ended up needing
    machine: MachineDuring | None = None  # the machine as the run had it (hygiene/machine.py)

    @property
    def complete(self) -> bool:
        """A run counts for a baseline only when its headline metric was measured and, for a
        search, the search converged: an unconverged bracket's lower end is a lower bound, not
        the boundary, and would drag a baseline down by up to the bracket's width."""
        key = "slo_goodput_tok_s" if self.search is not None else "output_tok_s"
        if self.search is not None and not self.search.converged:
            return False
        return self.metrics.get(key) is not None

    @property
    def incomplete_reason(self) -> str | None:
        """Why the run does not count, in one phrase (None when it does)."""
        if self.complete:
            return None
        if self.search is not None and not self.search.converged:
            lo, hi = self.search.bracket
            width = f"{lo:.3g}..{hi:.3g} req/s" if lo and hi else "no bracket"
            return (f"search did not converge ({self.search.note}; bracket {width}, tolerance "
                    f"{100 * self.search.tolerance:g} %)")  # fmt: skip
        return "headline metric not measured"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = self.search.to_dict() if self.search is not None else {}
        d.update(index=self.index, energy=self.energy, metrics=self.metrics, notes=self.notes)
        if self.fixed is not None:
            d["fixed"] = self.fixed
        if self.machine is not None:
            d["machine"] = self.machine.to_dict()
        return d


def measure_run(
    endpoint: Endpoint, spec: Spec, slo: Slo, *, index: int, meter: EnergyMeter,
    vocab_size: int, rate_min: float, probe_requests: int, max_probes: int,
    mbu_inputs: MbuInputs | None,
    on_probe: Callable[[int, float, ProbeResult], None] | None = None,
    on_probe_start: Callable[[int, float], None] | None = None,
    start_rate: float | None = None, hint_hi: float | None = None,
    min_span_s: float | None = None, say: Callable[[str], None] | None = None,
    longer_at: dict[float, float] | None = None, paces: list[Pace] | None = None,
    records_dir: Path | None = None,
) -> RunMeasurement:  # fmt: skip
    """One search; ``on_probe_start(probe_number, rate)`` is called before each probe's load.

    ``start_rate`` / ``hint_hi`` carry an earlier run's bracket (see ``search_slo_boundary``);
    ``min_span_s`` an earlier run's probe length. A probe too short to judge a steady state is
    run again, longer, at the same rate (``MAX_EXTENSIONS`` times at most). ``longer_at``
    (rate -> send span, shared by the runs of one server and updated here) remembers the spans
    such reruns needed: a later probe within ``NEAR_RATE`` of such a rate starts that long.
    Every probe replays one schedule, so the same rate would come out too short again (a
    2-core e2e run reran 8 probes, 4 of them at rates already rerun, ~15 s each). ``paces``
    (shared like ``longer_at``, appended to here) size a spec's warm start (``load.warmstart``).
    ``records_dir``: every load's records are written there (``load.records.write_records``).
    """
    from pytest_moeperf.run.search import search_slo_boundary

    energy: list[dict[str, Any]] = []
    readings: dict[float, tuple[EnergyReading, RunRecord]] = {}
    done: list[dict[str, Any]] = []
    rate_max = spec.search.rate_max if spec.search else None
    spec_span = spec.search.probe_duration_s if spec.search else None
    span = {"s": max(filter(None, (spec_span, min_span_s)), default=None)}

    def size(rate: float, longer: float | None = None) -> int:
        return probe_size(rate, probe_requests, longer or span["s"])

    def probe(rate: float, abort: AbortCheck) -> ProbeResult:
        """A probe, rerun longer while too short to judge; the discarded loads are listed in
        the kept probe's summary (``too_short_attempts``), not as probes of their own."""
        discarded: list[dict[str, Any]] = []
        result, longer = None, remembered_span(longer_at, rate)
        for attempt in range(MAX_EXTENSIONS + 1):
            if discarded:
                energy.pop()
                done.pop()
            result, needed = probe_once(rate, abort, longer)
            if discarded:
                result = replace(
                    result, summary={**result.summary, "too_short_attempts": list(discarded)}
                )
                done[-1] = result.to_dict()
            if needed is None or attempt == MAX_EXTENSIONS:
                return result
            discarded.append({"send_span_s": result.summary.get("send_span_s"),
                              "reason": result.reason})  # fmt: skip
            here, everywhere = needed
            longer = max(here, 1.5 * _send_span_of(size(rate, longer), rate))
            if longer_at is not None:
                longer_at[rate] = max(longer_at.get(rate, 0.0), longer)
            # what latency asks for holds at every rate; what a count of sends asks for only
            # here (at 4 req/s, 30 sends took 16 s, and every later probe paid 16 s at 15 req/s)
            span["s"] = max(span["s"] or 0.0, everywhere) or None
            if say is not None:
                say(f"  probe at {rate:.3g} req/s too short to judge a steady state "
                    f"({result.reason}); again with {longer:.0f} s of sends")  # fmt: skip
        assert result is not None
        return result

    def probe_once(
        rate: float, abort: AbortCheck, longer: float | None
    ) -> tuple[ProbeResult, tuple[float, float] | None]:
        from pytest_moeperf.load.requests import build_requests
        from pytest_moeperf.load.runner import run_load
        from pytest_moeperf.load.serverstats import Sampler, wait_idle

        i = len(done)
        requests = build_requests(
            spec.workload, vocab_size=vocab_size, max_model_len=spec.model.max_model_len,
            rate=rate, burstiness=spec.arrival.burstiness, n=size(rate, longer),
            seed_offset=1000 * index + i, schedule_offset=SEARCH_SCHEDULE,
        )  # fmt: skip
        warm = warm_plan(spec, paces or [], rate, vocab_size, seed=(1000 * index + i,))
        if warm is not None:
            requests = [*warm.requests, *requests]

        cut_at = drain_end(spec, requests)
        span_s = size(rate, longer) / rate if rate > 0 else math.inf

        def should_abort(records: Sequence[RequestRecord], now_s: float) -> str | None:
            if not endpoint.alive():
                return "server process exited"
            if cut_at is not None and now_s >= cut_at:
                return DRAIN_CUT
            # the burst and its queue are no SLO, until it takes half the probe's sends
            return abort(past_burst(records, now_s, 0.5 * span_s), now_s)

        idle = wait_idle(endpoint.base_url)  # never inherit the previous probe's queue
        if on_probe_start is not None:
            on_probe_start(i + 1, rate)
        sampler = Sampler(endpoint.base_url)
        sampler.start()
        meter.start()
        run = run_load(endpoint.base_url, endpoint.model, requests, mode="poisson",
                       burstiness=spec.arrival.burstiness, seed=spec.workload.seed,
                       target=rate, should_abort=should_abort)  # fmt: skip
        reading = meter.stop()
        stats = sampler.stop()
        run = mark_cut(run)
        if records_dir is not None:
            _keep_records(run, records_dir, index + 1, i + 1, rate, say)
        energy.append({"rate": rate, **reading.to_dict()})
        if not endpoint.alive():
            statuses = Counter(r.status for r in run.requests)
            done.append({"rate": rate, "aborted": True, "reason": "server died",
                         "partial": True, "planned_requests": len(requests),
                         "recorded_requests": len(run.requests),
                         "by_status": dict(sorted(statuses.items()))})  # fmt: skip
            raise ServerDied(i + 1, rate, done)
        fill, fill_info = fill_up_info(run, spec)
        summary = summarize_steady(run, slo, spec, fill_s=fill)
        result = ProbeResult.from_summary(rate, summary)
        if run.aborted_early and result.reason is None:
            result = replace(result, met=False, aborted=True, reason=run.abort_reason)
        check = steady_check(run, summary, slo, stats, fill_s=fill)
        extra = {"steady": check.to_dict(), "server": stats.to_dict(),
                 "idle_wait": idle.to_dict(), "send_span_s": send_span(run)}  # fmt: skip
        if warm is not None:
            extra["warm_start"] = {**warm.to_dict(), **fill_info, "fill_s": fill}
        result = replace(result, summary={**result.summary, **extra})
        needed: tuple[float, float] | None = None
        if not idle.idle:
            result = replace(result, met=False, reason=(
                f"server not idle before the probe: {dict(idle.last)} after "
                f"{idle.waited_s:.0f} s"))  # fmt: skip
        elif result.met and not check.steady:
            result = replace(result, met=False, reason="not a steady state: "
                             + "; ".join(check.reasons))  # fmt: skip
            if check.too_short and not run.aborted_early:
                needed = needed_span(summary, spec, rate, fill_s=fill)
        # only a met probe's pace sizes a warm start: a missed one's TTFT holds its queue
        # (H100, 2026-12-06: sized at an overloaded 11.1 req/s probe's pace, the 6.48 req/s
        # probe began with 240 requests, preempted 49 times and missed)
        if paces is not None and result.met and (pace := window_pace(run, summary, rate)):
            paces.append(pace)
        readings[rate] = (reading, run)
        done.append(result.to_dict())
        return result, needed

    search = search_slo_boundary(probe, slo=slo, rate_min=rate_min, rate_max=rate_max,
                                 tolerance=spec.search.tolerance if spec.search else 0.02,
                                 max_probes=max_probes, on_probe=on_probe,
                                 abort_policy=AbortPolicy(planned_requests=size),
                                 start_rate=start_rate, hint_hi=hint_hi)  # fmt: skip
    metrics, notes = boundary_metrics(search, readings, mbu_inputs)
    run_m = RunMeasurement(index, search, energy, metrics, notes, probe_span_s=span["s"])
    if (why := run_m.incomplete_reason) is not None and search.boundary_rate is not None:
        run_m.notes.append(f"run {index + 1} does not count: {why}")
    return run_m


#: Reruns of a probe that was too short to judge, each longer than the last.
MAX_EXTENSIONS = 2
#: A rerun's longer span carries to later probes at rates within this relative distance.
NEAR_RATE = 0.1


def remembered_span(longer_at: Mapping[float, float] | None, rate: float) -> float | None:
    """The longest span that a probe within ``NEAR_RATE`` of ``rate`` needed, if any."""
    spans = [s for r, s in (longer_at or {}).items() if abs(r - rate) <= NEAR_RATE * rate]
    return max(spans) if spans else None


def _send_span_of(n: int, rate: float) -> float:
    return n / rate if rate > 0 else 0.0


def probe_size(rate: float, probe_requests: int, span_s: float | None) -> int:
    """Requests of a probe at ``rate``: ``probe_requests``, or more if needed to keep sending
    for ``span_s`` seconds (default ``MIN_PROBE_SPAN_S``).

    A fixed count at a high rate is a burst that ends before a queue can form, so it "meets"
    any SLO (40 requests at 1,000 req/s were all sent in 40 ms and looked fine).
    """
    span = span_s if span_s is not None else MIN_PROBE_SPAN_S
    return max(probe_requests, math.ceil(rate * span))


def measure_fixed(
    endpoint: Endpoint, spec: Spec, slo: Slo, *, index: int, meter: EnergyMeter,
    vocab_size: int, concurrency: int, num_requests: int, mbu_inputs: MbuInputs | None,
) -> RunMeasurement:  # fmt: skip
    """One closed-loop run at a fixed concurrency: the case study's measurement, no search.

    Cheaper than a search (one load instead of several probes), so it suits A/B pairs and
    sweeps. The run's metrics are its steady-window output tok/s and p99 latencies; whether the
    SLO held is recorded, not searched for.
    """
    from pytest_moeperf.load.requests import build_requests
    from pytest_moeperf.load.runner import run_load

    requests = build_requests(
        spec.workload, vocab_size=vocab_size, max_model_len=spec.model.max_model_len,
        rate=1.0, burstiness=1.0, n=num_requests, seed_offset=1000 * index,
    )  # fmt: skip

    def should_abort(records: Sequence[RequestRecord], now_s: float) -> str | None:
        return None if endpoint.alive() else "server process exited"

    meter.start()
    run = run_load(endpoint.base_url, endpoint.model, requests, mode="concurrency",
                   concurrency=concurrency, seed=spec.workload.seed,
                   should_abort=should_abort)  # fmt: skip
    reading = meter.stop()
    energy = [{"concurrency": concurrency, **reading.to_dict()}]
    if not endpoint.alive():
        partial = [{"concurrency": concurrency, "aborted": True, "reason": "server died"}]
        raise ServerDied(1, float(concurrency), partial, load=f"concurrency {concurrency}")
    summary = summarize_steady(run, slo, spec)
    s = summary.to_dict()
    m: dict[str, float | None] = {
        "output_tok_s": float(summary.output_tok_s),
        "ttft_p99_ms": finite(summary.ttft.p99_ms),
        "tpot_p99_ms": finite(summary.tpot.p99_ms),
        "e2el_p99_ms": finite(summary.e2el.p99_ms),
        "tok_per_j": None, "power_w": None, "mbu": None,
    }  # fmt: skip
    notes: list[str] = []
    if summary.n_failed:
        notes.append(f"{summary.n_failed} of {summary.n_requests} requests failed: "
                     f"{summary.failed_by_status}")  # fmt: skip
    energy_and_mbu(m, notes, reading, run, s, mbu_inputs)
    return RunMeasurement(index, None, energy, m, notes, fixed=s)


def _keep_records(run: RunRecord, folder: Path, run_number: int, probe_number: int,
                  rate: float, say: Callable[[str], None] | None) -> None:  # fmt: skip
    """``--moeperf-records``: one load's records. A write that fails mid-run (a full disk) is
    said and the run goes on: records explain a measurement, they must never cost it."""
    from pytest_moeperf.load.records import write_records

    loads = len(list(folder.glob(f"run{run_number}-*.jsonl.gz"))) + 1
    path = folder / f"run{run_number}-{loads:02d}-{rate:.4g}rps.jsonl.gz"
    try:
        write_records(run, path, run_number=run_number, probe_number=probe_number, rate=rate)
    except OSError as exc:
        if say is not None:
            say(f"records of run {run_number} probe {probe_number} not written to {path}: "
                f"{exc.strerror or type(exc).__name__}; the measurement goes on")  # fmt: skip
