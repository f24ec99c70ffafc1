"""Which tuned M key serves each batch size a workload reaches, and where the grid has gaps.

vLLM (``try_get_optimal_moe_config``) takes ``configs[min(configs.keys(), key=lambda x: abs(x -
M))]``: the nearest key wins, ties go to the key that comes first in the file, and there is no
limit on distance. So a key tuned for M=4096 also runs M=16384 prefill chunks, and one badly
tuned key can silently govern a whole range of batch sizes. This module makes those ranges
visible and diffs two files by the tiling each M actually gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.validate import TileConfig

Phase = Literal["decode", "prefill"]
WarningKind = Literal["far_below_grid", "far_above_grid", "sparse_grid", "tie"]
DEFAULT_MAX_RATIO = 2.0


def nearest_key(keys: Iterable[int], m: int) -> int:
    """The key vLLM uses for ``m``: nearest by absolute distance, first in order on a tie."""
    ks = list(keys)
    if not ks:
        raise UsageError(
            "coverage",
            "config keys",
            ks,
            "a config with no M keys has no nearest key (vLLM would use its default config)",
            "pass the keys of a non-empty config",
        )
    return min(ks, key=lambda x: abs(x - m))


def _ratio(key: int, m: int) -> float:
    return max(key / m, m / key)


@dataclass(frozen=True)
class CoverageEntry:
    """One batch size M the workload reaches and the key that serves it."""

    m: int
    phase: Phase
    key: int
    ratio: float  # max(key/M, M/key); 1.0 when the key was tuned for exactly this M


@dataclass(frozen=True)
class CoverageWarning:
    kind: WarningKind
    m: int
    key: int
    message: str


@dataclass
class CoverageReport:
    """The workload's M values mapped to keys, with warnings for poorly covered ones."""

    keys: list[int]
    entries: list[CoverageEntry]
    warnings: list[CoverageWarning] = field(default_factory=list)
    max_ratio: float = DEFAULT_MAX_RATIO

    @property
    def unused_keys(self) -> list[int]:
        """Tuned keys no reached M uses: harmless, but tuning effort spent elsewhere."""
        used = {e.key for e in self.entries}
        return sorted(k for k in self.keys if k not in used)

    def ranges(self) -> dict[int, tuple[int, int]]:
        """key -> (smallest M, largest M) it serves in this workload."""
        out: dict[int, tuple[int, int]] = {}
        for e in self.entries:
            lo, hi = out.get(e.key, (e.m, e.m))
            out[e.key] = (min(lo, e.m), max(hi, e.m))
        return dict(sorted(out.items()))

    def lines(self) -> list[str]:
        """Human-readable report lines, warnings first."""
        out = [f"MoE config coverage: {len(self.entries)} M values, {len(self.keys)} keys"]
        out += [f"WARNING [{w.kind}] {w.message}" for w in self.warnings]
        for key, (lo, hi) in self.ranges().items():
            span = f"M={lo}" if lo == hi else f"M={lo}..{hi}"
            out.append(f"  key {key:>6} serves {span}")
        if self.unused_keys:
            out.append(f"  unused keys: {self.unused_keys}")
        return out


def pad_to_capture_size(batch: int, capture_sizes: Sequence[int]) -> int:
    """Decode batches run under CUDA graphs padded up to the next capture size (vLLM V1)."""
    bigger = [s for s in capture_sizes if s >= batch]
    return min(bigger) if bigger else batch


def _check_ms(values: Iterable[int], what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(
                "coverage", what, v, "batch sizes must be positive integers", "fix the workload"
            )
        out.append(v)
    return out


def coverage_report(
    keys: Iterable[int] | Mapping[int, TileConfig],
    decode_batch_sizes: Iterable[int],
    prefill_token_counts: Iterable[int],
    *,
    max_ratio: float = DEFAULT_MAX_RATIO,
    capture_sizes: Sequence[int] | None = None,
) -> CoverageReport:
    """Map each M the workload reaches to its key and warn where the nearest key is far.

    Decode steps run M = batch size (padded to ``capture_sizes`` when given); prefill steps
    run M = tokens in the forward pass (already capped by --max-num-batched-tokens by the
    caller). Passing the config itself instead of bare keys also flags ties that vLLM
    resolves towards the larger key because the file lists it first.
    """
    if max_ratio < 1.0:
        raise UsageError(
            "coverage", "max_ratio", max_ratio, "must be >= 1.0", "use e.g. 2.0 (key within 2x)"
        )
    tiles = keys if isinstance(keys, Mapping) else None
    ks = list(keys)
    nearest_key(ks, 1)  # raises for an empty key set
    lo_key, hi_key = min(ks), max(ks)
    decode = _check_ms(decode_batch_sizes, "decode batch size")
    if capture_sizes:
        decode = [pad_to_capture_size(b, capture_sizes) for b in decode]
    prefill = _check_ms(prefill_token_counts, "prefill token count")
    phases: dict[tuple[int, Phase], None] = {}
    for m in decode:
        phases[(m, "decode")] = None
    for m in prefill:
        phases[(m, "prefill")] = None
    entries: list[CoverageEntry] = []
    warnings: list[CoverageWarning] = []
    warned: set[int] = set()
    for m, phase in sorted(phases):
        key = nearest_key(ks, m)
        r = _ratio(key, m)
        entries.append(CoverageEntry(m, phase, key, r))
        if m in warned:
            continue
        warned.add(m)
        if r > max_ratio:
            if m < lo_key:
                kind: WarningKind = "far_below_grid"
                where = f"below the smallest tuned key {lo_key}"
            elif m > hi_key:
                kind = "far_above_grid"
                where = f"above the largest tuned key {hi_key}"
            else:
                kind = "sparse_grid"
                where = "between tuned keys"
            msg = (
                f"M={m} ({phase}) is {where}: it runs the tiling tuned for M={key} "
                f"({r:.1f}x away, limit {max_ratio:g}x); tune a key near M={m}"
            )
            warnings.append(CoverageWarning(kind, m, key, msg))
        if tiles is not None:
            # Ties are routine on a power-of-two grid (M=3 between 2 and 4) and sorted files
            # send them to the smaller key; warn only when file order sends one to the larger.
            smaller = [k for k in ks if k < key and abs(k - m) == abs(key - m)]
            for other in smaller:
                if tiles[other] != tiles[key]:
                    msg = (
                        f"M={m} ({phase}) is equally near keys {other} and {key} with different "
                        f"tilings; vLLM picks {key} only because it comes first in the file "
                        f"(keys out of order); sort the keys or tune M={m} explicitly"
                    )
                    warnings.append(CoverageWarning("tie", m, key, msg))
    return CoverageReport(keys=sorted(ks), entries=entries, warnings=warnings, max_ratio=max_ratio)


@dataclass(frozen=True)
class TilingChange:
    """One M value whose tiling differs between config a and config b (None: default config)."""

    m: int
    key_a: int | None
    tile_a: TileConfig | None
    key_b: int | None
    tile_b: TileConfig | None


@dataclass
class CoverageDiff:
    label_a: str
    label_b: str
    m_values: list[int]
    changes: list[TilingChange]

    @property
    def changed_m(self) -> list[int]:
        return [c.m for c in self.changes]

    def lines(self) -> list[str]:
        """Report lines, merging runs of consecutive M values with the same change."""
        if not self.changes:
            return [f"{self.label_a} -> {self.label_b}: same tiling for all {len(self.m_values)} M"]
        out = [
            f"{self.label_a} -> {self.label_b}: {len(self.changes)} of {len(self.m_values)} M "
            "values change tiling"
        ]
        order = {m: i for i, m in enumerate(self.m_values)}
        group: list[TilingChange] = []

        def flush() -> None:
            first, last = group[0], group[-1]
            span = f"M={first.m}" if first.m == last.m else f"M={first.m}..{last.m}"
            out.append(
                f"  {span}: {_side(first.key_a, first.tile_a)} -> "
                f"{_side(first.key_b, first.tile_b)}"
            )

        for c in self.changes:
            if group and (
                (c.key_a, c.key_b) != (group[-1].key_a, group[-1].key_b)
                or order[c.m] != order[group[-1].m] + 1
            ):
                flush()
                group = []
            group.append(c)
        flush()
        return out


def _side(key: int | None, tile: TileConfig | None) -> str:
    return "default config" if key is None or tile is None else f"key {key} ({tile.short()})"


def diff_coverage(
    a: Mapping[int, TileConfig] | None,
    b: Mapping[int, TileConfig] | None,
    m_values: Iterable[int],
    *,
    label_a: str = "a",
    label_b: str = "b",
) -> CoverageDiff:
    """Which M values run a different tiling under config b than under config a.

    None (or an empty config) stands for "no file": vLLM's computed default, which differs
    from any tuned entry for the purpose of this diff. Keys that merely move (same tiling
    reached through another key) do not count as changes.
    """
    ms = sorted(set(_check_ms(m_values, "M value")))
    changes: list[TilingChange] = []
    for m in ms:
        ka = nearest_key(a.keys(), m) if a else None
        kb = nearest_key(b.keys(), m) if b else None
        ta = a[ka] if a and ka is not None else None
        tb = b[kb] if b and kb is not None else None
        if ta != tb:
            changes.append(TilingChange(m, ka, ta, kb, tb))
    return CoverageDiff(label_a, label_b, ms, changes)
