"""Nearest-key lookup as vLLM does it, coverage warnings, and tiling diffs between two files."""

from __future__ import annotations

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.coverage import (
    coverage_report,
    diff_coverage,
    nearest_key,
    pad_to_capture_size,
)
from pytest_moeperf.moeconfig.folder import in_tree_config_dir
from pytest_moeperf.moeconfig.validate import TileConfig, load_config

T16 = TileConfig(16, 64, 128, 1, 4, 4)
T32 = TileConfig(32, 64, 128, 1, 4, 3)
T64 = TileConfig(64, 128, 64, 1, 4, 3)
T128 = TileConfig(128, 128, 64, 16, 8, 3)
GRID = {1: T16, 2: T16, 4: T16, 8: T16, 16: T16, 32: T32, 64: T64, 256: T64, 1024: T128}


def vllm_pick(keys: list[int], m: int) -> int:
    """vLLM's expression, verbatim (try_get_optimal_moe_config)."""
    configs = dict.fromkeys(keys)
    return min(configs.keys(), key=lambda x: abs(x - m))


@pytest.mark.parametrize("m", [1, 3, 5, 6, 12, 24, 48, 100, 160, 640, 999, 5000])
def test_nearest_key_matches_vllm(m: int) -> None:
    keys = list(GRID)
    assert nearest_key(keys, m) == vllm_pick(keys, m)


def test_nearest_key_tie_goes_to_first_in_order() -> None:
    assert nearest_key([2, 4], 3) == 2
    assert nearest_key([4, 2], 3) == 4  # file order, not numeric order


def test_nearest_key_exact_and_extrapolated() -> None:
    assert nearest_key([1, 64, 4096], 64) == 64
    assert nearest_key([1, 64, 4096], 100000) == 4096


def test_nearest_key_empty_rejected() -> None:
    with pytest.raises(UsageError, match="no M keys"):
        nearest_key([], 8)


def test_report_maps_each_m() -> None:
    r = coverage_report(GRID, [1, 3, 24], [100, 700])
    got = [(e.m, e.phase, e.key) for e in r.entries]
    assert got == [
        (1, "decode", 1),
        (3, "decode", 2),
        (24, "decode", 16),
        (100, "prefill", 64),
        (700, "prefill", 1024),
    ]
    assert r.entries[2].ratio == pytest.approx(1.5)


def test_report_far_above_grid() -> None:
    r = coverage_report(GRID, [], [8192])
    (w,) = r.warnings
    assert (w.kind, w.m, w.key) == ("far_above_grid", 8192, 1024)
    assert "8.0x" in w.message


def test_report_far_below_grid() -> None:
    r = coverage_report({64: T64, 128: T64}, [1], [])
    assert [(w.kind, w.m, w.key) for w in r.warnings] == [("far_below_grid", 1, 64)]


def test_report_sparse_grid_inside() -> None:
    # M=600 sits between 256 and 1024, nearest 256 at 2.3x.
    r = coverage_report(GRID, [], [600])
    assert [(w.kind, w.key) for w in r.warnings] == [("sparse_grid", 256)]


def test_report_exactly_at_ratio_is_not_warned() -> None:
    assert coverage_report(GRID, [], [2048]).warnings == []


def test_report_ratio_is_configurable() -> None:
    assert coverage_report(GRID, [24], [], max_ratio=1.4).warnings[0].m == 24
    assert coverage_report(GRID, [24], [], max_ratio=1.6).warnings == []


def test_report_bad_ratio() -> None:
    with pytest.raises(UsageError, match="max_ratio"):
        coverage_report(GRID, [1], [], max_ratio=0.5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_report_bad_batch_size(bad: object) -> None:
    with pytest.raises(UsageError) as e:
        coverage_report(GRID, [bad], [])  # type: ignore[list-item]
    assert e.value.value == bad


def test_report_bad_prefill_count() -> None:
    with pytest.raises(UsageError, match="prefill"):
        coverage_report(GRID, [], [0])


def test_report_empty_config() -> None:
    with pytest.raises(UsageError):
        coverage_report({}, [1], [])


def test_report_tie_out_of_order_warns() -> None:
    # Keys listed large-first: M=3 ties between 2 and 4 and vLLM takes 4 (first in file).
    cfg = {4: T32, 2: T16, 1: T16}
    r = coverage_report(cfg, [3], [])
    assert [(w.kind, w.m, w.key) for w in r.warnings] == [("tie", 3, 4)]


def test_report_tie_sorted_file_no_warning() -> None:
    assert coverage_report({1: T16, 2: T16, 4: T32}, [3], []).warnings == []


def test_report_tie_same_tiling_no_warning() -> None:
    assert coverage_report({4: T16, 2: T16}, [3], []).warnings == []


def test_report_keys_only_skips_tie_check() -> None:
    assert coverage_report([4, 2], [3], []).warnings == []


def test_same_m_in_both_phases_warned_once() -> None:
    r = coverage_report(GRID, [8192], [8192])
    assert len(r.entries) == 2
    assert len(r.warnings) == 1


def test_capture_size_padding() -> None:
    assert pad_to_capture_size(3, [1, 2, 4, 8]) == 4
    assert pad_to_capture_size(9, [1, 2, 4, 8]) == 9  # beyond the largest graph: eager
    r = coverage_report(GRID, [3, 5], [], capture_sizes=[1, 2, 4, 8])
    assert [e.m for e in r.entries] == [4, 8]


def test_unused_keys_and_ranges() -> None:
    r = coverage_report(GRID, [1, 2], [700, 900])
    assert r.unused_keys == [4, 8, 16, 32, 64, 256]
    assert r.ranges() == {1: (1, 1), 2: (2, 2), 1024: (700, 900)}


def test_lines_show_warnings_first() -> None:
    lines = coverage_report(GRID, [1], [8192]).lines()
    assert lines[0].startswith("MoE config coverage: 2 M values")
    assert lines[1].startswith("WARNING [far_above_grid] M=8192")
    assert any("key   1024 serves M=8192" in line for line in lines)
    assert any("unused keys" in line for line in lines)


def test_diff_removed_key_shows_affected_range() -> None:
    # The case study: one mis-generalized key (256, tuned with T128) governs M=161..640.
    a = {**GRID, 256: T128}
    b = {k: v for k, v in a.items() if k != 256}
    d = diff_coverage(a, b, range(1, 2049), label_a="head", label_b="head-minus-256")
    assert d.changed_m == list(range(161, 545))  # 161..544 now go to 64 (T64); 545+ to 1024
    lines = d.lines()
    assert lines[0] == "head -> head-minus-256: 384 of 2048 M values change tiling"
    assert lines[1] == (
        "  M=161..544: key 256 (128x128x64 g16 w8 s3) -> key 64 (64x128x64 g1 w4 s3)"
    )
    assert len(lines) == 2  # 545..640 move to key 1024 with the same T128 tiling: no change


def test_diff_identical_files() -> None:
    d = diff_coverage(GRID, dict(GRID), [1, 2, 3, 1000])
    assert d.changes == []
    assert d.lines() == ["a -> b: same tiling for all 4 M"]


def test_diff_key_moved_same_tiling_is_not_a_change() -> None:
    b = {k: v for k, v in GRID.items() if k != 2}  # 2 -> 1 or 4, all T16
    assert diff_coverage(GRID, b, range(1, 9)).changes == []


def test_diff_against_default() -> None:
    d = diff_coverage(None, {1: T16, 64: T64}, [1, 64])
    assert [(c.m, c.key_a, c.key_b) for c in d.changes] == [(1, None, 1), (64, None, 64)]
    assert "default config -> key 1" in d.lines()[1]


def test_diff_both_default() -> None:
    assert diff_coverage(None, {}, [1, 2]).changes == []


def test_diff_non_contiguous_groups_split() -> None:
    a = {1: T16, 100: T64}
    b = {1: T32, 100: T64}
    d = diff_coverage(a, b, [1, 2, 100, 3])  # 3 sorts next to 2; 100 unchanged
    assert d.changed_m == [1, 2, 3]
    assert d.lines()[1].startswith("  M=1..3: key 1")


def test_diff_bad_m() -> None:
    with pytest.raises(UsageError):
        diff_coverage(GRID, GRID, [0])


@pytest.mark.skipif(in_tree_config_dir() is None, reason="vLLM not installed")
def test_in_tree_qwen3_h200_coverage_of_long_prefill() -> None:
    d = in_tree_config_dir()
    assert d is not None
    cfg = load_config(d / "E=128,N=768,device_name=NVIDIA_H200.json")
    r = coverage_report(cfg, [1, 2, 4, 8, 16, 32, 64, 128, 256], [8192, 16384])
    assert max(cfg) == 4096
    assert [(w.kind, w.m) for w in r.warnings] == [("far_above_grid", 16384)]


def test_diff_groups_split_when_target_key_changes() -> None:
    a = {1: T16, 8: T16}
    b = {1: T32, 8: T64}
    d = diff_coverage(a, b, range(1, 9), label_a="base", label_b="head")
    lines = d.lines()
    assert lines[0] == "base -> head: 8 of 8 M values change tiling"
    assert lines[1] == "  M=1..4: key 1 (16x64x128 g1 w4 s4) -> key 1 (32x64x128 g1 w4 s3)"
    assert lines[2] == "  M=5..8: key 8 (16x64x128 g1 w4 s4) -> key 8 (64x128x64 g1 w4 s3)"


def test_diff_single_m_group_and_to_default() -> None:
    d = diff_coverage({1: T16}, None, [7])
    assert d.lines()[1] == "  M=7: key 1 (16x64x128 g1 w4 s4) -> default config"
    (c,) = d.changes
    assert (c.key_b, c.tile_b) == (None, None)


def test_diff_duplicates_in_m_values_collapse() -> None:
    d = diff_coverage({1: T16}, {1: T32}, [1, 1, 2])
    assert d.m_values == [1, 2]
    assert d.changed_m == [1, 2]


def test_diff_tie_follows_file_order() -> None:
    # Same keys and tilings, other order: M=3 flips between the tilings of 2 and 4.
    a = {2: T16, 4: T32}
    b = {4: T32, 2: T16}
    assert diff_coverage(a, b, [1, 2, 3, 4, 5]).changed_m == [3]


def test_report_entry_ratio_exact_key() -> None:
    r = coverage_report(GRID, [64], [])
    (e,) = r.entries
    assert (e.key, e.ratio) == (64, 1.0)


def test_report_sorted_and_deduplicated() -> None:
    r = coverage_report(GRID, [8, 1, 8], [1])
    assert [(e.m, e.phase) for e in r.entries] == [(1, "decode"), (1, "prefill"), (8, "decode")]
    assert r.keys == sorted(GRID)


def test_report_lines_single_m_span() -> None:
    lines = coverage_report({1: T16}, [1], []).lines()
    assert "  key      1 serves M=1" in lines
    assert not any(line.startswith("WARNING") for line in lines)
