"""Session results -> pytest-benchmark's JSON, so ``pytest-benchmark compare`` shows them too.

Teams that already keep pytest-benchmark files want one tool to list and compare numbers. This
module writes moeperf's per-test metrics in that tool's storage format (``machine_info``,
``commit_info``, ``benchmarks[]`` with ``stats`` computed from per-round ``data``), as a file of
its own: moeperf never writes into ``.benchmarks/`` and pytest-benchmark never reads
``baselines/``.

Mapping: one (test, metric) is one benchmark, one measured run is one round. pytest-benchmark
reads every value as seconds, lower is better. Latencies (ms) are therefore stored in seconds,
so its time column is right; the other metrics (tok/s, req/s, tok/J, W, MBU) keep their own
unit, and the group title and ``extra_info`` say which unit and which direction is better.
Partial or errored results are left out (like pytest-benchmark drops benchmarks with errors) and
listed under ``moeperf.left_out``.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from pytest_moeperf.report.model import Result, parse_payload
from pytest_moeperf.verdict.metrics import DEFAULT_METRICS

#: The pytest-benchmark storage format the fields follow (its 4.x and 5.x files have this shape).
FORMAT_VERSION = "5.1.0"
#: Outcomes whose runs are complete measurements (a failed gate still measured everything).
COMPLETE_OUTCOMES = ("passed", "failed")
_MS_TO_S = 1e-3


def to_benchmark_json(payload: Mapping[str, Any], source: str = "session") -> dict[str, Any]:
    """One moeperf session payload (``--moeperf-results``) as one pytest-benchmark JSON dict."""
    run = parse_payload(payload, source)
    benchmarks: list[dict[str, Any]] = []
    left_out: list[dict[str, str]] = []
    for result in run.results:
        if result.outcome not in COMPLETE_OUTCOMES:
            why = "; ".join(result.reasons) or "no reason recorded"
            left_out.append({"nodeid": result.nodeid, "outcome": result.outcome, "why": why})
            continue
        for name in sorted(result.metrics):
            entry = _benchmark(result, name, quick=run.quick)
            if entry is not None:
                benchmarks.append(entry)
    setup = next((r.setup for r in run.results if r.setup), {})
    finished = run.finished if run.finished is not None else run.started
    return {
        "machine_info": _machine_info(setup),
        "commit_info": _commit_info(setup),
        "benchmarks": benchmarks,
        "datetime": _iso(finished),
        "version": FORMAT_VERSION,
        "moeperf": {
            "plugin_version": run.plugin_version,
            "command": run.command,
            "quick": run.quick,
            "left_out": left_out,
        },
    }


def fixture_extra_info(result: Mapping[str, Any]) -> dict[str, Any]:
    """What a test's own ``benchmark.extra_info`` gets: moeperf's centers, named like junitxml."""
    info: dict[str, Any] = {
        "moeperf.outcome": result.get("outcome"),
        "moeperf.config": result.get("config_label"),
    }
    metrics = result.get("metrics") or {}
    for name in sorted(metrics):
        entry = metrics[name]
        if isinstance(entry, Mapping):
            info[f"moeperf.{name}"] = entry.get("center")
    return info


def stats(data: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's ``Stats.as_dict()`` fields for one benchmark's rounds (same formulas)."""
    xs = sorted(data)
    n = len(xs)
    mean = statistics.mean(xs)
    stddev = statistics.stdev(xs) if n > 1 else 0.0
    q1, q3 = _quartile(xs, lower=True), _quartile(xs, lower=False)
    iqr = q3 - q1
    ld15iqr = xs[0] if n == 1 else xs[bisect_left(xs, q1 - 1.5 * iqr)]
    hd15iqr = xs[0] if n == 1 else xs[bisect_right(xs, q3 + 1.5 * iqr) - 1]
    iqr_outliers = sum(1 for x in xs if x < q1 - 1.5 * iqr or x > q3 + 1.5 * iqr)
    stddev_outliers = sum(1 for x in xs if x < mean - stddev or x > mean + stddev)
    total = sum(xs)
    return {
        "min": xs[0],
        "max": xs[-1],
        "mean": mean,
        "stddev": stddev,
        "rounds": n,
        "median": statistics.median(xs),
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": iqr_outliers,
        "stddev_outliers": stddev_outliers,
        "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": ld15iqr,
        "hd15iqr": hd15iqr,
        "ops": n / total if total else 0,
        "total": total,
    }


def _quartile(xs: Sequence[float], *, lower: bool) -> float:
    """Q1/Q3 as pytest-benchmark computes them (Wikipedia methods 3 and 2)."""
    n = len(xs)
    if n == 1:
        return xs[0]
    if n % 2:
        k, q = n // 4, n % 4
        if lower:
            return 0.25 * xs[k - 1] + 0.75 * xs[k] if q == 1 else 0.75 * xs[k] + 0.25 * xs[k + 1]
        if q == 1:
            return 0.75 * xs[3 * k] + 0.25 * xs[3 * k + 1]
        return 0.25 * xs[3 * k + 1] + 0.75 * xs[3 * k + 2]
    half = n // 2
    return statistics.median(xs[:half] if lower else xs[half:])


def _benchmark(result: Result, name: str, *, quick: bool) -> dict[str, Any] | None:
    metric = result.metrics[name]
    runs = [x for x in metric.runs if math.isfinite(x)]
    if not runs:
        return None  # not measured: pytest-benchmark has no way to show an empty benchmark
    spec = DEFAULT_METRICS.get(name)
    unit = metric.unit or (spec.unit if spec else "")
    better = spec.direction if spec else None
    seconds = unit == "ms"
    values = [x * _MS_TO_S for x in runs] if seconds else runs
    stored_unit = "s" if seconds else (unit or "1")
    what = "stored in s" if seconds else f"{stored_unit}, not a time"
    direction = f"; {better} is better" if better else ""
    node_name = result.nodeid.rsplit("::", 1)[-1]
    param = node_name[node_name.index("[") + 1 : -1] if node_name.endswith("]") else None
    verdict = result.verdict(name)
    body = stats(values)
    body["data"] = values
    body["iterations"] = 1
    return {
        "group": f"moeperf: {name} ({what}{direction})",
        "name": f"{node_name}::moeperf.{name}",
        "fullname": f"{result.nodeid}::moeperf.{name}",
        "params": None,
        "param": param,
        "extra_info": {
            "moeperf_metric": name,
            "unit": unit,
            "stored_unit": stored_unit,
            "better": better,
            "center": metric.center,
            "runs": list(metric.runs),
            "outcome": result.outcome,
            "config": result.config,
            "moe_config_hash": result.moe_config.get("hash"),
            "spec": result.spec.get("name"),
            "verdict": verdict.outcome if verdict else None,
            "baseline_center": verdict.baseline_center if verdict else None,
            "delta_rel": verdict.delta_rel if verdict else None,
            "p_value": verdict.p_value if verdict else None,
            "quick": quick,
            "nodeid": result.nodeid,
        },
        "options": {"timer": "moeperf: one round is one measured run", "min_rounds": len(runs)},
        "stats": body,
    }


def _machine_info(setup: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("accelerator", "gpu_count", "driver", "cuda", "engine", "model", "dtype")
    return {"node": setup.get("host") or "", **{k: setup.get(k) for k in keys}}


def _commit_info(setup: Mapping[str, Any]) -> dict[str, Any]:
    commit = setup.get("commit")
    return {
        "id": str(commit) if commit else "unversioned",
        "time": None,
        "author_time": None,
        "dirty": None,
        "project": "pytest-moeperf results",
        "branch": None,
    }


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat()
