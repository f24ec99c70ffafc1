"""Per-M kernel A/B: which key serves each M, timing verdicts per M, and a best-of-both config.

A config file is a set of tilings, each reached through vLLM's nearest-key rule
(``try_get_optimal_moe_config``: ``configs[min(configs.keys(), key=lambda x: abs(x - M))]``,
over ``{int(key): val for key, val in json.load(f).items()}`` from ``get_moe_configs``). So the
unit to time is the M, not the key: a head file that re-tiles key 64 changes M=48..95, and one
that only reorders keys can change a tie M (``min`` keeps the first of equally near keys, and the
dict keeps the file's order). Timings come from the GPU; everything here is CPU-side arithmetic
on the raw JSON dicts (string keys, file order kept) so the merged file can be written as is.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.coverage import nearest_key
from pytest_moeperf.moeconfig.validate import TOP_LEVEL_METADATA

Side = Literal["base", "head"]
MVerdict = Literal["faster", "slower", "same"]

ALPHA = 0.01
#: Smallest relative change of the mean kernel time that counts as faster/slower. CUDA-event
#: timings of one kernel are so repeatable that 0.2 % comes out "significant" with a few hundred
#: samples, yet a fused-MoE kernel's time moves that much between clock states of one GPU, and a
#: 1 % change of one kernel is far below what serving throughput can resolve. Below it the
#: merged file keeps base: a tiling swap must buy something real.
MIN_EFFECT = 0.01


def config_keys(config: Mapping[str, Any], source: str = "config") -> dict[int, str]:
    """M -> the key string as written, in file order (vLLM's tie order), metadata left out."""
    out: dict[int, str] = {}
    for key, value in config.items():
        if key in TOP_LEVEL_METADATA:
            continue  # vLLM pops "triton_version" before reading the M keys
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) >= 1):
            raise UsageError(
                source, f"key {key!r}", key, "not a positive integer batch size M", 'write "64"'
            )
        m = int(key)
        if m in out:
            raise UsageError(
                source,
                f"key {key!r}",
                key,
                f"M={m} appears twice (also as {out[m]!r}); vLLM's int(key) merges them",
                "keep one entry per M",
            )
        if not isinstance(value, Mapping):
            raise UsageError(
                source, f"key {key!r}", value, "a tiling must be a JSON object", "fix the entry"
            )
        out[m] = key
    if not out:
        raise UsageError(
            source,
            "M keys",
            [],
            "no M entries: vLLM would use its computed default config, not a tiling from here",
            "pass a config with tuned entries",
        )
    return out


def check_m(m: object, what: str = "M") -> int:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise UsageError("per-M A/B", what, m, "must be a positive integer batch size", "fix it")
    return m


def serving_key(config: Mapping[str, Any], m: int, *, source: str = "config") -> str:
    """The key whose tiling vLLM runs at batch size ``m``.

    Nearest by ``|key - m|``; on a tie the key that comes first in the file (``min`` returns the
    first minimum it meets, and json.load keeps file order). So ``{"2": A, "4": B}`` runs A at
    M=3 and ``{"4": B, "2": A}`` runs B: reordering keys alone is a behaviour change.
    """
    keys = config_keys(config, source)
    return keys[nearest_key(keys, check_m(m))]


def tiling(config: Mapping[str, Any], m: int, *, source: str = "config") -> dict[str, Any]:
    """The kernel parameters vLLM passes at ``m`` (a copy; field order does not matter)."""
    return dict(config[serving_key(config, m, source=source)])


def tie_keys(config: Mapping[str, Any], m: int) -> list[int]:
    """All keys equally nearest to ``m`` with a tiling different from the winner's (file order)."""
    keys = config_keys(config)
    best = abs(nearest_key(keys, m) - m)
    near = [k for k in keys if abs(k - m) == best]
    first = dict(config[keys[near[0]]])
    return near if any(dict(config[keys[k]]) != first for k in near[1:]) else []


def m_values(
    base: Mapping[str, Any], head: Mapping[str, Any], workload_ms: Iterable[int] = ()
) -> list[int]:
    """The Ms to time: every key of either file (each key's own tiling must be measured to
    choose it) plus the Ms the workload reaches (they may sit between keys), sorted, unique."""
    ms = set(config_keys(base, "base")) | set(config_keys(head, "head"))
    ms |= {check_m(m, "workload M") for m in workload_ms}
    return sorted(ms)


@dataclass(frozen=True)
class MCompare:
    """Head vs base at one M. Times in microseconds; ``delta`` < 0 means head is faster."""

    base_median: float
    head_median: float
    base_mean: float
    head_mean: float
    delta: float  # head_mean / base_mean - 1
    ci: tuple[float, float]  # (1 - alpha) confidence interval of delta
    p_value: float | None  # None: same tiling, nothing to test
    verdict: MVerdict
    reason: str
    n_base: int
    n_head: int
    same_tiling: bool = False
    significant: bool = False  # p < alpha; "same" with this set means below the minimum effect


def _samples(values: Sequence[float], side: Side) -> list[float]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise UsageError(
                f"{side} timings",
                f"sample[{i}]",
                v,
                "a kernel time must be a finite number of microseconds > 0",
                "drop the failed launch or fix the timer",
            )
        out.append(float(v))
    return out


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def compare_m(
    base_us: Sequence[float],
    head_us: Sequence[float],
    alpha: float = ALPHA,
    *,
    min_effect: float = MIN_EFFECT,
    same_tiling: bool = False,
) -> MCompare:
    """Welch's t-test (scipy) on the kernel times of one M; faster/slower needs p < alpha AND
    |delta| >= min_effect (significance alone is cheap with CUDA-event timings).

    With ``same_tiling`` both sides launch the identical kernel, so the verdict is "same" by
    construction and no test is run (a "significant" difference there would be GPU drift);
    the pooled samples give the time used for weighting. The CI divides Welch's CI of the
    difference of means by the base mean, treating that mean as exact: its relative standard
    error (CV / sqrt(n), ~0.1 % for CUDA events) is small next to the 1 % minimum effect.
    """
    if not 0 < alpha < 1:
        raise UsageError("compare_m", "alpha", alpha, "must be in (0, 1)", "use e.g. 0.01")
    if not 0 <= min_effect < 1:
        raise UsageError("compare_m", "min_effect", min_effect, "must be in [0, 1)", "use 0.01")
    b, h = _samples(base_us, "base"), _samples(head_us, "head")
    if same_tiling:
        pooled = b + h
        if not pooled:
            raise UsageError(
                "compare_m", "samples", [], "no timing at all", "time this M at least once"
            )
        mean, med = _mean(pooled), float(statistics.median(pooled))
        why = "same tiling: both sides launch the identical kernel at this M; no test run"
        return MCompare(
            med, med, mean, mean, 0.0, (0.0, 0.0), None, "same", why, len(b), len(h), True
        )
    for side, xs in (("base", b), ("head", h)):
        if len(xs) < 2:
            raise UsageError(
                "compare_m",
                f"{side} samples",
                len(xs),
                "Welch's t-test needs at least 2 timings per side",
                "time each side's tiling repeatedly (tens of launches)",
            )
    mb, mh = _mean(b), _mean(h)
    delta = mh / mb - 1
    if statistics.variance(b) == 0 and statistics.variance(h) == 0:
        p = 1.0 if mb == mh else 0.0  # no spread: the difference is exact (t = +-inf or 0/0)
        ci = (delta, delta)
    else:
        from scipy.stats import ttest_ind

        with warnings.catch_warnings():  # nearly constant samples: scipy warns, result is fine
            warnings.simplefilter("ignore", RuntimeWarning)
            res = ttest_ind(h, b, equal_var=False)
            lo, hi = res.confidence_interval(confidence_level=1 - alpha)
        p = float(res.pvalue)
        ci = (float(lo) / mb, float(hi) / mb)
    pct = f"{delta * 100:+.2f} %"
    verdict: MVerdict
    if not p < alpha:
        verdict, why = "same", f"no significant difference ({pct}, p={p:.2g} >= {alpha:g})"
    elif abs(delta) < min_effect:
        verdict = "same"
        why = (
            f"significant (p={p:.2g}) but {pct} is below the {min_effect * 100:g} % minimum effect"
        )
    else:
        verdict = "faster" if delta < 0 else "slower"
        why = f"head {verdict} by {abs(delta) * 100:.2f} % (p={p:.2g})"
    return MCompare(
        float(statistics.median(b)),
        float(statistics.median(h)),
        mb,
        mh,
        delta,
        ci,
        p,
        verdict,
        why,
        len(b),
        len(h),
        significant=p < alpha,
    )


def compare_all(
    base: Mapping[str, Any],
    head: Mapping[str, Any],
    samples: Mapping[int, tuple[Sequence[float], Sequence[float]]],
    alpha: float = ALPHA,
    *,
    min_effect: float = MIN_EFFECT,
) -> dict[int, MCompare]:
    """compare_m for every timed M (samples: M -> (base µs, head µs)), same tiling detected."""
    out = {}
    for m in sorted(samples):
        same = tiling(base, m, source="base") == tiling(head, m, source="head")
        b, h = samples[m]
        out[check_m(m)] = compare_m(b, h, alpha, min_effect=min_effect, same_tiling=same)
    return out
