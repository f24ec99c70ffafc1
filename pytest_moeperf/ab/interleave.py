"""Interleave runs of two live servers on one machine so that drift hits both sides alike.

Measuring all of A and then all of B turns any slow drift (GPU clocks warming, a neighbour job,
thermal throttling) into a fake A/B difference. Both servers stay up and the runs alternate in
counterbalanced pairs, A B | B A | A B | ...: a drift that is linear in time then adds the same
amount to both sides over every two pairs. Run ``k`` of either side sends the same requests
(same seed offset), so the two sides see identical traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pytest_moeperf.errors import UsageError

T = TypeVar("T")


def schedule(pairs: int, sides: tuple[str, str] = ("base", "head")) -> list[tuple[str, int]]:
    """(side, run index) in measuring order: pair k runs ``sides[0]`` first when k is even."""
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise UsageError(
            "A/B schedule",
            "pairs",
            pairs,
            "must be an integer >= 1",
            "set --moeperf-ab-pairs to 3 or more (the verdict needs 3 a side)",
        )
    a, b = sides
    out: list[tuple[str, int]] = []
    for k in range(pairs):
        first, second = (a, b) if k % 2 == 0 else (b, a)
        out += [(first, k), (second, k)]
    return out


@dataclass
class Interleaved(Generic[T]):
    """The runs of each side in run-index order, and the order they were measured in."""

    sides: tuple[str, str]
    runs: dict[str, list[T]] = field(default_factory=dict)
    order: list[tuple[str, int]] = field(default_factory=list)

    def of(self, side: str) -> list[T]:
        return self.runs.get(side, [])


def run_interleaved(
    measure: Callable[[str, int], T], pairs: int, sides: tuple[str, str] = ("base", "head")
) -> Interleaved[T]:
    """Call ``measure(side, k)`` in the counterbalanced order; exceptions propagate at once.

    A partial result is never judged: the caller keeps what ``order`` says was measured.
    """
    out: Interleaved[T] = Interleaved(sides, {s: [] for s in sides})
    for side, k in schedule(pairs, sides):
        out.runs[side].append(measure(side, k))
        out.order.append((side, k))
    return out


def sweep_order(
    levels: Sequence[int], sides: tuple[str, str] = ("base", "head")
) -> list[tuple[int, str]]:
    """(concurrency, side) for a sweep: one run per side per level, alternating which goes first."""
    bad = [c for c in levels if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if bad or not levels:
        raise UsageError(
            "--moeperf-sweep",
            "levels",
            list(levels),
            "must be a non-empty list of integers >= 1",
            "e.g. --moeperf-sweep 1,4,16,64",
        )
    a, b = sides
    out: list[tuple[int, str]] = []
    for i, c in enumerate(levels):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        out += [(c, first), (c, second)]
    return out


def sweep_row(concurrency: int, side: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """One sweep level of one side, as the summary, the report and the cross-check read it."""
    keep = ("output_tok_s", "ttft_p99_ms", "tpot_p99_ms", "tok_per_j")
    return {"concurrency": concurrency, "config": side, "rate": None,
            **{k: metrics.get(k) for k in keep}}  # fmt: skip
