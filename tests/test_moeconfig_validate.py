"""Config file checks: every misuse is one UsageError naming file, key, value and fix."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.folder import in_tree_config_dir
from pytest_moeperf.moeconfig.naming import parse
from pytest_moeperf.moeconfig.validate import (
    TileConfig,
    find_problems,
    load_config,
    parse_config_text,
    validate_config,
)

NAME = "E=128,N=768,device_name=NVIDIA_H200.json"
TILE = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
GOOD: dict[str, Any] = {"1": TILE, "64": {**TILE, "BLOCK_SIZE_M": 64, "GROUP_SIZE_M": 16}}
SRC = f"file {NAME}"

IN_TREE = in_tree_config_dir()


def with_field(key: str, field: str, value: object) -> dict[str, Any]:
    d = copy.deepcopy(GOOD)
    d[key][field] = value
    return d


def err(data: object) -> UsageError:
    with pytest.raises(UsageError) as e:
        validate_config(data, SRC)
    return e.value


def test_valid_config_parses_in_file_order() -> None:
    cfg = validate_config({"64": GOOD["64"], "1": TILE}, SRC)
    assert list(cfg) == [64, 1]  # order kept: vLLM breaks ties by it
    assert cfg[1] == TileConfig(16, 64, 128, 1, 4, 3)
    assert cfg[64].block_size_m == 64


def test_tile_round_trip_to_vllm_dict() -> None:
    extra = {**TILE, "kpack": 2, "waves_per_eu": 0, "SPLIT_K": 1}
    assert validate_config({"8": extra}, SRC)[8].to_dict() == extra


def test_tile_short() -> None:
    assert TileConfig(64, 128, 64, 1, 4, 3).short() == "64x128x64 g1 w4 s3"
    assert "kpack=2" in TileConfig(64, 128, 64, 1, 4, 3, (("kpack", 2),)).short()


def test_triton_version_is_allowed_metadata() -> None:
    cfg = validate_config({"triton_version": "3.4.0", **GOOD}, SRC)
    assert set(cfg) == {1, 64}


def test_triton_version_must_be_string() -> None:
    e = err({"triton_version": 3.4, **GOOD})
    assert e.what == "key 'triton_version'"


def test_non_integer_key() -> None:
    e = err({"abc": TILE})
    assert str(e).startswith(f"file {NAME}: key 'abc'")
    assert "not an integer batch size M" in e.problem
    assert '"64"' in e.fix


def test_float_key() -> None:
    assert "not an integer" in err({"1.5": TILE}).problem


def test_zero_key() -> None:
    assert err({"0": TILE}).what == "key '0'"


def test_negative_key() -> None:
    assert err({"-4": TILE}).what == "key '-4'"


def test_duplicate_m_after_normalisation() -> None:
    e = err({"16": TILE, "016": TILE})
    assert "M=16 appears twice" in e.problem


def test_duplicate_key_in_text() -> None:
    text = f'{{"1": {json.dumps(TILE)}, "1": {json.dumps(TILE)}}}'
    with pytest.raises(UsageError) as e:
        parse_config_text(text, SRC)
    assert e.value.what == "key '1'"
    assert "twice" in e.value.problem


def test_top_level_not_object() -> None:
    e = err([TILE])
    assert e.what == "top level"
    assert e.value == "list"


def test_empty_object_falls_back_silently_in_vllm() -> None:
    e = err({})
    assert "default config" in e.problem


def test_only_metadata_is_empty() -> None:
    assert "no M entries" in err({"triton_version": "3.4.0"}).problem


def test_entry_not_object() -> None:
    e = err({"1": [16, 64, 128]})
    assert e.what == "key '1'"
    assert "JSON object" in e.problem


@pytest.mark.parametrize("field", list(TILE))
def test_missing_required_field(field: str) -> None:
    d = copy.deepcopy(GOOD)
    del d["64"][field]
    e = err(d)
    assert e.what == "key '64'"
    assert repr(field) in e.problem


def test_unknown_field_typo() -> None:
    e = err(with_field("1", "num_warp", 4))
    assert e.what == "key '1' field 'num_warp'"
    assert "num_warps" in e.fix


@pytest.mark.parametrize("value", ["16", 16.0, True, None])
def test_non_integer_value(value: object) -> None:
    e = err(with_field("1", "BLOCK_SIZE_N", value))
    assert e.what == "key '1' field 'BLOCK_SIZE_N'"
    assert e.value == value
    assert "integer" in e.problem


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("BLOCK_SIZE_M", 48),
        ("BLOCK_SIZE_M", 4),
        ("BLOCK_SIZE_M", 512),
        ("BLOCK_SIZE_N", 8),
        ("BLOCK_SIZE_N", 96),
        ("BLOCK_SIZE_K", 512),
        ("BLOCK_SIZE_K", 0),
        ("GROUP_SIZE_M", 0),
        ("num_warps", 3),
        ("num_warps", 32),
        ("num_stages", 0),
        ("num_stages", 9),
        ("SPLIT_K", 0),
        ("kpack", 3),
        ("matrix_instr_nonkdim", 8),
        ("waves_per_eu", -1),
        ("num_ctas", 0),
    ],
)
def test_insane_value(field: str, value: int) -> None:
    e = err(with_field("64", field, value))
    assert e.what == f"key '64' field {field!r}"
    assert e.value == value
    assert f"{field!r} = {value!r}" in str(e)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("BLOCK_SIZE_M", 8),
        ("BLOCK_SIZE_M", 256),
        ("BLOCK_SIZE_N", 16),
        ("num_warps", 16),
        ("num_stages", 8),
        ("GROUP_SIZE_M", 128),
        ("num_warps", 1),
        ("num_stages", 1),
    ],
)
def test_edge_values_accepted(field: str, value: int) -> None:
    validate_config(with_field("64", field, value), SRC)


def test_grf_mode_string() -> None:
    validate_config(with_field("1", "grf_mode", "256"), SRC)
    assert err(with_field("1", "grf_mode", 256)).what == "key '1' field 'grf_mode'"


def test_find_problems_lists_all() -> None:
    d = {"abc": TILE, "1": {**TILE, "num_warps": 3}, "2": {**TILE, "num_stages": 0}}
    problems = find_problems(d, SRC)
    assert [p.what for p in problems] == [
        "key 'abc'",
        "key '1' field 'num_warps'",
        "key '2' field 'num_stages'",
    ]
    assert find_problems(GOOD, SRC) == []


def test_json_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / NAME
    p.write_text('{\n  "1": {"BLOCK_SIZE_M": 16,}\n}\n')
    with pytest.raises(UsageError) as e:
        load_config(p)
    assert e.value.value == "line 2 column 28"  # the "}" after the comma
    assert str(p) in e.value.source


def test_trailing_comma_at_top_level(tmp_path: Path) -> None:
    p = tmp_path / NAME
    p.write_text('{"1": ' + json.dumps(TILE) + ",\n}")
    with pytest.raises(UsageError) as e:
        load_config(p)
    assert str(e.value.value).startswith("line 2 column 1")


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / NAME)


def test_load_config_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="directory"):
        load_config(tmp_path)


def test_load_config_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / NAME
    p.write_bytes(b'{"1": "\xff"}')
    with pytest.raises(UsageError, match="UTF-8"):
        load_config(p)


def test_load_config_good_file(tmp_path: Path) -> None:
    p = tmp_path / NAME
    p.write_text(json.dumps(GOOD, indent=4))
    assert load_config(p) == validate_config(GOOD, SRC)


def test_error_names_the_file_path(tmp_path: Path) -> None:
    p = tmp_path / NAME
    p.write_text(json.dumps({"1": {**TILE, "BLOCK_SIZE_K": 100}}))
    with pytest.raises(UsageError) as e:
        load_config(p)
    msg = str(e.value)
    assert NAME in msg and "'BLOCK_SIZE_K' = 100" in msg and "Fix:" in msg


@pytest.mark.skipif(IN_TREE is None, reason="vLLM not installed")
def test_every_in_tree_triton_config_is_valid() -> None:
    assert IN_TREE is not None
    checked = 0
    for p in sorted(IN_TREE.glob("*.json")):
        if parse(p.name).backend is not None:
            continue  # FlyDSL files: another schema, another loader (not a tuned-folder file)
        cfg = load_config(p)
        assert cfg, p.name
        checked += 1
    assert checked > 300


def test_non_ascii_digits_key_rejected() -> None:
    # Python's int() (and so vLLM) accepts Arabic-Indic digits; nobody means that on purpose.
    assert "not an integer" in err({"\u0661\u0666": TILE}).problem


def test_key_with_spaces_rejected() -> None:
    assert err({" 16": TILE}).what == "key ' 16'"


def test_tile_configs_compare_by_value() -> None:
    a = validate_config({"1": {**TILE, "kpack": 2, "waves_per_eu": 0}}, SRC)[1]
    b = validate_config({"1": {"waves_per_eu": 0, **TILE, "kpack": 2}}, SRC)[1]
    assert a == b and hash(a) == hash(b)  # field order in the file does not matter
    assert a != validate_config({"1": TILE}, SRC)[1]
    assert a.extra == (("kpack", 2), ("waves_per_eu", 0))


def test_several_problems_in_one_entry() -> None:
    problems = find_problems({"8": {"BLOCK_SIZE_M": 3, "num_warps": 4}}, SRC)
    whats = [p.what for p in problems]
    assert whats.count("key '8'") == 4  # BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_stages
    assert "key '8' field 'BLOCK_SIZE_M'" in whats


def test_find_problems_non_object_top_level() -> None:
    (p,) = find_problems("just a string", SRC)
    assert p.value == "str"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kpack", 1),
        ("kpack", 2),
        ("matrix_instr_nonkdim", 16),
        ("matrix_instr_nonkdim", 32),
        ("waves_per_eu", 0),
        ("waves_per_eu", 4),
        ("SPLIT_K", 1),
        ("num_ctas", 1),
    ],
)
def test_optional_fields_accepted(field: str, value: int) -> None:
    assert dict(validate_config(with_field("1", field, value), SRC)[1].extra) == {field: value}


def test_optional_field_wrong_type() -> None:
    e = err(with_field("1", "kpack", "2"))
    assert e.what == "key '1' field 'kpack'"
    assert "integer" in e.problem


def test_parse_config_text_uses_source() -> None:
    with pytest.raises(UsageError) as e:
        parse_config_text("[", "abc123:configs/x.json")
    assert e.value.source == "abc123:configs/x.json"
    assert e.value.value == "line 1 column 2"


def test_nan_value_rejected() -> None:
    with pytest.raises(UsageError) as e:
        parse_config_text('{"1": {"BLOCK_SIZE_M": NaN}}', SRC)
    assert e.value.what in ("key '1'", "key '1' field 'BLOCK_SIZE_M'")
