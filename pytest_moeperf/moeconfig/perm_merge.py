"""Best of both: per timed M the faster side's tiling, as one config file vLLM will really serve.

The catch is the nearest-key rule: a tiling chosen at M only runs at M if the key that serves M
in the merged file carries it. Keys serve their own M exactly (distance 0), so every key of either
file is realisable; an M between keys (from the workload) shares its key with that key's own M
and may want the other side's tiling. No key is invented to fix that: a new key would re-tile
every untimed M around it. Such Ms are listed as not realisable, with the reason, and the
prediction uses the tiling that actually serves them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.perm import MCompare, Side, config_keys, serving_key, tiling
from pytest_moeperf.moeconfig.validate import TOP_LEVEL_METADATA


@dataclass(frozen=True)
class NotRealisable:
    """A timed M whose chosen tiling the merged file cannot deliver."""

    m: int
    wanted: Side
    key: str  # the merged key that serves m
    served: Side | None  # whose measured tiling runs there instead (None: neither side's)
    why: str


@dataclass(frozen=True)
class Merged:
    """The merged config (raw JSON dict, file order) and what serves each timed M in it."""

    config: dict[str, Any]
    chosen: dict[int, Side]  # the faster side per timed M (base on a tie)
    served: dict[int, Side | None]  # whose tiling serves M in ``config``
    not_realisable: tuple[NotRealisable, ...]
    same_as_base: bool  # same keys, order and tilings as base: nothing worth shipping

    def to_json(self) -> str:
        """The file text as vLLM's benchmark_moe.py writes it (indent 4, newline at the end)."""
        return json.dumps(self.config, indent=4) + "\n"


def _failures(
    config: Mapping[str, Any], want: Mapping[int, dict[str, Any]], ms: list[int]
) -> set[int]:
    return {m for m in ms if tiling(config, m) != want[m]}


def _is_m(key: str) -> bool:
    return key not in TOP_LEVEL_METADATA


def _plain(v: object) -> object:
    return dict(v) if isinstance(v, Mapping) else v


def _whose(
    base: Mapping[str, Any], head: Mapping[str, Any], t: Mapping[str, Any], m: int
) -> Side | None:
    if tiling(base, m) == t:
        return "base"
    return "head" if tiling(head, m) == t else None


def best_of_both(
    base: Mapping[str, Any], head: Mapping[str, Any], comparisons: Mapping[int, MCompare]
) -> Merged:
    """Head's tiling where head was faster (significant and above the minimum effect), base's
    elsewhere. Base's keys in base's order, head's new keys each put before the first larger
    key (so a sorted base gives a sorted file and ties go to the smaller key as in a sorted
    head); every timed M then verified against the nearest-key rule."""
    bk, hk = config_keys(base, "base"), config_keys(head, "head")
    missing = sorted((set(bk) | set(hk)) - set(comparisons))
    if missing:
        raise UsageError(
            "best_of_both",
            "untimed keys",
            missing,
            "every key's tiling must be chosen from a timing at its own M",
            "time every M of m_values(base, head)",
        )
    ms = sorted(comparisons)
    chosen: dict[int, Side] = {
        m: "head" if comparisons[m].verdict == "faster" else "base" for m in ms
    }
    want = {m: tiling(head if chosen[m] == "head" else base, m) for m in ms}
    config: dict[str, Any] = {}
    for key, value in base.items():
        config[key] = value if key in TOP_LEVEL_METADATA else want[int(key)]
    new_keys = sorted(set(hk) - set(bk))
    for k in new_keys:  # before the first larger key: a sorted base stays sorted (tie order)
        items = list(config.items())
        at = next((i for i, (key, _) in enumerate(items) if _is_m(key) and int(key) > k), None)
        at = len(items) if at is None else at
        config = dict([*items[:at], (hk[k], want[k]), *items[at:]])
    bad = _failures(config, want, ms)
    for k in new_keys:  # a new key that changes no timed M's tiling is noise in the file
        trial = {key: v for key, v in config.items() if key != hk[k]}
        trial_bad = _failures(trial, want, ms)
        if trial_bad <= bad:
            config, bad = trial, trial_bad
    served: dict[int, Side | None] = {}
    problems = []
    for m in ms:
        got = tiling(config, m)
        served[m] = chosen[m] if m not in bad else _whose(base, head, got, m)
        if m in bad:
            key = serving_key(config, m)
            side = chosen[m]
            own = serving_key(head if side == "head" else base, m)
            runs = "neither side's tiling at M" if served[m] is None else f"{served[m]}'s tiling"
            why = (
                f"M={m} wants {side}'s tiling (its key {own}) but is served by merged key {key}, "
                f"which carries the tiling chosen at M={key}, so it runs {runs}; adding key {m} "
                "would fix it but re-tiles the untimed Ms around it"
            )
            problems.append(NotRealisable(m, side, key, served[m], why))
    same = list(config) == list(base) and all(_plain(config[k]) == _plain(base[k]) for k in base)
    return Merged(config, chosen, served, tuple(problems), same)


def predicted_gain(
    merged: Merged,
    comparisons: Mapping[int, MCompare],
    weights: Mapping[int, float] | None = None,
) -> float:
    """Predicted relative change of total fused-MoE time vs base: sum(w * t_merged) /
    sum(w * t_base) - 1, from the measured means of the tiling that serves each M.

    ``weights`` is how often each timed M runs (forward passes); default 1 per timed M. Times
    are summed, not ratios averaged: a 10 % gain on a 5 µs kernel must not cancel a 10 % loss
    on a 500 µs one. Negative means faster.
    """
    ms = sorted(merged.served)
    untimed = [m for m in ms if m not in comparisons]
    if untimed:
        raise UsageError(
            "predicted_gain",
            "comparisons",
            untimed,
            "these Ms of the merged result have no comparison",
            "pass the comparisons best_of_both was built from",
        )
    if weights is None:
        w = dict.fromkeys(ms, 1.0)
    else:
        w = {}
        for m, x in weights.items():
            if m not in merged.served:
                raise UsageError(
                    "predicted_gain",
                    f"weight of M={m}",
                    x,
                    "this M was not timed, so no measured time exists to predict from",
                    "time it (pass it as a workload M to m_values) or drop it from the weights",
                )
            if (
                isinstance(x, bool)
                or not isinstance(x, (int, float))
                or not x >= 0
                or x == math.inf
            ):
                raise UsageError(
                    "predicted_gain", f"weight of M={m}", x, "must be finite and >= 0", "fix it"
                )
            w[m] = float(x)
        if not math.fsum(w.values()) > 0:
            raise UsageError(
                "predicted_gain", "weights", dict(weights), "all zero", "weight at least one M"
            )
    num, den = [], []
    for m in ms:
        if not w.get(m):
            continue
        c, side = comparisons[m], merged.served[m]
        if side is None:
            raise UsageError(
                "predicted_gain",
                f"M={m}",
                m,
                "the merged file serves it with a tiling neither side timed at this M",
                "time the merged file at this M, or give it weight 0",
            )
        num.append(w[m] * (c.head_mean if side == "head" else c.base_mean))
        den.append(w[m] * c.base_mean)
    return math.fsum(num) / math.fsum(den) - 1
