"""The verdict on one metric: baseline runs against candidate runs.

A run-level metric (goodput of one load run) varies by about 1 % from run to run, so one run
against one run proves nothing. ``judge`` asks three questions of the repeated runs and calls a
regression only when all three say yes (docs/verdicts.md has the numbers behind each choice):

1. Is the candidate's center outside the *band*, the range the baseline's own run-to-run spread
   predicts for the mean of ``n_candidate`` new runs (a prediction interval, as Bencher draws)?
2. Is the difference statistically significant on the repeated runs (Welch's t-test on log
   values: ratios, not differences, are what stay constant when a server gets faster)?
3. Is it larger than the metric's minimum effect (a 0.3 % change is real but nobody cares)?

When the answers disagree the verdict is *inconclusive* and says how many more runs would settle
it. scipy is imported inside the functions so importing this module at pytest start-up is cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pytest_moeperf.errors import UsageError
from pytest_moeperf.verdict.metrics import DEFAULT_METRICS, Direction, MetricSpec, get_metric

Outcome = Literal["improved", "unchanged", "regressed", "inconclusive"]
Scale = Literal["log", "linear"]

# Runs per side at which tests/test_verdict_simulation.py shows the goal (A/A false regressions
# <= 1 %, a 3 % drop caught >= 95 %) for run-to-run CVs up to 1.5 %. The baseline is recorded once
# and reused, so it gets more runs; each CI comparison pays only for the candidate's.
DEFAULT_BASELINE_RUNS = 15
DEFAULT_CANDIDATE_RUNS = 10


@dataclass(frozen=True)
class VerdictConfig:
    """Thresholds of the verdict; the defaults are the ones the simulation validates."""

    alpha: float = 0.01  # two-sided Welch p-value below which a difference is significant
    band_coverage: float = 0.98  # prediction-interval coverage of the band
    min_runs: int = 3  # fewer runs on either side cannot estimate the spread
    advice_power: float = 0.95  # power the "run N more" advice aims for
    max_advised_runs: int = 50  # beyond this, advise reducing noise instead of adding runs

    def __post_init__(self) -> None:
        checks: list[tuple[str, float, bool, str]] = [
            ("alpha", self.alpha, 0.0 < self.alpha < 0.5, "a p-value threshold in (0, 0.5)"),
            (
                "band_coverage",
                self.band_coverage,
                0.5 < self.band_coverage < 1.0,
                "a coverage in (0.5, 1), e.g. 0.98",
            ),
            ("min_runs", self.min_runs, self.min_runs >= 2, "at least 2 (a spread needs 2 runs)"),
            (
                "advice_power",
                self.advice_power,
                0.5 <= self.advice_power < 1.0,
                "a power in [0.5, 1)",
            ),
            ("max_advised_runs", self.max_advised_runs, self.max_advised_runs >= 2, ">= 2"),
        ]
        for field, value, ok, want in checks:
            if not ok:
                raise UsageError("VerdictConfig", field, value, "is out of range", f"use {want}")


@dataclass(frozen=True)
class Verdict:
    """The outcome for one metric plus everything the report needs to explain it."""

    metric: str
    unit: str
    direction: Direction
    outcome: Outcome
    baseline_center: float
    band: tuple[float, float]
    candidate_center: float
    delta_rel: float
    p_value: float | None
    n_baseline: int
    n_candidate: int
    reason: str
    advice: str = ""
    gating: bool = True
    scale: Scale = "log"

    @property
    def fails(self) -> bool:
        """True when this verdict should fail the test (a regression of a gating metric)."""
        return self.outcome == "regressed" and self.gating

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["band"] = list(self.band)
        return d


def _clean(spec: MetricSpec, side: str, values: Sequence[float]) -> list[float]:
    out: list[float] = []
    for i, v in enumerate(values):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0:
            raise UsageError(
                f"{side} runs of metric {spec.name!r}",
                f"value[{i}]",
                v,
                "must be a finite number >= 0",
                "drop the failed run or fix the metric computation",
            )
        out.append(float(v))
    if not out:
        raise UsageError(
            f"{side} runs of metric {spec.name!r}",
            "values",
            list(values),
            "is empty",
            "record at least one run on each side",
        )
    return out


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _sd(xs: Sequence[float], m: float) -> float:
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:+.2f} %"


def runs_needed(sd_log: float, effect: float, *, alpha: float, power: float) -> int:
    """Runs per side for a two-sided Welch test at ``alpha`` to catch ``effect`` with ``power``.

    Starts from the normal approximation and steps up until the t quantiles (df = 2n - 2) fit,
    which matters at the small n benchmarks use. Below 10 runs the band condition and the noisy
    spread estimate cost about one more run; the simulation calibrates this (CV 0.7 % -> 5 runs,
    97.6 % caught; CV 1 % -> 7, 97.0 %; CV 1.5 % -> 11, 95.1 %, for a 3 % drop).
    """
    from scipy.special import ndtri, stdtrit

    if effect <= 0:
        return 10**9
    if sd_log == 0:
        return 2
    z = float(ndtri(1 - alpha / 2)) + float(ndtri(power))
    n = max(2, math.ceil(2 * (z * sd_log / effect) ** 2))
    while n < 10**6:
        df = 2 * n - 2
        t = float(stdtrit(df, 1 - alpha / 2)) + float(stdtrit(df, power))
        if t * sd_log * math.sqrt(2 / n) <= effect:
            return n + 1 if n < 10 else n
        n += 1
    return n


def _advice(
    config: VerdictConfig, nb: int, nc: int, sd_pool: float, effect: float, what: str
) -> str:
    n = runs_needed(sd_pool, effect, alpha=config.alpha, power=config.advice_power)
    if n > config.max_advised_runs:
        return (
            f"run-to-run noise is too high to resolve a {effect * 100:.1f} % change "
            f"(needs ~{n} runs per side): reduce it (longer runs, fixed clocks, idle host)"
        )
    kb, kc = max(0, n - nb), max(0, n - nc)
    if kb == kc == 0:
        return f"re-run the {what} to confirm"
    if kb == kc:
        return f"run {kb} more runs per side"
    return f"run {kb} more baseline and {kc} more candidate runs"


def search_resolution(runs: Sequence[Mapping[str, Any]]) -> float:
    """The log width of the widest SLO-search bracket a run was allowed (``log(1 + tolerance)``
    of the runs as a baseline or a result stores them); 0.0 when no run was a search."""
    tols = [float(t) for r in runs if isinstance(t := r.get("tolerance"), int | float) and t > 0]
    return math.log1p(max(tols)) if tols else 0.0


def judge(
    spec: MetricSpec,
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    config: VerdictConfig = VerdictConfig(),
    resolution: float = 0.0,
) -> Verdict:
    """Judge one metric from its per-run values on each side (one value per run).

    ``resolution`` is the log width of the bracket an SLO search certifies; for a searched
    metric each run's value is known only to within it, so its variance ``resolution**2 / 12``
    (uniform over the bracket) is added to each side's run-to-run variance. Without it, three
    runs that landed on one bracket (a shared schedule makes that likely) have no spread at all,
    and any other value would be called a certain change: a false alarm one bracket wide."""
    from scipy.special import stdtr, stdtrit

    if spec.role == "accuracy":
        raise UsageError(
            "judge()",
            "metric",
            spec.name,
            "is judged per question by the accuracy gate, not run to run",
            "use pytest_moeperf.accuracy for it and leave it out of the generic verdict",
        )
    b, c = _clean(spec, "baseline", baseline), _clean(spec, "candidate", candidate)
    nb, nc = len(b), len(c)
    scale: Scale = "log" if min(b) > 0 and min(c) > 0 else "linear"
    tb = [math.log(x) for x in b] if scale == "log" else b
    tc = [math.log(x) for x in c] if scale == "log" else c
    mb, mc = _mean(tb), _mean(tc)

    def back(x: float) -> float:
        return math.exp(x) if scale == "log" else x

    if scale == "log":
        delta = math.expm1(mc - mb)
    elif mb != 0:
        delta = (mc - mb) / mb
    else:
        delta = 0.0 if mc == 0 else math.inf
    worse = spec.is_worse(delta)
    common = {
        "metric": spec.name,
        "unit": spec.unit,
        "direction": spec.direction,
        "baseline_center": back(mb),
        "candidate_center": back(mc),
        "delta_rel": delta,
        "n_baseline": nb,
        "n_candidate": nc,
        "gating": spec.role == "gate",
        "scale": scale,
    }
    cov = config.band_coverage
    quant = resolution**2 / 12 if spec.searched and scale == "log" else 0.0
    sb = math.sqrt(_sd(tb, mb) ** 2 + quant) if nb >= 2 else math.nan
    half = float(stdtrit(nb - 1, (1 + cov) / 2)) * sb * math.sqrt(1 / nb + 1 / nc) if nb >= 2 else 0
    band = (back(mb - half), back(mb + half)) if nb >= 2 else (math.nan, math.nan)

    if nb < config.min_runs or nc < config.min_runs:
        need_b, need_c = max(0, config.min_runs - nb), max(0, config.min_runs - nc)
        return Verdict(
            **common,  # type: ignore[arg-type]
            outcome="inconclusive",
            band=band,
            p_value=None,
            reason=(
                f"too few runs to test ({nb} baseline, {nc} candidate; "
                f"need >= {config.min_runs} each)"
            ),
            advice=(
                f"run {need_b} more baseline and {need_c} more candidate runs "
                f"(defaults: {DEFAULT_BASELINE_RUNS} and {DEFAULT_CANDIDATE_RUNS})"
            ),
        )

    sc = math.sqrt(_sd(tc, mc) ** 2 + quant)
    vb, vc = sb * sb / nb, sc * sc / nc
    se = math.sqrt(vb + vc)
    if se == 0:
        p = 1.0 if mc == mb else 0.0  # every run agrees exactly: the difference is certain
    else:
        df = (vb + vc) ** 2 / (vb * vb / (nb - 1) + vc * vc / (nc - 1))
        p = min(1.0, 2 * float(stdtr(df, -abs(mc - mb) / se)))
    outside = (mc < mb - half or mc > mb + half) if half > 0 else mc != mb
    big = abs(delta) >= spec.min_effect
    sig = p < config.alpha
    sd_pool = math.sqrt(((nb - 1) * sb * sb + (nc - 1) * sc * sc) / (nb + nc - 2))
    effect_log = max(abs(mc - mb), math.log1p(spec.min_effect) if scale == "log" else 0.0)
    if scale == "linear":  # runs_needed works on relative effects; rescale by the baseline
        sd_pool, effect_log = (sd_pool / mb, abs(delta)) if mb > 0 else (0.0, 0.0)
    pstr = f"p={p:.2g}"
    band_str = f"{cov * 100:g} % band"
    word = "worse" if worse else "better"
    if big and sig and outside:
        outcome: Outcome = "regressed" if worse else "improved"
        reason = f"{_pct(delta)} ({word}), outside the {band_str}, {pstr} < {config.alpha:g}"
        advice = ""
    elif not big:
        outcome = "unchanged"
        extra = " (significant, but too small to matter)" if sig and outside else ""
        reason = f"{_pct(delta)} is below the {spec.min_effect * 100:g} % minimum effect{extra}"
        advice = ""
    elif sig and not outside:
        outcome = "inconclusive"
        reason = (
            f"{_pct(delta)} ({word}) is significant ({pstr}) but inside the {band_str}: "
            "the baseline runs vary more than the candidate's"
        )
        advice = _advice(config, nb, nc, sd_pool, effect_log, "baseline")
    elif outside:
        outcome = "inconclusive"
        reason = (
            f"{_pct(delta)} ({word}) is outside the {band_str} but not significant "
            f"({pstr} >= {config.alpha:g})"
        )
        advice = _advice(config, nb, nc, sd_pool, effect_log, "candidate")
    elif scale == "log" and band_ratio(band) > MAX_UNCHANGED_BAND:
        outcome = "inconclusive"
        reason = (
            f"{_pct(delta)} ({word}) is inside the {band_str}, but that band spans "
            f"{band_ratio(band):,.1f}x ({band[0]:,.4g} to {band[1]:,.4g}): the baseline's runs "
            f"disagree too much to call a change this size unchanged"
        )
        advice = ("record the baseline again on a quiet machine, with more runs "
                  "(--moeperf-runs)")  # fmt: skip
    else:
        outcome = "unchanged"
        reason = f"{_pct(delta)} is within run-to-run noise ({pstr}, inside the {band_str})"
        advice = ""
    return Verdict(
        **common,  # type: ignore[arg-type]
        outcome=outcome,
        band=band,
        p_value=p,
        reason=reason,
        advice=advice,
    )


#: A band wider than this factor (high over low) cannot call a change of at least the metric's
#: minimum effect "unchanged": a wrong MoE config can halve throughput, and a band that would
#: not see that is no evidence. In CI on 2026-12-05 a baseline recorded while the VM stalled had
#: a p99 TPOT band of 0.14 to 1,244 ms, and a server slowed by 50 ms a step read +394 %
#: "unchanged". Changes below the minimum effect stay unchanged.
MAX_UNCHANGED_BAND = 2.0


def band_ratio(band: tuple[float, float]) -> float:
    """High over low end of a band (inf when the low end is <= 0, nan when unknown)."""
    lo, hi = band
    if math.isnan(lo) or math.isnan(hi):
        return math.nan
    return hi / lo if lo > 0 else math.inf


def judge_all(
    baseline: Mapping[str, Sequence[float]],
    candidate: Mapping[str, Sequence[float]],
    *,
    names: Sequence[str] | None = None,
    registry: Mapping[str, MetricSpec] = DEFAULT_METRICS,
    config: VerdictConfig = VerdictConfig(),
    source: str = "judge_all()",
    resolution: float = 0.0,
) -> list[Verdict]:
    """Judge every generic metric present on both sides, in registry order.

    With ``names`` only those are judged, and each must be known and present on both sides.
    Metrics unknown to the registry and the accuracy metric are skipped when ``names`` is None.
    """
    if names is None:
        chosen = [
            s
            for s in registry.values()
            if s.role != "accuracy" and s.name in baseline and s.name in candidate
        ]
    else:
        chosen = []
        for name in names:
            spec = get_metric(name, source=source, registry=registry)
            for side, values in (("baseline", baseline), ("candidate", candidate)):
                if name not in values:
                    raise UsageError(
                        source,
                        "metric",
                        name,
                        f"is not recorded on the {side} side",
                        f"pick one of: {', '.join(sorted(set(baseline) & set(candidate)))}",
                    )
            chosen.append(spec)
    return [judge(s, baseline[s.name], candidate[s.name], config=config, resolution=resolution)
            for s in chosen]  # fmt: skip
