"""The per-M A/B table for the PR summary, and the numerics guard on each tiling's output.

The table uses the report's Markdown writer (escaping included) and number format, so it reads
like the rest of the A/B summary. Keys are named by the side that serves the M, because a
reviewer fixes keys, not Ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.perm import MCompare, Side, serving_key, tie_keys
from pytest_moeperf.moeconfig.perm_merge import Merged
from pytest_moeperf.report.content import Table
from pytest_moeperf.report.markdown import md_table
from pytest_moeperf.report.table import format_number

HEADERS = ("M", "base key", "head key", "base µs", "head µs", "Δ (CI)", "p", "verdict")
MARKS = {"faster": "▲ faster", "slower": "✗ slower", "same": "✓ same"}


@dataclass(frozen=True)
class PermRow:
    """One timed M: the key serving it on each side, the comparison, and a tie note."""

    m: int
    base_key: str
    head_key: str
    compare: MCompare
    tie: str = ""  # set when file order, not distance, picks the tiling on either side


def tie_note(base: Mapping[str, Any], head: Mapping[str, Any], m: int) -> str:
    """Say so when file order, not distance, changes the tiling at M: a tie between keys with
    different tilings that the two sides break differently, or towards a larger key. Ties a
    sorted file sends to the smaller key on both sides are routine (M=3 on a 2, 4 grid)."""
    tb, th = tie_keys(base, m), tie_keys(head, m)
    kb, kh = int(serving_key(base, m)), int(serving_key(head, m))
    if not (tb or th) or (kb == kh and all(k == min(t) for k, t in ((kb, tb), (kh, th)) if t)):
        return ""
    near = sorted(set(tb) | set(th))
    return (
        f"M={m} is equally near keys {', '.join(map(str, near))}: file order picks key "
        f"{serving_key(base, m)} in base and {serving_key(head, m)} in head"
    )


def perm_rows(
    base: Mapping[str, Any], head: Mapping[str, Any], comparisons: Mapping[int, MCompare]
) -> list[PermRow]:
    return [
        PermRow(
            m,
            serving_key(base, m, source="base"),
            serving_key(head, m, source="head"),
            comparisons[m],
            tie_note(base, head, m),
        )
        for m in sorted(comparisons)
    ]


def _pct(x: float) -> str:
    return f"{x * 100:+.2f}"


def _cells(r: PermRow) -> tuple[str, ...]:
    c = r.compare
    if c.same_tiling:
        delta, p, word = "same tiling", "n/a", "✓ same (same tiling)"
    else:
        lo, hi = c.ci
        delta = f"{_pct(c.delta)} % ({_pct(lo)}..{_pct(hi)})"
        p = "n/a" if c.p_value is None else f"{c.p_value:.2g}"
        word = MARKS[c.verdict]
        if c.verdict == "same" and c.significant:
            word += " (below minimum effect)"
    return (
        str(r.m),
        r.base_key,
        r.head_key,
        format_number(c.base_mean),
        format_number(c.head_mean),
        delta,
        p,
        word,
    )


def _keys_line(label: str, by_key: Mapping[str, list[int]]) -> str:
    if not by_key:
        return f"- {label}: none"
    items = [f"{k} (M={', '.join(map(str, ms))})" for k, ms in sorted(by_key.items(), key=_k)]
    return f"- {label}: " + "; ".join(items)


def _k(item: tuple[str, list[int]]) -> int:
    return int(item[0])


def perm_table(
    rows: Sequence[PermRow], *, merged: Merged | None = None, gain: float | None = None
) -> str:
    """Markdown table (one row per timed M) and the lines a reviewer acts on; no trailing newline.

    "Changed nothing" lists head keys all of whose timed Ms came out "same" (unchanged tiling,
    or re-tiled without a measurable effect). A file that re-tiles no timed M says "no change".
    """
    out = [md_table(Table(HEADERS, tuple(_cells(r) for r in rows)))] if rows else []
    if not rows:
        out.append("(no M timed)")
    out.append("")
    if rows and all(r.compare.same_tiling for r in rows):
        out.append("- no change: head serves every timed M with base's tiling")
    slower: dict[str, list[int]] = {}
    faster: dict[str, list[int]] = {}
    served: dict[str, list[MCompare]] = {}
    for r in rows:
        served.setdefault(r.head_key, []).append(r.compare)
        if r.compare.verdict == "slower":
            slower.setdefault(r.head_key, []).append(r.m)
        elif r.compare.verdict == "faster":
            faster.setdefault(r.head_key, []).append(r.m)
    nothing = sorted(
        (k for k, cs in served.items() if all(c.verdict == "same" for c in cs)), key=int
    )
    out.append(_keys_line("regressed keys (head slower)", slower))
    out.append(_keys_line("faster keys (head)", faster))
    out.append("- keys that changed nothing: " + (", ".join(nothing) if nothing else "none"))
    out += [f"- key order decides: {r.tie}" for r in rows if r.tie]
    if merged is not None:
        heads = [m for m, s in merged.chosen.items() if s == "head"]
        if merged.same_as_base:
            lost = sorted(m for ms in faster.values() for m in ms)
            why = (f"head is faster only at M={', '.join(map(str, lost))}, which no merged key "
                   "can serve with head's tiling (below)" if lost
                   else "head is faster at no timed M")  # fmt: skip
            out.append(f"- best of both: base unchanged ({why})")
        else:
            out.append(
                f"- best of both: head's tiling at M={', '.join(map(str, heads))}, base's elsewhere"
            )
        out += [f"- not realisable: {p.why}" for p in merged.not_realisable]
    if gain is not None:
        out.append(f"- predicted change of fused-MoE time vs base: {_pct(gain)} %")
    return "\n".join(out)


#: Unit roundoff of the rounding each output dtype applies, and of the kernel's accumulator.
_UNITS: dict[str, tuple[float, float]] = {
    "bf16": (2.0**-8, 2.0**-24),  # bf16 storage, fp32 tl.dot accumulation
    "fp16": (2.0**-11, 2.0**-24),
    "fp8_w8a8": (2.0**-4, 2.0**-14),  # e4m3 activations; Hopper fp8 MMA keeps ~14 bits
}
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
IO_UNITS = 4.0  # "a few units" of the storage rounding
ACC_UNITS = 2.0


def numerics_tolerance(dtype: str, k: int) -> float:
    """Largest norm-wise relative error ``||y - y_ref|| / ||y_ref||`` a correct tiling may show
    against an fp32 reference of the same MoE (same weights, unquantised activations).

    ``tol = 4 * u_io + 2 * sqrt(k) * u_acc``. u_io is the rounding of what the kernel stores:
    2^-8 for bf16 (8 significant bits), 2^-11 for fp16, and for fp8_w8a8 the e4m3 rounding of
    the activations (2^-4), which dominates everything else. A correct kernel rounds about four
    times (both GEMM outputs, the activation, the final sum), each ~u/2 rms and independent, so
    it shows ~1 u; 4 u leaves room without hiding gross bugs (masking, lost K blocks at small k),
    which give errors of order 1. The second term is the accumulation over k (pass the longer
    reduction, normally the hidden size): rounding errors of a k-term sum random-walk, so they
    grow like sqrt(k) times the accumulator's unit: negligible with fp32 accumulation, ~1 % for
    fp8 MMA at k=7168. Limits: for fp8 the bound (~0.25) cannot see one K block lost
    out of many; other quantised dtypes (int8, int4) have no bound derived here.
    """
    d = _ALIASES.get(dtype, dtype)
    if d not in _UNITS:
        raise UsageError(
            "numerics_tolerance",
            "dtype",
            dtype,
            "no error bound derived for this dtype",
            f"use one of {sorted(_UNITS)}",
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UsageError("numerics_tolerance", "k", k, "must be a positive integer", "pass K")
    u_io, u_acc = _UNITS[d]
    return IO_UNITS * u_io + ACC_UNITS * math.sqrt(k) * u_acc


@dataclass(frozen=True)
class NumericsFailure:
    side: Side
    m: int
    error: float
    tolerance: float

    def text(self) -> str:
        return (
            f"{self.side} tiling at M={self.m}: relative error {self.error:.3g} "
            f"> tolerance {self.tolerance:.3g}"
        )


@dataclass(frozen=True)
class NumericsVerdict:
    """Fails on head's tilings only; base's are reported (an old bug is not this PR's)."""

    passed: bool
    tolerance: float
    failures: tuple[NumericsFailure, ...]  # head
    base_failures: tuple[NumericsFailure, ...]
    message: str


def _over(side: Side, errors: Mapping[int, float], tol: float) -> tuple[NumericsFailure, ...]:
    out = []
    for m in sorted(errors):
        e = errors[m]
        if isinstance(e, bool) or not isinstance(e, (int, float)) or e < 0:
            raise UsageError(
                f"{side} numerics", f"error at M={m}", e, "must be a number >= 0", "fix it"
            )
        if not e <= tol:  # NaN or inf output is a failure, not bad input
            out.append(NumericsFailure(side, m, float(e), tol))
    return tuple(out)


def check_numerics(
    err_base: Mapping[int, float], err_head: Mapping[int, float], dtype: str, k: int
) -> NumericsVerdict:
    """Per-M relative errors (see numerics_tolerance) of each side's tiling against the bound."""
    tol = numerics_tolerance(dtype, k)
    head, base = _over("head", err_head, tol), _over("base", err_base, tol)
    if head:
        msg = "numerics FAIL: " + "; ".join(f.text() for f in head)
    else:
        msg = f"numerics ok: every head tiling within {tol:.3g} ({dtype}, k={k})"
    if base:
        msg += "; base already fails: " + "; ".join(f.text() for f in base)
    return NumericsVerdict(not head, tol, head, base, msg)
