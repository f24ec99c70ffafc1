"""Variant folders for VLLM_TUNED_CONFIG_FOLDER, their hash, and vLLM's lookup order."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.folder import (
    ENV_VAR,
    IN_TREE,
    ConfigVariant,
    config_hash,
    env_for,
    in_tree_config_dir,
    in_tree_variant,
    lay_out_config_folder,
    resolve_config,
)
from pytest_moeperf.moeconfig.validate import load_config, validate_config

NAME = "E=128,N=768,device_name=NVIDIA_H200.json"
NAME2 = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
TILE = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
CFG: dict[str, Any] = {"1": TILE, "64": {**TILE, "BLOCK_SIZE_M": 64}}


def write(p: Path, data: object) -> Path:
    p.write_text(json.dumps(data, indent=2))
    return p


def test_lay_out_writes_dicts(tmp_path: Path) -> None:
    dest = lay_out_config_folder(tmp_path / "v", {NAME: CFG})
    assert dest == tmp_path / "v"
    assert [p.name for p in dest.iterdir()] == [NAME]
    assert json.loads((dest / NAME).read_text()) == CFG


def test_lay_out_copies_paths_byte_exact(tmp_path: Path) -> None:
    src = tmp_path / "src.json"
    src.write_text('{"1":   ' + json.dumps(TILE) + "}")
    dest = lay_out_config_folder(tmp_path / "v", {NAME: src})
    assert (dest / NAME).read_bytes() == src.read_bytes()


def test_lay_out_accepts_loaded_tile_configs(tmp_path: Path) -> None:
    loaded = validate_config(CFG, "x")
    del loaded[64]  # "remove one key" variant
    dest = lay_out_config_folder(tmp_path / "v", {NAME: loaded})
    assert set(load_config(dest / NAME)) == {1}


def test_lay_out_keeps_key_order(tmp_path: Path) -> None:
    dest = lay_out_config_folder(tmp_path / "v", {NAME: {"64": CFG["64"], "1": TILE}})
    assert list(load_config(dest / NAME)) == [64, 1]


def test_lay_out_empty_is_in_tree(tmp_path: Path) -> None:
    dest = lay_out_config_folder(tmp_path / "v", {})
    assert dest.is_dir() and not any(dest.iterdir())
    assert config_hash(dest) == IN_TREE


def test_lay_out_into_existing_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    lay_out_config_folder(tmp_path / "v", {NAME: CFG})


def test_lay_out_rejects_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / NAME2).write_text("{}")
    with pytest.raises(UsageError) as e:
        lay_out_config_folder(tmp_path / "v", {NAME: CFG})
    assert e.value.value == [NAME2]
    assert "fresh" in e.value.fix


def test_lay_out_rejects_file_as_dest(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        lay_out_config_folder(tmp_path / "f", {NAME: CFG})


def test_lay_out_rejects_bad_name_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        lay_out_config_folder(tmp_path / "v", {NAME: CFG, "qwen3.json": CFG})
    assert e.value.value == "qwen3.json"
    assert not (tmp_path / "v").exists()


def test_lay_out_rejects_invalid_dict(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        lay_out_config_folder(tmp_path / "v", {NAME: {"1": {**TILE, "num_warps": 3}}})
    assert NAME in e.value.source
    assert e.value.what == "key '1' field 'num_warps'"


def test_lay_out_rejects_invalid_file(tmp_path: Path) -> None:
    src = write(tmp_path / "src.json", {"x": TILE})
    with pytest.raises(UsageError) as e:
        lay_out_config_folder(tmp_path / "v", {NAME: src})
    assert str(src) in e.value.source


def test_lay_out_rejects_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        lay_out_config_folder(tmp_path / "v", {NAME: tmp_path / "nope.json"})


def test_lay_out_rejects_other_source_types(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"pathlib\.Path"):
        lay_out_config_folder(tmp_path / "v", {NAME: str(tmp_path / "x.json")})  # type: ignore[dict-item]


def test_lay_out_rejects_flydsl_backend(tmp_path: Path) -> None:
    name = "E=384,N=256,device_name=AMD_Instinct_MI350X,dtype=int4_w4a16,backend=flydsl.json"
    with pytest.raises(UsageError) as e:
        lay_out_config_folder(tmp_path / "v", {name: CFG})
    assert ENV_VAR in e.value.problem


def test_hash_is_stable_and_content_sensitive(tmp_path: Path) -> None:
    a = lay_out_config_folder(tmp_path / "a", {NAME: CFG, NAME2: CFG})
    b = lay_out_config_folder(tmp_path / "b", {NAME2: CFG, NAME: CFG})  # other insertion order
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 64
    c = lay_out_config_folder(tmp_path / "c", {NAME: CFG, NAME2: {"1": TILE}})
    assert config_hash(c) != config_hash(a)


def test_hash_depends_on_names(tmp_path: Path) -> None:
    a = lay_out_config_folder(tmp_path / "a", {NAME: CFG})
    b = lay_out_config_folder(tmp_path / "b", {NAME2: CFG})
    assert config_hash(a) != config_hash(b)


def test_hash_ignores_non_json_and_subfolders(tmp_path: Path) -> None:
    a = lay_out_config_folder(tmp_path / "a", {NAME: CFG})
    h = config_hash(a)
    (a / "README.md").write_text("notes")
    (a / "sub").mkdir()
    (a / "sub" / NAME2).write_text("{}")
    assert config_hash(a) == h


def test_hash_no_boundary_ambiguity(tmp_path: Path) -> None:
    # Moving bytes from one file's content into the next name must change the hash.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.json").write_text("ab")
    (tmp_path / "a" / "y.json").write_text("c")
    (tmp_path / "b" / "x.json").write_text("a")
    (tmp_path / "b" / "y.json").write_text("bc")
    assert config_hash(tmp_path / "a") != config_hash(tmp_path / "b")


def test_hash_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        config_hash(tmp_path / "nope")


def test_hash_of_a_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a directory"):
        config_hash(write(tmp_path / NAME, CFG))


def test_variant_in_tree() -> None:
    v = in_tree_variant()
    assert (v.name, v.in_tree, dict(v.files)) == (IN_TREE, True, {})
    assert ConfigVariant(IN_TREE).in_tree


def test_variant_lay_out_and_from_folder(tmp_path: Path) -> None:
    v = ConfigVariant("tuned", {NAME: CFG})
    dest = v.lay_out(tmp_path / "v")
    back = ConfigVariant.from_folder("tuned", dest)
    assert not back.in_tree
    assert dict(back.files) == {NAME: dest / NAME}
    assert config_hash(back.lay_out(tmp_path / "w")) == config_hash(dest)


def test_variant_from_empty_folder_is_in_tree(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    assert ConfigVariant.from_folder("base", tmp_path / "e").in_tree


def test_in_tree_variant_with_files_rejected() -> None:
    with pytest.raises(UsageError, match="cannot carry"):
        ConfigVariant(IN_TREE, {NAME: CFG})


def test_in_tree_flag_with_files_rejected() -> None:
    with pytest.raises(UsageError, match="cannot carry"):
        ConfigVariant("x", {NAME: CFG}, in_tree=True)


def test_tuned_variant_without_files_rejected() -> None:
    with pytest.raises(UsageError) as e:
        ConfigVariant("tuned")
    assert IN_TREE in e.value.fix


def test_variant_empty_name_rejected() -> None:
    with pytest.raises(UsageError, match="empty"):
        ConfigVariant(" ", {NAME: CFG})


def test_env_for(tmp_path: Path) -> None:
    assert env_for(tmp_path) == {"VLLM_TUNED_CONFIG_FOLDER": str(tmp_path)}


def test_resolve_tuned_first(tmp_path: Path) -> None:
    tuned = lay_out_config_folder(tmp_path / "t", {NAME: CFG})
    intree = lay_out_config_folder(tmp_path / "i", {NAME: CFG})
    r = resolve_config(NAME, tuned, intree)
    assert (r.source, r.path) == ("tuned", os.path.join(str(tuned), NAME))
    assert r.log_line == f"Using configuration from {tuned}/{NAME} for MoE layer."


def test_resolve_in_tree_when_tuned_lacks_it(tmp_path: Path) -> None:
    tuned = lay_out_config_folder(tmp_path / "t", {})
    intree = lay_out_config_folder(tmp_path / "i", {NAME: CFG})
    r = resolve_config(NAME, tuned, intree)
    assert r.source == "in-tree"
    assert r.path == f"{intree}/{NAME}"


def test_resolve_default_lists_every_path(tmp_path: Path) -> None:
    r = resolve_config(NAME, tmp_path / "t", tmp_path / "i")
    assert r.source == "default" and r.path is None
    assert r.log_line == (
        "Using default MoE config. Performance might be sub-optimal! Config file not found at "
        f"{tmp_path}/t/{NAME}, {tmp_path}/i/{NAME}"
    )


def test_resolve_without_tuned_folder(tmp_path: Path) -> None:
    r = resolve_config(NAME, None, tmp_path)
    assert r.log_line.endswith(f"not found at {tmp_path}/{NAME}")


def test_resolve_bad_name(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        resolve_config("config.json", tmp_path, None)


@pytest.mark.skipif(in_tree_config_dir() is None, reason="vLLM not installed")
def test_in_tree_dir_holds_the_qwen3_h200_file(tmp_path: Path) -> None:
    d = in_tree_config_dir()
    assert d is not None
    r = resolve_config(NAME, lay_out_config_folder(tmp_path / "e", {}), d)
    assert r.source == "in-tree"
