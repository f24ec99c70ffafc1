"""Unit tests for changed-config discovery, vLLM's nearest-key rule and the A/B run order.

Complements test_moeconfig_gitdiff.py, test_moeconfig_coverage.py and test_ab.py: statuses and
texts per kind of change, file-name filtering, ranges that name no commit, M ranges that share
a key, the default-config side of a diff, and the counterbalancing that cancels linear drift.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from git_helpers import commit, git, put

from pytest_moeperf.ab.interleave import run_interleaved, schedule, sweep_order
from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.coverage import (
    coverage_report,
    diff_coverage,
    nearest_key,
    pad_to_capture_size,
)
from pytest_moeperf.moeconfig.folder import IN_TREE
from pytest_moeperf.moeconfig.gitdiff import changed_config_files
from pytest_moeperf.moeconfig.validate import TileConfig

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")

A = "E=128,N=768,device_name=NVIDIA_H200.json"
B = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
C = "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"
D = "E=64,N=1408,device_name=NVIDIA_A100-SXM4-80GB.json"
FLY = "E=128,N=768,device_name=NVIDIA_H200,backend=flydsl.json"


def cfg(bm: int) -> str:
    """A one-key config whose BLOCK_SIZE_M marks which version of the file this is."""
    tile = {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    return json.dumps({"1": tile}, indent=4) + "\n"


# -- git helpers ---------------------------------------------------------------------------------
@pytest.fixture
def git_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's git config (hooks, signing, autocrlf) out of the module's git calls."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def repo(tmp_path: Path, git_env: None) -> Path:
    """A repo whose 'base' tag holds A and C in configs/ and D at the root."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    put(r, "README.md", "x\n")
    put(r, f"configs/{A}", cfg(16))
    put(r, f"configs/{C}", cfg(32))
    put(r, D, cfg(64))
    commit(r, "base")
    git(r, "tag", "base")
    return r


# -- gitdiff -------------------------------------------------------------------------------------
@needs_git
def test_each_status_carries_exactly_the_texts_of_its_sides(repo: Path) -> None:
    """Added has no base text, deleted no head text, modified both: vLLM falls back otherwise."""
    base = git(repo, "rev-parse", "base")
    put(repo, f"configs/{A}", cfg(128))
    (repo / "configs" / C).unlink()
    put(repo, f"configs/{B}", cfg(8))
    head = commit(repo, "head")
    got = {c.file_name: c for c in changed_config_files(repo, "base..HEAD")}
    assert {n: c.status for n, c in got.items()} == {A: "modified", B: "added", C: "deleted"}
    mod, add, dele = got[A], got[B], got[C]
    assert (mod.base_text, mod.head_text) == (cfg(16), cfg(128))
    assert (mod.base_label, mod.head_label) == (f"{base}:configs/{A}", f"{head}:configs/{A}")
    assert (add.base_text, add.head_text) == (None, cfg(8))
    assert (add.base_label, add.head_label) == (IN_TREE, f"{head}:configs/{B}")
    assert (dele.base_text, dele.head_text) == (cfg(32), None)
    assert (dele.base_label, dele.head_label) == (f"{base}:configs/{C}", IN_TREE)
    for c in got.values():
        assert (c.base_rev, c.head_rev) == (base, head)


@needs_git
def test_non_config_json_files_are_ignored(repo: Path) -> None:
    """Only names vLLM would look up count; near misses would never be loaded."""
    for rel in [
        "configs/config.json",  # a model config, not a MoE tiling
        "configs/E=128,N=768.json",  # no device_name
        "configs/E=128,N=768,device_name=NVIDIA_H200.JSON",  # vLLM appends lower-case .json
        "configs/E=128,N=768,device_name=NVIDIA_H200.json.bak",
        "configs/e=128,n=768,device_name=NVIDIA_H200.json",  # case matters to vLLM
        "configs/E=128,N=768,device_name=NVIDIA_H200,block_shape=[128, 128].json",
        f"configs/{FLY}",  # FlyDSL: never read from a tuned folder
        "configs/notes.txt",
    ]:
        put(repo, rel, "{}\n")
    put(repo, f"configs/{A}", cfg(64))  # the one real change, so an empty result is a failure
    commit(repo, "noise")
    assert [c.path for c in changed_config_files(repo, "base..HEAD")] == [f"configs/{A}"]


@needs_git
def test_config_files_outside_config_folders_are_found(repo: Path) -> None:
    """vLLM's VLLM_TUNED_CONFIG_FOLDER can be any folder, so the path does not matter."""
    put(repo, D, cfg(8))  # at the repo root
    put(repo, f"scripts/tuning/out run/ü/{B}", cfg(16))  # space and non-ASCII in the path
    commit(repo, "tuned elsewhere")
    got = changed_config_files(repo, "base..HEAD")
    assert [(c.path, c.status) for c in got] == [
        (D, "modified"),
        (f"scripts/tuning/out run/ü/{B}", "added"),
    ]
    assert got[0].base_text == cfg(64) and got[0].head_text == cfg(8)
    assert got[1].head_text == cfg(16)


@needs_git
def test_results_sorted_by_path(repo: Path) -> None:
    """A stable order keeps the generated test ids stable between CI runs."""
    for rel in [f"z/{A}", f"a/{A}", f"m/{C}", B]:
        put(repo, rel, cfg(8))
    commit(repo, "many")
    paths = [c.path for c in changed_config_files(repo, "base..HEAD")]
    assert paths == [B, f"a/{A}", f"m/{C}", f"z/{A}"]


@needs_git
def test_move_to_another_folder_is_delete_plus_add_of_the_same_name(repo: Path) -> None:
    """git would call it a rename; the two paths are different lookups for vLLM."""
    (repo / "tuned").mkdir()
    git(repo, "mv", f"configs/{A}", f"tuned/{A}")
    commit(repo, "move")
    got = changed_config_files(repo, "base..HEAD")
    assert [(c.path, c.status) for c in got] == [
        (f"configs/{A}", "deleted"),
        (f"tuned/{A}", "added"),
    ]
    assert got[0].base_text == got[1].head_text == cfg(16)
    assert all(c.file_name == A for c in got)


@needs_git
def test_rename_with_edit_keeps_both_texts_apart(repo: Path) -> None:
    """A similarity-detected rename must not pair the old name's text with the new name."""
    new = A.replace("NVIDIA_H200", "NVIDIA_H100")
    git(repo, "mv", f"configs/{A}", f"configs/{new}")
    put(repo, f"configs/{new}", cfg(32))
    commit(repo, "rename and edit")
    got = {c.file_name: c for c in changed_config_files(repo, "base..HEAD")}
    assert (got[A].status, got[A].base_text, got[A].head_text) == ("deleted", cfg(16), None)
    assert (got[new].status, got[new].base_text, got[new].head_text) == ("added", None, cfg(32))
    assert got[new].name.device_name == "NVIDIA_H100"


@needs_git
def test_mode_only_change_is_not_a_config_change(repo: Path) -> None:
    """chmod +x leaves the bytes vLLM reads alone: an A/B would compare a file with itself."""
    git(repo, "update-index", "--chmod=+x", f"configs/{A}")
    git(repo, "commit", "-q", "-m", "chmod")
    assert git(repo, "diff", "--name-only", "base..HEAD") == f"configs/{A}"  # git sees a change
    assert changed_config_files(repo, "base..HEAD") == []


@needs_git
def test_mode_and_content_change_is_still_reported(repo: Path) -> None:
    """Skipping mode-only changes must not hide an edit made in the same commit."""
    put(repo, f"configs/{A}", cfg(64))
    git(repo, "add", "-A")
    git(repo, "update-index", "--chmod=+x", f"configs/{A}")
    git(repo, "commit", "-q", "-m", "chmod and edit")
    (c,) = changed_config_files(repo, "base..HEAD")
    assert (c.status, c.base_text, c.head_text) == ("modified", cfg(16), cfg(64))


@needs_git
def test_range_with_commits_but_no_config_changes(repo: Path) -> None:
    """Docs-only PRs must yield no cases rather than an error."""
    put(repo, "README.md", "changed\n")
    put(repo, "src/app.json", '{"a": 1}\n')
    commit(repo, "docs")
    commit(repo, "empty")
    assert changed_config_files(repo, "base..HEAD") == []
    assert changed_config_files(repo, "base...HEAD") == []


@needs_git
def test_change_reverted_within_the_range_is_no_change(repo: Path) -> None:
    """The range compares its end points, not each commit: a revert cancels the edit."""
    put(repo, f"configs/{A}", cfg(64))
    commit(repo, "edit")
    put(repo, f"configs/{A}", cfg(16))
    commit(repo, "revert")
    assert changed_config_files(repo, "base..HEAD") == []
    assert [c.path for c in changed_config_files(repo, "HEAD~1..HEAD")] == [f"configs/{A}"]


@needs_git
def test_range_order_decides_which_side_is_base(repo: Path) -> None:
    """HEAD..base swaps the sides: an add becomes a delete, texts swap with it."""
    put(repo, f"configs/{B}", cfg(8))
    commit(repo, "add")
    (fwd,) = changed_config_files(repo, "base..HEAD")
    (rev,) = changed_config_files(repo, "HEAD..base")
    assert (fwd.status, rev.status) == ("added", "deleted")
    assert rev.base_text == fwd.head_text == cfg(8)
    assert rev.head_text is None


@needs_git
def test_open_three_dot_defaults_to_head(repo: Path) -> None:
    """'base...' is 'base...HEAD', as in git."""
    put(repo, f"configs/{C}", cfg(256))
    head = commit(repo, "head")
    (c,) = changed_config_files(repo, "base...")
    assert c.head_rev == head and c.head_text == cfg(256)


@needs_git
def test_working_tree_statuses(repo: Path) -> None:
    """One revision vs the working tree: deletions and staged adds count, untracked files not."""
    (repo / "configs" / C).unlink()  # deleted, not staged
    put(repo, f"staged/{B}", cfg(8))
    git(repo, "add", f"staged/{B}")  # staged add
    put(repo, f"untracked/{A}", cfg(8))  # never added
    got = changed_config_files(repo, "base")
    assert [(c.path, c.status) for c in got] == [
        (f"configs/{C}", "deleted"),
        (f"staged/{B}", "added"),
    ]
    assert got[0].head_rev == got[1].head_rev == "working tree"
    assert got[0].head_text is None and got[1].head_text == cfg(8)


@needs_git
@pytest.mark.parametrize(
    ("rng", "bad_rev"),
    [
        ("nosuch", "nosuch"),
        ("base..nosuch", "nosuch"),
        ("origin/main...HEAD", "origin/main"),
        ("HEAD...nosuch", "nosuch"),
        ("HEAD^{tree}", "HEAD^{tree}"),  # a tree, not a commit
        ("base..HEAD~99", "HEAD~99"),
    ],
)
def test_bad_range_names_the_range_the_revision_and_the_fix(
    repo: Path, rng: str, bad_rev: str
) -> None:
    """One CI log line must say which range, which part of it, and how to fetch the base."""
    with pytest.raises(UsageError) as e:
        changed_config_files(repo, rng)
    assert e.value.value == rng
    assert f"revision {bad_rev!r} does not name a commit" in e.value.problem
    assert "BASE..HEAD" in e.value.fix and "fetch-depth: 0" in e.value.fix
    assert repr(rng) in str(e.value) and "Fix:" in str(e.value)


@needs_git
@pytest.mark.parametrize("rng", ["", " base..HEAD", "base..HEAD\n", "-p", "--no-index"])
def test_malformed_range_rejected_before_git_sees_it(repo: Path, rng: str) -> None:
    """Option-like or padded strings must not reach git as options or odd revisions."""
    with pytest.raises(UsageError) as e:
        changed_config_files(repo, rng)
    assert e.value.value == rng
    assert e.value.problem == "not a revision range"
    assert "origin/main...HEAD" in e.value.fix


# -- coverage: vLLM's nearest-key rule -----------------------------------------------------------
T16 = TileConfig(16, 64, 128, 1, 4, 4)
T32 = TileConfig(32, 64, 128, 1, 4, 3)
T64 = TileConfig(64, 128, 64, 1, 4, 3)
T128 = TileConfig(128, 128, 64, 16, 8, 3)
POW2 = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


def vllm_pick(configs: dict[int, Any], m: int) -> int:
    """vLLM's expression, verbatim (fused_moe.py, try_get_optimal_moe_config)."""
    return min(configs.keys(), key=lambda x: abs(x - m))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nearest_key_agrees_with_vllm_for_every_m_and_file_order(seed: int) -> None:
    """Any deviation (sorting the keys, a distance cap) changes which tiling a batch runs."""
    keys = list(POW2)
    random.Random(seed).shuffle(keys)  # file order is whatever the tuner wrote
    configs = dict.fromkeys(keys)
    for m in range(1, 9000):
        assert nearest_key(keys, m) == vllm_pick(configs, m), m


@pytest.mark.parametrize(
    ("keys", "m", "want"),
    [
        ([16, 32], 24, 16),  # exact midpoint: first listed wins
        ([32, 16], 24, 32),
        ([48, 64], 56, 48),  # not a power-of-two grid
        ([64, 48], 56, 64),
        ([1, 3, 5], 4, 3),  # tie between the 2nd and 3rd key
        ([5, 1, 3], 4, 5),
        ([1, 4], 2, 1),  # 2 is nearer to 1 (1 away) than 4 (2 away)
    ],
)
def test_nearest_key_ties_follow_file_order(keys: list[int], m: int, want: int) -> None:
    """vLLM's min() keeps the first of equal distances, so the file's key order decides."""
    assert nearest_key(keys, m) == want == vllm_pick(dict.fromkeys(keys), m)


@pytest.mark.parametrize("m", [4097, 8192, 16384, 10**7])
def test_beyond_the_largest_key_the_largest_key_serves(m: int) -> None:
    """vLLM puts no limit on distance: M=10**7 still runs the tiling tuned for 4096."""
    assert nearest_key(POW2, m) == 4096
    assert nearest_key([4096, 1], m) == 4096


def test_below_the_smallest_key_the_smallest_key_serves() -> None:
    """Small decode batches below a prefill-only grid run the smallest key however far."""
    assert [nearest_key([64, 128, 4096], m) for m in (1, 32, 64, 95, 96, 97)] == [
        64, 64, 64, 64, 64, 128,
    ]  # fmt: skip


def test_ranges_of_m_that_share_a_key() -> None:
    """Each key serves from just above the lower midpoint up to and including the upper one."""
    keys = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    r = coverage_report(keys, range(1, 8193), [])
    assert r.ranges() == {
        1: (1, 1),
        2: (2, 3),  # 3 ties between 2 and 4: 2 is listed first
        4: (4, 6),  # 6 ties between 4 and 8
        8: (7, 12),
        16: (13, 24),
        32: (25, 48),
        64: (49, 96),
        128: (97, 192),
        256: (193, 384),
        512: (385, 768),
        1024: (769, 1536),
        2048: (1537, 3072),
        4096: (3073, 8192),  # everything above 4096 too
    }
    assert r.unused_keys == []
    assert {e.m for e in r.entries if e.key == 8} == set(range(7, 13))


def test_ranges_shift_when_the_file_lists_larger_keys_first() -> None:
    """Out-of-order files send the midpoint to the larger key, moving every range boundary."""
    r = coverage_report([4, 2, 1], range(1, 7), [])
    assert r.ranges() == {1: (1, 1), 2: (2, 2), 4: (3, 6)}


def test_entries_keep_phase_and_ratio_per_m() -> None:
    """Ratio is max(key/M, M/key), symmetric, so under- and over-shooting count alike."""
    r = coverage_report([8, 64], [4, 16], [128])
    got = [(e.m, e.phase, e.key, e.ratio) for e in r.entries]
    assert got == [(4, "decode", 8, 2.0), (16, "decode", 8, 2.0), (128, "prefill", 64, 2.0)]
    assert r.warnings == []  # exactly at the 2x limit


def test_warning_kinds_split_at_the_grid_edges() -> None:
    """Below, inside and above the grid need different fixes, so the kind must be right."""
    # 136 ties between 16 and 256 (120 away each) and goes to 16 at 8.5x; 137 goes to 256.
    r = coverage_report([16, 256], [1, 17, 136, 137], [2000])
    assert [(w.kind, w.m, w.key) for w in r.warnings] == [
        ("far_below_grid", 1, 16),
        ("sparse_grid", 136, 16),
        ("far_above_grid", 2000, 256),
    ]
    assert "below the smallest tuned key 16" in r.warnings[0].message
    assert "between tuned keys" in r.warnings[1].message
    assert "above the largest tuned key 256" in r.warnings[2].message
    assert "(7.8x away, limit 2x)" in r.warnings[2].message


def test_tie_warning_once_per_m_even_in_both_phases() -> None:
    """M reached by decode and prefill is one lookup; one warning avoids doubled noise."""
    r = coverage_report({4: T32, 2: T16}, [3], [3])
    assert [(w.kind, w.m, w.key) for w in r.warnings] == [("tie", 3, 4)]
    assert "keys 2 and 4" in r.warnings[0].message


def test_keys_given_as_an_iterator_are_read_once_correctly() -> None:
    """A generator of keys must give the same report as a list (it is consumed once)."""
    from_gen = coverage_report((k for k in [1, 64]), [1, 40], [])
    from_list = coverage_report([1, 64], [1, 40], [])
    assert [(e.m, e.key) for e in from_gen.entries] == [(e.m, e.key) for e in from_list.entries]
    assert from_gen.keys == [1, 64]


def test_capture_size_padding_picks_the_next_size_and_feeds_the_lookup() -> None:
    """CUDA-graph padding changes M before the lookup: batch 9 runs as M=16."""
    sizes = [1, 2, 4, 8, 16, 24, 32]
    assert [pad_to_capture_size(b, sizes) for b in (1, 8, 9, 17, 25, 33)] == [
        1, 8, 16, 24, 32, 33,
    ]  # fmt: skip
    assert pad_to_capture_size(5, [16, 8, 4]) == 8  # unsorted sizes: still the next larger
    r = coverage_report([8, 16], [9], [9], capture_sizes=sizes)
    assert [(e.m, e.phase, e.key) for e in r.entries] == [(9, "prefill", 8), (16, "decode", 16)]


def test_bad_max_ratio_names_the_value() -> None:
    """The message must carry the bad value and the usual setting."""
    with pytest.raises(UsageError) as e:
        coverage_report([1], [1], [], max_ratio=0.99)
    assert e.value.value == 0.99
    assert "2.0" in e.value.fix


def test_empty_keys_error_names_the_fix() -> None:
    """An empty tuned file means vLLM's default, which nearest_key cannot stand in for."""
    with pytest.raises(UsageError) as e:
        nearest_key(iter([]), 5)
    assert e.value.value == []
    assert "default config" in e.value.problem and "non-empty" in e.value.fix


# -- coverage: diffs, including the default-config side ------------------------------------------
def test_diff_from_tuned_to_default_changes_every_m() -> None:
    """Deleting the file means vLLM computes a default for every M: all of them change."""
    a = {1: T16, 64: T64}
    d = diff_coverage(a, None, [1, 2, 64, 500], label_a="base", label_b="head")
    assert [(c.m, c.key_a, c.tile_a, c.key_b, c.tile_b) for c in d.changes] == [
        (1, 1, T16, None, None),
        (2, 1, T16, None, None),
        (64, 64, T64, None, None),
        (500, 64, T64, None, None),
    ]
    assert d.lines() == [
        "base -> head: 4 of 4 M values change tiling",
        "  M=1..2: key 1 (16x64x128 g1 w4 s4) -> default config",
        "  M=64..500: key 64 (64x128x64 g1 w4 s3) -> default config",
    ]


def test_diff_empty_config_is_the_default_side() -> None:
    """An empty dict and None both mean 'no tuned file', so they never differ."""
    assert diff_coverage({}, None, [1, 8]).changes == []
    assert diff_coverage(None, {}, [1, 8]).changes == []
    d = diff_coverage({}, {8: T16}, [1, 8])
    assert [(c.key_a, c.key_b) for c in d.changes] == [(None, 8), (None, 8)]


def test_diff_follows_the_nearest_key_beyond_the_grid() -> None:
    """Adding a key 4096 re-routes every larger M too: the diff must show all of them."""
    a = {1: T16, 1024: T64}
    b = {1: T16, 1024: T64, 4096: T128}
    d = diff_coverage(a, b, [1024, 2560, 2561, 4096, 100000])
    assert d.changed_m == [2561, 4096, 100000]  # 2560 ties and stays on 1024 (listed first)
    assert {(c.key_a, c.key_b) for c in d.changes} == {(1024, 4096)}


def test_diff_same_tiling_through_a_new_key_is_not_a_change() -> None:
    """Only what the kernel runs matters, not which key delivered it."""
    a = {1: T16, 256: T64}
    b = {1: T16, 256: T64, 512: T64}  # 512 takes over 385+ from 256 with the same tiling
    assert diff_coverage(a, b, range(1, 1000)).changes == []
    c = {1: T16, 256: T64, 512: T128}
    assert diff_coverage(a, c, range(1, 1000)).changed_m == list(range(385, 1000))


def test_diff_bad_m_names_the_value() -> None:
    """Zero or bool M values are caller bugs and must say which value."""
    for bad in (0, -4, True):
        with pytest.raises(UsageError) as e:
            diff_coverage(None, {1: T16}, [1, bad])
        assert e.value.value is bad and e.value.what == "M value"


# -- interleave ----------------------------------------------------------------------------------
@pytest.mark.parametrize("pairs", [1, 2, 3, 4, 7, 10])
def test_every_pair_is_adjacent_and_has_each_side_once(pairs: int) -> None:
    """Pair k occupies positions 2k and 2k+1 and holds run k of both sides."""
    order = schedule(pairs, ("x", "y"))
    assert len(order) == 2 * pairs
    for k in range(pairs):
        (s1, k1), (s2, k2) = order[2 * k], order[2 * k + 1]
        assert {s1, s2} == {"x", "y"} and k1 == k2 == k
        assert s1 == ("x" if k % 2 == 0 else "y")


@pytest.mark.parametrize("pairs", [2, 3, 5, 8])
def test_any_two_consecutive_pairs_have_the_same_mean_position(pairs: int) -> None:
    """A linear drift adds the mean position times the slope: equal means cancel it."""
    order = schedule(pairs)
    for k in range(pairs - 1):
        window = range(2 * k, 2 * k + 4)
        pos = {s: [i for i in window if order[i][0] == s] for s in ("base", "head")}
        assert len(pos["base"]) == len(pos["head"]) == 2
        assert sum(pos["base"]) == sum(pos["head"]), (k, pos)


@pytest.mark.parametrize("pairs", [2, 4, 6])
def test_linear_drift_cancels_in_the_side_means(pairs: int) -> None:
    """Two identical servers under a steady drift must show no A/B difference."""
    clock = iter(range(1000))

    def measure(side: str, k: int) -> float:
        return 100.0 + 0.5 * next(clock)  # same server, drifting by 0.5 per run

    out = run_interleaved(measure, pairs)
    base, head = out.of("base"), out.of("head")
    assert sum(base) / len(base) == sum(head) / len(head)
    sequential = [100.0 + 0.5 * i for i in range(2 * pairs)]  # all base, then all head
    assert sum(sequential[:pairs]) != sum(sequential[pairs:])  # what interleaving avoids


def test_odd_pair_count_leaves_one_pair_unbalanced() -> None:
    """With an odd count the last pair runs base first, so head trails by one position."""
    order = schedule(3)
    pos = {s: sum(i for i, (side, _) in enumerate(order) if side == s) for s in ("base", "head")}
    assert pos["head"] - pos["base"] == 1


@pytest.mark.parametrize("pairs", [1, 3, 6])
def test_run_indices_appear_once_per_side_in_order(pairs: int) -> None:
    """Run k sends seed offset k on both sides, so each index must occur once a side."""
    order = schedule(pairs)
    for side in ("base", "head"):
        assert [k for s, k in order if s == side] == list(range(pairs))


def test_run_interleaved_files_each_result_under_its_side_and_index() -> None:
    """of(side)[k] must be run k of that side whatever order it was measured in."""
    out = run_interleaved(lambda side, k: (side, k), 3, ("a", "b"))
    assert out.of("a") == [("a", 0), ("a", 1), ("a", 2)]
    assert out.of("b") == [("b", 0), ("b", 1), ("b", 2)]
    assert out.order == schedule(3, ("a", "b"))
    assert out.sides == ("a", "b")
    assert out.of("nope") == []


def test_run_interleaved_calls_nothing_on_bad_pairs() -> None:
    """A bad pair count must fail before any server is measured."""
    calls: list[tuple[str, int]] = []
    with pytest.raises(UsageError):
        run_interleaved(lambda s, k: calls.append((s, k)), 0)
    assert calls == []


def test_run_interleaved_stops_right_after_the_failing_run() -> None:
    """Runs after a failure would be measured against a dead server."""
    calls: list[tuple[str, int]] = []

    def measure(side: str, k: int) -> None:
        calls.append((side, k))
        if (side, k) == ("base", 1):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_interleaved(measure, 4)
    assert calls == [("base", 0), ("head", 0), ("head", 1), ("base", 1)]


@pytest.mark.parametrize("bad", [0, -1, -100, True, False, 2.0, 3.5, "3", None])
def test_schedule_misuse_names_the_value_and_the_fix(bad: Any) -> None:
    """Every bad pair count (bool included: True is not 1 pair) names itself and the option."""
    with pytest.raises(UsageError) as e:
        schedule(bad)
    assert e.value.value is bad
    assert e.value.what == "pairs"
    assert "--moeperf-ab-pairs" in e.value.fix
    assert f"pairs = {bad!r}" in str(e.value)


def test_sweep_alternates_which_side_goes_first_per_level() -> None:
    """Level i runs sides[0] first when i is even, so neither side always runs warm."""
    levels = [64, 1, 16, 4, 4]  # kept in the given order, duplicates included
    got = sweep_order(levels, ("a", "b"))
    assert len(got) == 2 * len(levels)
    for i, c in enumerate(levels):
        assert got[2 * i][0] == got[2 * i + 1][0] == c
        first = "a" if i % 2 == 0 else "b"
        assert [got[2 * i][1], got[2 * i + 1][1]] == [first, "b" if first == "a" else "a"]
    assert sweep_order((8,)) == [(8, "base"), (8, "head")]


@pytest.mark.parametrize(
    "levels",
    [[], (), [0], [4, -1], [1, True], [2.5], ["4"], [1, None], [False]],
)
def test_sweep_misuse_names_the_levels_and_the_fix(levels: Any) -> None:
    """Empty or non-positive levels must name the whole list and show a valid option value."""
    with pytest.raises(UsageError) as e:
        sweep_order(levels)
    assert e.value.value == list(levels)
    assert e.value.source == "--moeperf-sweep"
    assert "--moeperf-sweep 1,4,16,64" in e.value.fix
    assert "non-empty" in e.value.problem
