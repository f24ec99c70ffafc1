"""Whether two sets of runs asked the server for the same work: prefix-cache hits, preemptions.

Two runs of one spec can differ in cost without any kernel changing: a prompt found in vLLM's
prefix cache skips its prefill, and a preempted request is computed again. Every probe records
the server's counters over it (``summary.server``, from ``/metrics``); a comparison reads them at
each run's boundary probe and says so when the two sides differ, so a delta is not read as a
kernel's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: Hit rates further apart than this (absolute share of prompt tokens) make the note.
HIT_RATE_GAP = 0.05


def _boundary_probe(run: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The met probe at the run's boundary rate, if any."""
    rate = run.get("boundary_rate")
    for p in run.get("probes") or ():
        if isinstance(p, Mapping) and p.get("met") and p.get("rate") == rate:
            return p
    return None


def _boundary_summary(run: Mapping[str, Any]) -> Mapping[str, Any]:
    """``summary`` of the met probe at the run's boundary rate; empty if none was recorded."""
    return (_boundary_probe(run) or {}).get("summary") or {}


def boundary_server_stats(run: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``summary.server`` of the met probe at the run's boundary rate, if recorded."""
    server = _boundary_summary(run).get("server")
    return server if isinstance(server, Mapping) and server.get("available") else None


def _values(runs: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    out = []
    for run in runs:
        s = boundary_server_stats(run)
        v = s.get(name) if s is not None else None
        if isinstance(v, int | float) and not isinstance(v, bool):
            out.append(float(v))
    return out


def server_cost_notes(
    baseline_runs: Sequence[Mapping[str, Any]], candidate_runs: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Notes for the verdict: the boundary probes' prefix-cache hit rates differ by more than
    ``HIT_RATE_GAP``, or one side preempted there and the other did not. Empty when either side
    recorded nothing (older baselines, fixed-load runs, an external server without metrics)."""
    notes: list[str] = []
    hb = _values(baseline_runs, "prefix_cache_hit_rate")
    hc = _values(candidate_runs, "prefix_cache_hit_rate")
    if hb and hc:
        mb, mc = sum(hb) / len(hb), sum(hc) / len(hc)
        if abs(mb - mc) > HIT_RATE_GAP:
            notes.append(
                f"prefix-cache hit rate at the boundary differs: baseline {100 * mb:.0f} %, "
                f"this run {100 * mc:.0f} %: a cached prompt skips its prefill, so the two did "
                "not serve the same work (the spec's model.prefix_caching turns the cache off)"
            )
    pb, pc = _values(baseline_runs, "preemptions"), _values(candidate_runs, "preemptions")
    if pb and pc and (sum(pb) > 0) != (sum(pc) > 0):
        notes.append(
            f"preemptions at the boundary: baseline {sum(pb):.0f}, this run {sum(pc):.0f} over "
            f"{len(pb)} and {len(pc)} runs: where the KV cache is full the boundary is its "
            "capacity, not the kernels' speed"
        )
    return notes


#: A boundary probe whose client sent its requests later than this share of the TTFT SLO (p99)
#: was measured while the machine stalled every process (docs/steady-state.md).
STALL_FRACTION = 0.10


def boundary_send_lag(runs: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(median p99 send lag at the runs' boundary probes, their TTFT SLO), both in ms."""
    lags, slo = [], None
    for run in runs:
        summary = _boundary_summary(run)
        lag = summary.get("send_lag_p99_ms")
        ttft = (summary.get("slo") or {}).get("ttft_p99_ms")
        if isinstance(lag, int | float) and lag == lag and isinstance(ttft, int | float):
            lags.append(float(lag))
            slo = float(ttft)
    if not lags or slo is None:
        return None
    lags.sort()
    return lags[len(lags) // 2], slo


def stalled_recording(runs: Sequence[Mapping[str, Any]]) -> str | None:
    """What a refresh says when its own runs' boundary probes were sent late by a stalling
    machine: the baseline is written (the user asked for it), but every later goodput verdict
    against it will be inconclusive (``stalled_verdicts``), which the user should know now and
    not at the next comparison. None when the runs were not stalled."""
    got = boundary_send_lag(runs)
    if got is None or not got[0] > STALL_FRACTION * got[1]:
        return None
    return (f"recorded while the machine stalled the client at the boundary (p99 send lag "
            f"{got[0]:,.0f} ms, over {100 * STALL_FRACTION:.0f} % of the {got[1]:,.0f} ms TTFT "
            "SLO): SLO goodput and rate compared with it will read inconclusive; record it "
            "again on a quiet machine (benchmarks/machine_stalls.py shows the stalls)")  # fmt: skip


def stalled_verdicts(
    verdicts: Sequence[Any],
    baseline_runs: Sequence[Mapping[str, Any]],
    candidate_runs: Sequence[Mapping[str, Any]],
) -> list[Any]:
    """Verdicts that a stalling machine explains, judged inconclusive with a note, when either
    side's client sent late at the boundary by more than ``STALL_FRACTION`` of the TTFT SLO.

    Searched metrics (the boundary and its goodput) always: a machine that stalls every process
    moves the boundary by itself (a fresh clone on the 2-vCPU VM read -45 % goodput "regressed"
    with the same code, during stalls). A p99 latency read at the boundary when its change is no
    larger than such a stall adds to one request (the lag for TTFT and E2EL, the lag over the
    output tokens less one for TPOT): a stall freezes the server too (``make perf`` on
    2026-12-05: the same code, p99 TPOT 11.1 -> 25.8 ms "regressed" at an unchanged boundary,
    with the client ~1.1 s late; 1.1 s over 31 tokens is 36 ms). A larger change (a server slowed
    by 50 ms a step) keeps its verdict. A verdict already inconclusive says the stalls are one
    reason why; other metrics keep theirs."""
    from dataclasses import replace

    from pytest_moeperf.verdict.metrics import DEFAULT_METRICS

    b, c = boundary_send_lag(baseline_runs), boundary_send_lag(candidate_runs)
    stalled = [(who, lag) for who, got in (("baseline", b), ("this run", c)) if got
               for lag, slo in [got] if lag > STALL_FRACTION * slo]  # fmt: skip
    if not stalled:
        return list(verdicts)
    slo = (c or b or (0.0, 0.0))[1]
    worst = max(lag for _, lag in stalled)
    figures = ", ".join(f"{who} {lag:,.0f} ms" for who, lag in stalled)
    why = (
        f"the machine stalled the client at the boundary (p99 send lag {figures}; over "
        f"{100 * STALL_FRACTION:.0f} % of the {slo:,.0f} ms TTFT SLO): the boundary moves with "
        "the stalls, not only with the server"
    )
    advice = "measure on a quiet machine (benchmarks/machine_stalls.py shows the stalls)"
    tokens = _boundary_output_tokens([*baseline_runs, *candidate_runs])
    out = []
    for v in verdicts:
        spec = DEFAULT_METRICS.get(v.metric)
        reach = _stall_reach(v.metric, worst, tokens)
        if spec is not None and spec.searched:
            reason = why
        elif reach is not None and abs(v.candidate_center - v.baseline_center) <= reach:
            name = v.metric.split("_")[0].upper()
            reason = (f"the machine stalled the client at the boundary (p99 send lag "
                      f"{figures}): a stall that long adds up to {reach:,.1f} ms to one "
                      f"request's {name}, no less than this change")  # fmt: skip
        else:
            out.append(v)
            continue
        if v.outcome in ("regressed", "improved"):
            v = replace(v, outcome="inconclusive", reason=f"{v.reason}; but {reason}",
                        advice=advice)  # fmt: skip
        elif v.outcome == "inconclusive":  # already: say the stalls are one reason why
            v = replace(v, reason=f"{v.reason}; and {reason}", advice=f"{v.advice}; {advice}")
        out.append(v)
    return out


def _boundary_output_tokens(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """Mean output tokens of the requests at the runs' boundary probes (None if unrecorded)."""
    vals = [t for run in runs
            if isinstance(t := _boundary_summary(run).get("mean_output_tokens"), int | float)
            and t > 0]  # fmt: skip
    return sum(vals) / len(vals) if vals else None


def _stall_reach(metric: str, lag_ms: float, tokens: float | None) -> float | None:
    """How much a stall of ``lag_ms`` can add to one request's p99 ``metric`` (ms)."""
    if metric in ("ttft_p99_ms", "e2el_p99_ms"):
        return lag_ms
    if metric == "tpot_p99_ms" and tokens is not None and tokens > 1:
        return lag_ms / (tokens - 1)
    return None


#: p99 latencies read off a search run's boundary probe (``run/probe.py``)
BOUNDARY_LATENCIES = ("ttft_p99_ms", "tpot_p99_ms", "e2el_p99_ms")


def load_confounded(verdicts: Sequence[Any]) -> list[Any]:
    """Latency verdicts that only say the two boundaries carried different loads: inconclusive.

    A search run reads every metric at its SLO boundary, and p99 latency there rises with the
    boundary's rate. When the candidate's boundary moved (the rate's verdict is not unchanged),
    a latency that got worse at a *higher* rate, or better at a *lower* one, is the load, not
    the server: in CI on the stalling VM the baseline's runs put the boundary at 14.6 req/s and
    the next run at 35.7, and p99 TPOT read +92 % "regressed" with unchanged code. A latency that
    got worse at a lower rate (the slowed server of tests/test_e2e_baseline.py) keeps its verdict.
    """
    from dataclasses import replace

    rate = next((v for v in verdicts if v.metric == "slo_rate_rps"), None)
    if rate is None or rate.outcome == "unchanged" or not math.isfinite(rate.delta_rel):
        return list(verdicts)
    more = rate.delta_rel > 0
    confounded = "regressed" if more else "improved"
    why = (f"but it was read at the SLO boundary, whose rate moved {rate.delta_rel * 100:+.0f} % "
           f"from the baseline's ({'more' if more else 'less'} load), and p99 latency there "
           "moves with the load")  # fmt: skip
    return [replace(v, outcome="inconclusive", reason=f"{v.reason}; {why}",
                    advice="compare latencies at one rate: a spec with a fixed arrival rate")
            if v.metric in BOUNDARY_LATENCIES and v.outcome == confounded else v
            for v in verdicts]  # fmt: skip


def slo_bounded(verdicts: Sequence[Any], baseline_runs: Sequence[Mapping[str, Any]]) -> list[Any]:
    """A p99 latency with an SLO, read at searched boundaries, whose band is too wide to call
    anything unchanged: by construction it lies anywhere below its SLO (the boundary is the
    highest rate that met it), so more runs narrow its band little. On the H100 bf16 nightly p99
    TTFT at the boundary ran 568-1,986 ms over five runs of one server under a 2,000 ms SLO, and
    re-recording with 5 runs instead of 3, as the advice then said, left a 17.6x band. The
    verdict stays inconclusive; its advice says so and where latency can be judged instead."""
    from dataclasses import replace

    from pytest_moeperf.verdict.stats import MAX_UNCHANGED_BAND, band_ratio

    slos: dict[str, float] = {}
    for run in baseline_runs:
        slo = _boundary_summary(run).get("slo") or {}
        for name in BOUNDARY_LATENCIES:
            if isinstance(limit := slo.get(name), int | float) and limit > 0:
                slos[name] = float(limit)

    def bounded(v: Any) -> bool:
        return (v.metric in slos and v.outcome == "inconclusive" and v.band is not None
                and band_ratio(v.band) > MAX_UNCHANGED_BAND)  # fmt: skip

    return [replace(v, advice=f"at a searched boundary p99 {v.metric.split('_')[0].upper()} "
                              f"lies anywhere below its SLO ({slos[v.metric]:,.0f} ms), so more "
                              "runs narrow this band little; judge it at one rate: a spec with "
                              "a fixed arrival rate")
            if bounded(v) else v for v in verdicts]  # fmt: skip


def capped(run: Mapping[str, Any]) -> bool:
    """A search run that met the SLO at ``search.rate_max``: its boundary and goodput are
    floors (``run/search.py``: converged with nothing missed above)."""
    bracket = run.get("bracket")
    return (bool(run.get("converged")) and isinstance(bracket, list | tuple) and len(bracket) == 2
            and bracket[0] is not None and bracket[1] is None)  # fmt: skip


def capped_verdicts(verdicts: Sequence[Any], baseline_runs: Sequence[Mapping[str, Any]],
                    candidate_runs: Sequence[Mapping[str, Any]]) -> list[Any]:  # fmt: skip
    """Searched metrics when every run of both sides met the SLO at ``search.rate_max``: both
    figures are floors, so equal floors say nothing about the servers (a build twice as slow
    that still meets the cap reads the same). Such a verdict is inconclusive, never
    "unchanged"; the latencies, read at that one rate on both sides, keep theirs. A side that
    found its boundary below the cap is judged as usual: falling below the other's floor is
    real."""
    from dataclasses import replace

    from pytest_moeperf.verdict.metrics import DEFAULT_METRICS

    sides = (baseline_runs, candidate_runs)
    if not all(runs and all(capped(r) for r in runs) for runs in sides):
        return list(verdicts)
    top = max(float(r["bracket"][0]) for runs in sides for r in runs)
    why = (f"every run of both sides met the SLO at search.rate_max ({top:.4g} req/s): both "
           "figures are floors, and the boundary is higher")  # fmt: skip
    advice = "raise search.rate_max in the spec to find the boundary"
    return [replace(v, outcome="inconclusive", reason=f"{v.reason}; but {why}", advice=advice)
            if (spec := DEFAULT_METRICS.get(v.metric)) is not None and spec.searched
            else v for v in verdicts]  # fmt: skip


def confounded(verdicts: Sequence[Any], baseline_runs: Sequence[Mapping[str, Any]],
               candidate_runs: Sequence[Mapping[str, Any]],
               speed: tuple[float, str] | None = None) -> list[Any]:  # fmt: skip
    """Every rule that reads a verdict inconclusive from what the two sides recorded: a
    machine that stalled the client, a machine that gave one side less CPU or whose
    calibration moved (``speed``: ``calibration.speed_drift``; ``verdict/machine_drift.py``),
    boundaries that are floors, latencies read at boundaries that moved, and latencies that a
    searched boundary bounds by their SLO (advice only). One chain, so
    the gate and ``moeperf compare`` judge alike."""
    from pytest_moeperf.verdict.machine_drift import drifted_verdicts, speed_verdicts

    out = stalled_verdicts(verdicts, baseline_runs, candidate_runs)
    out = speed_verdicts(drifted_verdicts(out, baseline_runs, candidate_runs), speed)
    out = load_confounded(capped_verdicts(out, baseline_runs, candidate_runs))
    return slo_bounded(out, baseline_runs)
