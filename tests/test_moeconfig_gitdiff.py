"""Changed-config discovery against real temporary git repositories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from git_helpers import commit, git, put

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.folder import IN_TREE, lay_out_config_folder
from pytest_moeperf.moeconfig.gitdiff import changed_between_folders, changed_config_files

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")

A = "E=128,N=768,device_name=NVIDIA_H200.json"
B = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
C = "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"
FLY = "E=384,N=256,device_name=AMD_Instinct_MI350X,dtype=int4_w4a16,backend=flydsl.json"
TILE = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def cfg(bm: int = 16) -> str:
    return json.dumps({"1": {**TILE, "BLOCK_SIZE_M": bm}}, indent=4) + "\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    put(r, "README.md", "x\n")
    put(r, f"configs/{A}", cfg(16))
    put(r, f"configs/{C}", cfg(32))
    put(r, "deep/nested/dir/" + B, cfg(64))
    commit(r, "base")
    git(r, "tag", "base")
    return r


def test_modified_added_deleted(repo: Path) -> None:
    put(repo, f"configs/{A}", cfg(64))  # modified
    (repo / "configs" / C).unlink()  # deleted
    put(repo, f"tuned/{B}", cfg(128))  # added in another folder
    put(repo, "src/app.json", "{}")  # not a config name
    head = commit(repo, "head")
    base = git(repo, "rev-parse", "base")
    got = changed_config_files(repo, "base..HEAD")
    assert [(c.path, c.status) for c in got] == [
        (f"configs/{A}", "modified"),
        (f"configs/{C}", "deleted"),
        (f"tuned/{B}", "added"),
    ]
    mod, dele, add = got
    assert (mod.base_rev, mod.head_rev) == (base, head)
    assert mod.base_config() is not None and mod.base_config()[1].block_size_m == 16  # type: ignore[index]
    assert mod.head_config()[1].block_size_m == 64  # type: ignore[index]
    assert mod.base_label == f"{base}:configs/{A}"
    assert dele.head_text is None and dele.head_label == IN_TREE and dele.head_config() is None
    assert dele.base_text == cfg(32)
    assert add.base_text is None and add.base_label == IN_TREE and add.base_config() is None
    assert add.name.block_shape == (128, 128)
    assert add.file_name == B


def test_nested_file_found(repo: Path) -> None:
    put(repo, "deep/nested/dir/" + B, cfg(8))
    commit(repo, "tweak")
    (c,) = changed_config_files(repo, "base..HEAD")
    assert c.path == "deep/nested/dir/" + B
    assert c.status == "modified"


def test_rename_is_delete_plus_add(repo: Path) -> None:
    git(repo, "mv", f"configs/{A}", f"configs/{A.replace('N=768', 'N=384')}")
    commit(repo, "rename")
    got = changed_config_files(repo, "base..HEAD")
    assert [(c.name.N, c.status) for c in got] == [(384, "added"), (768, "deleted")]


def test_three_dot_uses_merge_base(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "feature")
    put(repo, f"configs/{A}", cfg(64))
    commit(repo, "feature change")
    git(repo, "checkout", "-q", "main")
    put(repo, f"configs/{C}", cfg(128))  # change on main after the branch point
    commit(repo, "main change")
    three = changed_config_files(repo, "main...feature")
    assert [c.path for c in three] == [f"configs/{A}"]
    two = changed_config_files(repo, "main..feature")
    assert [c.path for c in two] == [f"configs/{A}", f"configs/{C}"]


def test_single_rev_compares_with_working_tree(repo: Path) -> None:
    put(repo, f"configs/{A}", cfg(128))  # uncommitted
    (c,) = changed_config_files(repo, "HEAD")
    assert c.head_rev == "working tree"
    assert c.head_text == cfg(128)
    assert c.head_label == str(repo.resolve() / "configs" / A)


def test_open_ended_range_defaults_to_head(repo: Path) -> None:
    put(repo, f"configs/{A}", cfg(64))
    commit(repo, "head")
    assert [c.path for c in changed_config_files(repo, "base..")] == [f"configs/{A}"]


def test_no_changes(repo: Path) -> None:
    assert changed_config_files(repo, "HEAD..HEAD") == []


def test_flydsl_and_misnamed_files_skipped(repo: Path) -> None:
    put(repo, f"configs/{FLY}", "{}")
    put(repo, "configs/E=128,N=768,device_name=NVIDIA_H200,block_shape=[128, 128].json", "{}")
    commit(repo, "others")
    assert changed_config_files(repo, "base..HEAD") == []


def test_subdirectory_of_repo_works(repo: Path) -> None:
    put(repo, f"configs/{A}", cfg(64))
    commit(repo, "head")
    (c,) = changed_config_files(repo / "configs", "base..HEAD")
    assert c.path == f"configs/{A}"


def test_invalid_head_content_names_the_blob(repo: Path) -> None:
    put(repo, f"configs/{A}", '{"1": {"BLOCK_SIZE_M": 16,}}')
    head = commit(repo, "broken")
    (c,) = changed_config_files(repo, "base..HEAD")
    with pytest.raises(UsageError) as e:
        c.head_config()
    assert e.value.source == f"{head}:configs/{A}"
    assert e.value.what == "JSON"


def test_bad_range_names_range_and_fix(repo: Path) -> None:
    with pytest.raises(UsageError) as e:
        changed_config_files(repo, "origin/main..HEAD")
    assert e.value.value == "origin/main..HEAD"
    assert "'origin/main'" in e.value.problem
    assert "fetch-depth" in e.value.fix


def test_bad_single_rev(repo: Path) -> None:
    with pytest.raises(UsageError) as e:
        changed_config_files(repo, "nosuchbranch")
    assert e.value.value == "nosuchbranch"


def test_bad_three_dot(repo: Path) -> None:
    with pytest.raises(UsageError, match="'nope'"):
        changed_config_files(repo, "nope...HEAD")


def test_option_like_range_rejected(repo: Path) -> None:
    with pytest.raises(UsageError, match="not a revision range"):
        changed_config_files(repo, "--output=/tmp/x")


def test_empty_range_rejected(repo: Path) -> None:
    with pytest.raises(UsageError):
        changed_config_files(repo, "")


def test_unrelated_histories_have_no_merge_base(repo: Path) -> None:
    git(repo, "checkout", "-q", "--orphan", "other")
    git(repo, "rm", "-r", "-q", "-f", ".")
    put(repo, f"configs/{A}", cfg(8))
    commit(repo, "orphan")
    with pytest.raises(UsageError, match="merge base"):
        changed_config_files(repo, "main...other")


def test_not_a_repo(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        changed_config_files(tmp_path, "HEAD~1..HEAD")
    assert "not inside a git work tree" in e.value.problem


def test_between_folders(tmp_path: Path) -> None:
    a = lay_out_config_folder(tmp_path / "a", {A: json.loads(cfg(16)), C: json.loads(cfg(32))})
    b = lay_out_config_folder(tmp_path / "b", {A: json.loads(cfg(64)), B: json.loads(cfg(16))})
    got = changed_between_folders(a, b)
    assert [(c.file_name, c.status) for c in got] == [
        (B, "added"),
        (A, "modified"),
        (C, "deleted"),
    ]
    assert got[1].base_config()[1].block_size_m == 16  # type: ignore[index]
    assert got[1].head_label == f"file {b / A}"
    assert got[0].base_label == IN_TREE


def test_between_folders_identical(tmp_path: Path) -> None:
    a = lay_out_config_folder(tmp_path / "a", {A: json.loads(cfg(16))})
    b = lay_out_config_folder(tmp_path / "b", {A: json.loads(cfg(16))})
    assert changed_between_folders(a, b) == []


def test_between_in_tree_and_tuned(tmp_path: Path) -> None:
    a = lay_out_config_folder(tmp_path / "a", {})
    b = lay_out_config_folder(tmp_path / "b", {A: json.loads(cfg(16))})
    (c,) = changed_between_folders(a, b)
    assert c.status == "added"


def test_between_folders_missing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a directory"):
        changed_between_folders(tmp_path, tmp_path / "nope")
