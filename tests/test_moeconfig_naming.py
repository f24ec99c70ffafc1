"""MoE config file names: vLLM's exact spelling, parsing, and prediction from config.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.folder import in_tree_config_dir
from pytest_moeperf.moeconfig.naming import (
    MoeConfigName,
    expected_config_name,
    is_config_file_name,
    looks_like_config_name,
    normalize_device_name,
    parse,
)

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,  # the dense MLP size: must NOT be used for the experts
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
}

IN_TREE = in_tree_config_dir()
needs_vllm = pytest.mark.skipif(IN_TREE is None, reason="vLLM not installed")


def test_file_name_plain() -> None:
    assert (
        MoeConfigName(128, 768, "NVIDIA_H200").file_name()
        == "E=128,N=768,device_name=NVIDIA_H200.json"
    )


def test_file_name_dtype_and_block_shape() -> None:
    n = MoeConfigName(256, 256, "NVIDIA_H200", "fp8_w8a8", (128, 128))
    assert (
        n.file_name()
        == "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert str(n) == n.file_name()


def test_file_name_block_shape_without_dtype() -> None:
    n = MoeConfigName(256, 1024, "AMD_Instinct_MI325X", None, (128, 128))
    assert (
        n.file_name() == "E=256,N=1024,device_name=AMD_Instinct_MI325X,block_shape=[128,128].json"
    )


def test_file_name_drops_block_shape_with_a_zero_dim() -> None:
    # vLLM: "" if not block_shape or not all(block_shape)
    assert MoeConfigName(8, 7168, "NVIDIA_H100", "int8_w8a16", (0, 128)).file_name() == (
        "E=8,N=7168,device_name=NVIDIA_H100,dtype=int8_w8a16.json"
    )


@pytest.mark.parametrize(
    "name",
    [
        "E=128,N=768,device_name=NVIDIA_H200.json",
        "E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB,dtype=int8_w8a16.json",
        "E=128,N=768,device_name=Radeon_8060S_Graphics,dtype=int4_w4a16.json",
        "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=512,N=160,device_name=NVIDIA_B200,dtype=fp8_w8a8,block_shape=[32,32].json",
        "E=384,N=256,device_name=AMD_Instinct_MI350X,dtype=int4_w4a16,backend=flydsl.json",
    ],
)
def test_parse_round_trips(name: str) -> None:
    assert parse(name).file_name() == name
    assert is_config_file_name(name)


def test_parse_fields() -> None:
    n = parse("E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,64].json")
    assert (n.E, n.N, n.device_name, n.dtype, n.block_shape, n.backend) == (
        256,
        512,
        "NVIDIA_H200",
        "fp8_w8a8",
        (128, 64),
        None,
    )


def test_parse_rejects_garbage_and_names_the_file() -> None:
    with pytest.raises(UsageError) as e:
        parse("moe_config.json")
    assert "moe_config.json" in str(e.value)
    assert "E=128,N=768,device_name=NVIDIA_H200.json" in e.value.fix


def test_parse_rejects_spaces_in_block_shape() -> None:
    # vLLM strips the spaces str(list) puts in; a file with them is never found.
    with pytest.raises(UsageError):
        parse("E=8,N=7168,device_name=NVIDIA_H100,dtype=fp8_w8a8,block_shape=[128, 128].json")


def test_parse_rejects_leading_zeros_with_the_spelling_vllm_uses() -> None:
    with pytest.raises(UsageError) as e:
        parse("E=0128,N=768,device_name=NVIDIA_H200.json")
    assert "E=128,N=768,device_name=NVIDIA_H200.json" in e.value.fix


def test_parse_rejects_zero_experts() -> None:
    with pytest.raises(UsageError, match="positive"):
        parse("E=0,N=768,device_name=NVIDIA_H200.json")


def test_parse_rejects_zero_block_dim() -> None:
    with pytest.raises(UsageError):
        parse("E=8,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[0,128].json")


def test_parse_rejects_wrong_extension() -> None:
    with pytest.raises(UsageError):
        parse("E=128,N=768,device_name=NVIDIA_H200.yaml")


def test_parse_uses_given_source() -> None:
    with pytest.raises(UsageError) as e:
        parse("bogus.json", source="marker moe_config(files=...)")
    assert e.value.source == "marker moe_config(files=...)"


def test_looks_like_vs_is() -> None:
    bad = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8,block_shape=[128, 128].json"
    assert looks_like_config_name(bad)
    assert not is_config_file_name(bad)
    assert not looks_like_config_name("config.json")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("NVIDIA H200", "NVIDIA_H200"),
        ("NVIDIA H200 NVL", "NVIDIA_H200"),  # whole H200 family shares one file name
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
        ("AMD Instinct MI300X", "AMD_Instinct_MI300X"),
        ("NVIDIA  L40S", "NVIDIA_L40S"),  # runs of whitespace collapse
        ("Vendor A/B Card", "Vendor_A_B_Card"),  # '/' too
        ("NVIDIA GH200 480GB", "NVIDIA_GH200_480GB"),  # GH200 is not in the H200 family rule
        ("NVIDIA_H200", "NVIDIA_H200"),  # idempotent
    ],
)
def test_normalize_device_name(raw: str, expected: str) -> None:
    assert normalize_device_name(raw) == expected


def test_qwen3_30b_a3b_tp1_bf16_h200() -> None:
    n = expected_config_name(QWEN3_30B_A3B, tp=1, dtype=None, device_name="NVIDIA H200")
    assert n.file_name() == "E=128,N=768,device_name=NVIDIA_H200.json"


def test_qwen3_tp2_shards_n() -> None:
    n = expected_config_name(QWEN3_30B_A3B, tp=2, dtype="fp8_w8a8", device_name="NVIDIA H200")
    assert n.file_name() == "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"


def test_qwen3_ep_splits_experts_not_n() -> None:
    n = expected_config_name(QWEN3_30B_A3B, tp=4, ep=True, dtype=None, device_name="NVIDIA H200")
    assert (n.E, n.N) == (32, 768)


def test_ep_with_one_gpu_is_plain_tp() -> None:
    n = expected_config_name(QWEN3_30B_A3B, tp=1, ep=True, dtype=None, device_name="NVIDIA H200")
    assert (n.E, n.N) == (128, 768)


def test_dp_flattens_into_moe_tp() -> None:
    n = expected_config_name(QWEN3_30B_A3B, tp=2, dp=2, dtype=None, device_name="NVIDIA H200")
    assert (n.E, n.N) == (128, 192)


def test_ep_uneven_split_rank0_gets_one_more() -> None:
    n = expected_config_name(MIXTRAL_8X7B, tp=3, ep=True, dtype=None, device_name="NVIDIA H100")
    assert n.E == 3  # 8 experts over 3 ranks: 3, 3, 2


def test_ep_redundant_experts_count() -> None:
    n = expected_config_name(
        DEEPSEEK_V3, tp=8, ep=True, num_redundant_experts=32, dtype=None, device_name="NVIDIA H200"
    )
    assert n.E == 36


def test_redundant_experts_without_ep_rejected() -> None:
    with pytest.raises(UsageError, match="num_redundant_experts"):
        expected_config_name(
            DEEPSEEK_V3, tp=8, num_redundant_experts=32, dtype=None, device_name="NVIDIA H200"
        )


def test_mixtral_tp2_h100_matches_in_tree_readme_example() -> None:
    # vLLM's configs/README: Mixtral N=14336, TP2 -> N=7168.
    n = expected_config_name(MIXTRAL_8X7B, tp=2, dtype=None, device_name="NVIDIA H100 80GB HBM3")
    assert n.file_name() == "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"


def test_deepseek_v3_tp8_fp8_block() -> None:
    n = expected_config_name(
        DEEPSEEK_V3, tp=8, dtype="fp8_w8a8", block_shape=(128, 128), device_name="NVIDIA H200"
    )
    assert n.file_name() == (
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )


def test_text_config_nesting() -> None:
    vl = {"model_type": "qwen3_vl_moe", "text_config": dict(QWEN3_30B_A3B)}
    n = expected_config_name(vl, dtype=None, device_name="NVIDIA H200")
    assert (n.E, n.N) == (128, 768)


def test_olmoe_style_num_experts_with_intermediate_size() -> None:
    olmoe = {"num_experts": 64, "intermediate_size": 1024}
    assert expected_config_name(olmoe, dtype=None, device_name="x").N == 1024


@needs_vllm
@pytest.mark.parametrize(
    ("config", "tp", "dtype", "block", "device"),
    [
        (QWEN3_30B_A3B, 1, None, None, "NVIDIA H200"),
        (QWEN3_30B_A3B, 1, "fp8_w8a8", (128, 128), "NVIDIA H200"),
        (MIXTRAL_8X7B, 2, None, None, "NVIDIA H100 80GB HBM3"),
        (MIXTRAL_8X7B, 4, None, None, "NVIDIA A100-SXM4-80GB"),
        (DEEPSEEK_V3, 8, "fp8_w8a8", (128, 128), "NVIDIA H200"),
    ],
)
def test_predicted_names_exist_in_tree(
    config: dict[str, object],
    tp: int,
    dtype: str | None,
    block: tuple[int, int] | None,
    device: str,
) -> None:
    assert IN_TREE is not None
    n = expected_config_name(config, tp=tp, dtype=dtype, block_shape=block, device_name=device)
    assert (IN_TREE / n.file_name()).is_file(), n.file_name()


@needs_vllm
def test_every_in_tree_name_round_trips() -> None:
    assert IN_TREE is not None
    names = [p.name for p in Path(IN_TREE).glob("*.json")]
    assert len(names) > 100
    for name in names:
        assert parse(name).file_name() == name


def test_dense_model_rejected() -> None:
    with pytest.raises(UsageError) as e:
        expected_config_name(
            {"hidden_size": 4096, "intermediate_size": 11008}, dtype=None, device_name="NVIDIA H200"
        )
    assert "MoE" in e.value.problem


def test_missing_intermediate_size_rejected() -> None:
    with pytest.raises(UsageError, match="moe_intermediate_size"):
        expected_config_name({"n_routed_experts": 64}, dtype=None, device_name="NVIDIA H200")


def test_non_integer_expert_count_rejected() -> None:
    with pytest.raises(UsageError) as e:
        expected_config_name(
            {"num_experts": "128", "moe_intermediate_size": 768}, dtype=None, device_name="x"
        )
    assert e.value.what == "num_experts"
    assert e.value.value == "128"


def test_tp_not_dividing_intermediate_rejected() -> None:
    with pytest.raises(UsageError, match="not divisible"):
        expected_config_name(QWEN3_30B_A3B, tp=5, dtype=None, device_name="NVIDIA H200")


def test_bad_tp_rejected() -> None:
    with pytest.raises(UsageError) as e:
        expected_config_name(QWEN3_30B_A3B, tp=0, dtype=None, device_name="NVIDIA H200")
    assert e.value.what == "tp"


def test_bad_dp_rejected() -> None:
    with pytest.raises(UsageError) as e:
        expected_config_name(QWEN3_30B_A3B, dp=-1, dtype=None, device_name="NVIDIA H200")
    assert e.value.what == "dp"


def test_source_is_named() -> None:
    with pytest.raises(UsageError) as e:
        expected_config_name({}, dtype=None, device_name="x", source="models/foo/config.json")
    assert str(e.value).startswith("models/foo/config.json:")


def test_transformers5_qwen3_moe_config_uses_moe_intermediate_size() -> None:
    """transformers 5 saves Qwen3-MoE with num_local_experts; N is still moe_intermediate_size."""
    cfg = {"model_type": "qwen3_moe", "num_local_experts": 16, "moe_intermediate_size": 128,
           "intermediate_size": 512}  # fmt: skip
    name = expected_config_name(cfg, dtype=None, device_name="NVIDIA H200")
    assert name.file_name() == "E=16,N=128,device_name=NVIDIA_H200.json"
