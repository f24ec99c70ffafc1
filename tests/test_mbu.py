"""MBU formulas on published model shapes, and the rated-bandwidth table."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.metrics.hardware import (
    match_device,
    normalise_device_name,
    parse_bandwidth,
    rated_bandwidth,
)
from pytest_moeperf.metrics.mbu import (
    StepBytes,
    StepDtypes,
    decode_step_bytes,
    dtype_bytes,
    expected_distinct_experts,
    mbu,
    step_dtypes,
)
from pytest_moeperf.metrics.model_shape import ModelShape, load_model_shape

QWEN3_CONFIG = Path("/work/shared/gpu/qwen3-30b-a3b-shape/config.json")

# Published configs (Hugging Face config.json values), trimmed to the keys the shapes need.
QWEN3_30B: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "intermediate_size": 6144,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
MIXTRAL_8X7B: dict[str, Any] = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
}
QWEN15_MOE_A27B: dict[str, Any] = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "intermediate_size": 5632,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}


@pytest.fixture
def qwen3() -> ModelShape:
    if QWEN3_CONFIG.exists():
        return load_model_shape(QWEN3_CONFIG)
    return ModelShape.from_hf_config(QWEN3_30B)


@pytest.mark.parametrize(
    ("cfg", "total_b", "active_b"),
    [
        (QWEN3_30B, 30.5, 3.3),  # Qwen3-30B-A3B model card
        (MIXTRAL_8X7B, 46.7, 12.9),  # Mixtral of Experts paper
        (DEEPSEEK_V3, 671.0, 37.0),  # DeepSeek-V3 report (without the MTP module)
        (QWEN15_MOE_A27B, 14.3, 2.7),  # Qwen1.5-MoE-A2.7B model card
    ],
    ids=["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "qwen1.5-moe"],
)
def test_parameter_counts_match_published(
    cfg: dict[str, Any], total_b: float, active_b: float
) -> None:
    shape = ModelShape.from_hf_config(cfg)
    assert shape.total_params() / 1e9 == pytest.approx(total_b, rel=0.03)
    assert shape.active_params() / 1e9 == pytest.approx(active_b, rel=0.03)


def test_shared_config_file_gives_the_same_shape(qwen3: ModelShape) -> None:
    assert qwen3 == ModelShape.from_hf_config(QWEN3_30B)
    assert qwen3.moe_layers == 48 and qwen3.dense_layers == 0 and qwen3.qk_norm


def test_distinct_experts_batch_1_vs_64(qwen3: ModelShape) -> None:
    one = decode_step_bytes(qwen3, 1, 0, "bfloat16")
    many = decode_step_bytes(qwen3, 64, 0, "bfloat16")
    assert one.distinct_experts_per_layer == pytest.approx(8.0)
    assert many.distinct_experts_per_layer == pytest.approx(128 * (1 - (120 / 128) ** 64))
    assert 125.0 < many.distinct_experts_per_layer < 126.5
    expert_bytes = 3 * 2048 * 768 * 2
    assert one.experts == pytest.approx(48 * 8 * expert_bytes)
    assert many.experts / one.experts == pytest.approx(many.distinct_experts_per_layer / 8)


def test_expected_distinct_experts_matches_simulated_routing() -> None:
    rng = np.random.default_rng(7)
    e, k, b = 128, 8, 16
    counts = [
        len({int(x) for _ in range(b) for x in rng.choice(e, size=k, replace=False)})
        for _ in range(2000)
    ]
    assert expected_distinct_experts(e, k, b) == pytest.approx(float(np.mean(counts)), rel=0.01)
    assert expected_distinct_experts(e, k, 10_000) == pytest.approx(128.0)
    assert expected_distinct_experts(0, 0, 8) == 0.0


def test_kv_bytes_by_hand(qwen3: ModelShape) -> None:
    sb = decode_step_bytes(qwen3, 64, 1024, "bfloat16")
    # K and V, 48 layers, 4 KV heads of 128, 2 bytes, 64 sequences of 1024 tokens
    assert sb.kv_cache == 2 * 48 * 4 * 128 * 2 * 64 * 1024 == 6_442_450_944
    fp8_kv = decode_step_bytes(qwen3, 64, 1024, "bfloat16", kv_dtype="fp8")
    assert fp8_kv.kv_cache == sb.kv_cache / 2
    assert fp8_kv.weights == sb.weights


def test_mla_kv_bytes_by_hand() -> None:
    shape = ModelShape.from_hf_config(DEEPSEEK_V3)
    assert shape.attention == "mla" and shape.moe_layers == 58
    sb = decode_step_bytes(shape, 4, 1000, "fp8", kv_dtype="bfloat16")
    assert sb.kv_cache == 61 * (512 + 64) * 2 * 4 * 1000


def test_step_bytes_breakdown_batch_1_by_hand(qwen3: ModelShape) -> None:
    sb = decode_step_bytes(qwen3, 1, 1024, "bfloat16")
    attn = 48 * (2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048) * 2
    router = 48 * 2048 * 128 * 2
    experts = 48 * 8 * 3 * 2048 * 768 * 2
    lm_head = 151936 * 2048 * 2
    norms = (48 * (2 * 2048 + 2 * 128) + 2048) * 2
    embed = 1 * 2048 * 2
    kv = 2 * 48 * 4 * 128 * 2 * 1024
    assert (sb.attention, sb.router, sb.experts, sb.lm_head) == (attn, router, experts, lm_head)
    assert (sb.norms, sb.embeddings, sb.kv_cache) == (norms, embed, kv)
    assert sb.shared_experts == 0 and sb.dense_mlp == 0
    assert sb.total == attn + router + experts + lm_head + norms + embed + kv
    assert sb.weights == sb.total - kv
    d = sb.to_dict()
    assert d["total"] == sb.total and d["batch_size"] == 1 and d["context_tokens"] == 1024


def test_batch_1_weights_equal_active_params_times_bytes(qwen3: ModelShape) -> None:
    sb = decode_step_bytes(qwen3, 1, 0, "bfloat16")
    # active params count the full embedding; a step reads only one of its rows
    embed_rows_not_read = (151936 - 1) * 2048
    assert sb.weights == (qwen3.active_params() - embed_rows_not_read) * 2


def test_dtype_scales_weights(qwen3: ModelShape) -> None:
    bf16 = decode_step_bytes(qwen3, 8, 100, "bfloat16")
    fp8 = decode_step_bytes(qwen3, 8, 100, "fp8", kv_dtype="bfloat16")
    int4 = decode_step_bytes(qwen3, 8, 100, "int4", kv_dtype="bfloat16")
    assert fp8.weights == pytest.approx(bf16.weights / 2)
    assert int4.weights == pytest.approx(bf16.weights / 4)
    assert fp8.kv_cache == bf16.kv_cache
    head_bf16 = decode_step_bytes(qwen3, 8, 100, "fp8", lm_head_dtype="bfloat16")
    assert head_bf16.lm_head == 2 * fp8.lm_head
    assert head_bf16.experts == fp8.experts


def test_measured_distinct_experts_override_the_expectation(qwen3: ModelShape) -> None:
    sb = decode_step_bytes(qwen3, 64, 0, "bfloat16", distinct_experts=90.0)
    assert sb.distinct_experts_per_layer == 90.0
    assert sb.experts == 48 * 90 * 3 * 2048 * 768 * 2


def test_sparse_step_and_mlp_only_layers_make_dense_layers() -> None:
    cfg = dict(QWEN3_30B, num_hidden_layers=8, decoder_sparse_step=2, mlp_only_layers=[1])
    shape = ModelShape.from_hf_config(cfg)
    # MoE where (i + 1) % 2 == 0 and i not in [1]: layers 3, 5, 7
    assert shape.moe_layers == 3 and shape.dense_layers == 5
    sb = decode_step_bytes(shape, 1, 0, "bfloat16")
    assert sb.dense_mlp == 5 * 3 * 2048 * 6144 * 2
    assert sb.router == 3 * 2048 * 128 * 2


def test_shared_experts_are_read_every_step() -> None:
    shape = ModelShape.from_hf_config(QWEN15_MOE_A27B)
    sb = decode_step_bytes(shape, 1, 0, "bfloat16")
    assert shape.shared_expert_gate
    assert sb.shared_experts == 24 * (3 * 2048 * 5632 + 2048) * 2
    ds = ModelShape.from_hf_config(DEEPSEEK_V3)
    assert ds.shared_expert_intermediate_size == 2048 and ds.dense_layers == 3


def test_dense_model_has_no_expert_bytes() -> None:
    cfg = {k: v for k, v in QWEN3_30B.items() if k not in ("num_experts", "num_experts_per_tok")}
    shape = ModelShape.from_hf_config(cfg)
    sb = decode_step_bytes(shape, 16, 10, "bfloat16")
    assert shape.moe_layers == 0 and sb.experts == 0 and sb.router == 0
    assert sb.dense_mlp == 48 * 3 * 2048 * 6144 * 2


def test_tied_embeddings_still_read_the_lm_head() -> None:
    tied = ModelShape.from_hf_config(dict(QWEN3_30B, tie_word_embeddings=True))
    untied = ModelShape.from_hf_config(QWEN3_30B)
    assert untied.total_params() - tied.total_params() == 151936 * 2048
    assert decode_step_bytes(tied, 1, 0, "bf16").lm_head == 151936 * 2048 * 2


def test_mbu_formula(qwen3: ModelShape) -> None:
    sb = decode_step_bytes(qwen3, 1, 1024, "bfloat16")
    assert mbu(sb, 0.002, 4.8e12) == pytest.approx(sb.total / 0.002 / 4.8e12)
    assert mbu(sb, 0.002, 4.8e12, gpus=2) == pytest.approx(mbu(sb, 0.002, 4.8e12) / 2)
    assert mbu(9.6e9, 0.004, 4.8e12) == pytest.approx(0.5)


@pytest.mark.parametrize("tpot", [0.0, -1.0, float("nan"), float("inf")])
def test_mbu_bad_tpot_is_a_usage_error(tpot: float) -> None:
    with pytest.raises(UsageError, match="tpot_s"):
        mbu(1e9, tpot, 4.8e12)


def test_mbu_bad_bandwidth_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="moeperf-hbm-bandwidth"):
        mbu(1e9, 0.01, 0.0)


def test_mbu_bad_gpus_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="gpus"):
        mbu(1e9, 0.01, 4.8e12, gpus=0)


def test_mbu_zero_bytes_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="step_bytes"):
        mbu(0.0, 0.01, 4.8e12)


def test_unknown_dtype_is_a_usage_error(qwen3: ModelShape) -> None:
    with pytest.raises(UsageError, match="'nf4'"):
        decode_step_bytes(qwen3, 1, 0, "nf4")
    with pytest.raises(UsageError, match="kv_dtype"):
        decode_step_bytes(qwen3, 1, 0, "bf16", kv_dtype="fp3")
    assert dtype_bytes("BFloat16") == 2.0


@pytest.mark.parametrize("batch", [0, -3, True, 2.5])
def test_bad_batch_size_is_a_usage_error(qwen3: ModelShape, batch: Any) -> None:
    with pytest.raises(UsageError, match="batch_size"):
        decode_step_bytes(qwen3, batch, 0, "bf16")


def test_negative_context_is_a_usage_error(qwen3: ModelShape) -> None:
    with pytest.raises(UsageError, match="mean_context_tokens"):
        decode_step_bytes(qwen3, 1, -1, "bf16")


@pytest.mark.parametrize("d", [7.0, 129.0, 17.0])
def test_impossible_distinct_experts_is_a_usage_error(qwen3: ModelShape, d: float) -> None:
    # batch 2, top-8 of 128: between 8 and 16 experts per layer
    with pytest.raises(UsageError, match="distinct_experts"):
        decode_step_bytes(qwen3, 2, 0, "bf16", distinct_experts=d)


def test_distinct_experts_on_dense_model_is_a_usage_error() -> None:
    cfg = {k: v for k, v in QWEN3_30B.items() if k != "num_experts"}
    with pytest.raises(UsageError, match="no routed experts"):
        decode_step_bytes(ModelShape.from_hf_config(cfg), 1, 0, "bf16", distinct_experts=8)


def test_missing_config_key_is_a_usage_error() -> None:
    cfg = {k: v for k, v in QWEN3_30B.items() if k != "hidden_size"}
    with pytest.raises(UsageError, match=r"hidden_size.*missing.*config\.json"):
        ModelShape.from_hf_config(cfg, source="my/config.json")


def test_bad_config_value_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="num_hidden_layers = '48'"):
        ModelShape.from_hf_config(dict(QWEN3_30B, num_hidden_layers="48"))


def test_top_k_above_experts_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="num_experts_per_tok"):
        ModelShape.from_hf_config(dict(QWEN3_30B, num_experts_per_tok=200))


def test_zero_layers_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="> 0"):
        ModelShape.from_hf_config(dict(QWEN3_30B, num_hidden_layers=0))


def test_unreadable_config_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="cannot read it as JSON"):
        load_model_shape(bad)
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(UsageError, match="not a JSON object"):
        load_model_shape(bad)
    with pytest.raises(UsageError, match="cannot read"):
        load_model_shape(tmp_path / "missing.json")


def test_step_bytes_is_a_plain_dataclass() -> None:
    sb = StepBytes(1, 2, 3, 4, 5, 6, 7, 8, 9, 8.0, 1, 100.0)
    assert sb.total == 45 and sb.weights == 36


# ---- rated bandwidth table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "label", "bw"),
    [
        ("NVIDIA H200", "H200", 4.8e12),
        ("NVIDIA H200 NVL", "H200", 4.8e12),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35e12),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2.0e12),
        ("NVIDIA H100 NVL", "H100 NVL", 3.9e12),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB (SXM)", 2.039e12),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1.555e12),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1.555e12),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1.935e12),
        ("NVIDIA GH200 480GB", "GH200", 4.0e12),
        ("NVIDIA H20", "H20", 4.0e12),
        ("NVIDIA B200", "B200", 8.0e12),
        ("NVIDIA L40S", "L40S", 0.864e12),
        ("NVIDIA L4", "L4", 0.3e12),
        ("AMD Instinct MI300X", "MI300X", 5.3e12),
        ("AMD Instinct MI325X", "MI325X", 6.0e12),
        ("Radeon RX 7900 XTX", "RX 7900 XTX", 0.96e12),
        ("AMD Radeon RX 7900 XT", "RX 7900 XT", 0.8e12),
    ],
)
def test_device_names_map_to_rated_bandwidth(name: str, label: str, bw: float) -> None:
    assert match_device(name) == (label, bw)
    assert rated_bandwidth(name) == (bw, f"table: {label}")


def test_normalise_device_name() -> None:
    assert normalise_device_name("  NVIDIA  A100-SXM4_80GB ") == "NVIDIA A100 SXM4 80GB"


def test_unknown_device_names_the_option() -> None:
    bw, reason = rated_bandwidth("NVIDIA GeForce RTX 4090")
    assert bw is None and "--moeperf-hbm-bandwidth" in reason and "RTX 4090" in reason


def test_override_wins_over_the_table() -> None:
    assert rated_bandwidth("NVIDIA H200", override=4.0e12) == (4.0e12, "override")
    assert rated_bandwidth("unknown part", override=1e12) == (1e12, "override")


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_override_is_a_usage_error(bad: float) -> None:
    with pytest.raises(UsageError, match="--moeperf-hbm-bandwidth"):
        rated_bandwidth("NVIDIA H200", override=bad)


@pytest.mark.parametrize(
    ("text", "value"),
    [("4.8e12", 4.8e12), ("4.8TB/s", 4.8e12), ("4800 GB/s", 4.8e12), ("1 TiB/s", 2.0**40)],
)
def test_parse_bandwidth(text: str, value: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["fast", "4.8 PB/s", "1.2.3TB/s", "-1TB/s", "0"])
def test_bad_bandwidth_text_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="HBM bandwidth"):
        parse_bandwidth(text)


DEEPSEEK_V2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 102400,
    "tie_word_embeddings": False,
}


def test_mla_without_q_lora_matches_published_counts() -> None:
    shape = ModelShape.from_hf_config(DEEPSEEK_V2_LITE)
    assert shape.q_lora_rank is None and shape.moe_layers == 26
    assert shape.total_params() / 1e9 == pytest.approx(15.7, rel=0.03)
    # DeepSeek's "2.4 B activated" leaves the input embedding out
    embedding = 102400 * 2048
    assert (shape.active_params() - embedding) / 1e9 == pytest.approx(2.4, rel=0.03)
    q = 2048 * 16 * (128 + 64)
    kv = 2048 * (512 + 64) + 512 * 16 * (128 + 128)
    o = 16 * 128 * 2048
    assert shape.attention_params_per_layer == q + kv + o


def test_defaults_for_kv_heads_and_head_dim() -> None:
    cfg = {k: v for k, v in MIXTRAL_8X7B.items() if k not in ("num_key_value_heads", "head_dim")}
    shape = ModelShape.from_hf_config(cfg)
    assert shape.num_kv_heads == 32 and shape.head_dim == 4096 // 32
    sb = decode_step_bytes(shape, 1, 10, "bf16")
    assert sb.kv_cache == 2 * 32 * 32 * 128 * 2 * 10


def test_mixtral_experts_use_intermediate_size() -> None:
    shape = ModelShape.from_hf_config(MIXTRAL_8X7B)
    assert shape.moe_layers == 32 and shape.moe_intermediate_size == 14336
    assert shape.expert_params == 3 * 4096 * 14336
    assert not shape.qk_norm and not shape.shared_expert_gate
    sb = decode_step_bytes(shape, 1, 0, "bf16")
    assert sb.distinct_experts_per_layer == 2.0


def test_distinct_experts_grow_with_batch_and_stay_bounded() -> None:
    values = [expected_distinct_experts(128, 8, b) for b in range(1, 300)]
    assert all(a < b for a, b in itertools.pairwise(values))
    assert all(8.0 <= v <= 128.0 for v in values)
    # never more than B x k distinct experts
    assert all(v <= 8 * b for b, v in enumerate(values, start=1))


def test_mbu_by_hand_on_h200(qwen3: ModelShape) -> None:
    sb = decode_step_bytes(qwen3, 1, 1024, "bfloat16")
    bw, source = rated_bandwidth("NVIDIA H200")
    assert bw is not None and source == "table: H200"
    # 6,184,402,944 bytes in a 2 ms step on 4.8 TB/s
    assert sb.total == 6_184_402_944
    assert mbu(sb, 0.002, bw) == pytest.approx(6_184_402_944 / 0.002 / 4.8e12)
    assert 0.64 < mbu(sb, 0.002, bw) < 0.65


def test_large_batch_reads_nearly_every_expert(qwen3: ModelShape) -> None:
    sb = decode_step_bytes(qwen3, 256, 0, "bfloat16")
    all_experts = 48 * 128 * 3 * 2048 * 768 * 2
    assert sb.experts == pytest.approx(all_experts, rel=1e-6)
    # the weight bytes approach the full model (minus the unread embedding rows)
    full = (qwen3.total_params() - (151936 - 256) * 2048) * 2
    assert sb.weights == pytest.approx(full, rel=1e-6)


def test_step_bytes_dict_is_json() -> None:
    shape = ModelShape.from_hf_config(QWEN3_30B)
    d = json.loads(json.dumps(decode_step_bytes(shape, 4, 12.5, "fp8").to_dict()))
    assert d["context_tokens"] == 50.0 and d["batch_size"] == 4
    assert d["total"] == pytest.approx(d["weights"] + d["kv_cache"])


@pytest.mark.parametrize(
    ("name", "b"), [("FP32", 4.0), ("bf16", 2.0), ("Half", 2.0), ("fp8_e5m2", 1.0), ("int4", 0.5)]
)
def test_dtype_names(name: str, b: float) -> None:
    assert dtype_bytes(name) == b


def test_qwen2_moe_without_shared_expert_has_no_gate() -> None:
    cfg = {k: v for k, v in QWEN15_MOE_A27B.items() if k != "shared_expert_intermediate_size"}
    shape = ModelShape.from_hf_config(cfg)
    assert shape.shared_expert_intermediate_size == 0 and not shape.shared_expert_gate
    assert decode_step_bytes(shape, 1, 0, "bf16").shared_experts == 0


# --- quantized weights (issue 16: an H200 fp8 run had MBU 0.87, fp8 weights counted as bf16)


def test_online_fp8_reads_fp8_weights_and_bf16_kv_and_head() -> None:
    dt = step_dtypes("bfloat16", "fp8", None)
    assert (dt.weights, dt.kv, dt.lm_head) == ("fp8", "bfloat16", "bfloat16")
    assert step_dtypes("bfloat16", None, None) == StepDtypes("bfloat16", "bfloat16", "bfloat16")
    assert step_dtypes("bfloat16", "fp8", "fp8_e4m3").kv == "fp8"
    assert step_dtypes("bfloat16", None, "auto").kv == "bfloat16"
    assert step_dtypes("float16", "AWQ", None).weights == "int4"


def test_quantization_of_unknown_width_is_a_usage_error_naming_it() -> None:
    with pytest.raises(UsageError, match="gptq") as e:
        step_dtypes("bfloat16", "gptq", None)
    assert "fp8" in str(e.value)  # the known ones are listed


def test_h200_fp8_boundary_mbu_counts_fp8_weights() -> None:
    """The recorded H200 fp8 run's first boundary probe: the fixed MBU is about half the old one
    at large batch minus the bf16 KV cache and LM head, which did not shrink."""
    from pytest_moeperf.run.figures import MbuInputs, decode_mbu

    if not QWEN3_CONFIG.exists():
        pytest.skip(f"needs the shared model shape at {QWEN3_CONFIG}")
    shape = load_model_shape(QWEN3_CONFIG)
    summary = {"tpot": {"mean_ms": 11.855322142549602}, "output_tok_s": 1975.8698306849526,
               "mean_input_tokens": 1024.0, "mean_output_tokens": 128.0}  # fmt: skip
    bw = 4.8e12
    old = decode_mbu(summary, MbuInputs(shape, "bfloat16", 1, bw, "test"))
    dt = step_dtypes("bfloat16", "fp8", None)
    new = decode_mbu(summary, MbuInputs(shape, dt.weights, 1, bw, "test", dt.kv, dt.lm_head))
    assert old == pytest.approx(0.8744, abs=0.002)  # what the run recorded
    assert new is not None and old is not None
    batch = round(1975.8698306849526 * 0.011855322142549602)
    ctx = 1024 + 64
    full = decode_step_bytes(shape, batch, ctx, "bfloat16")
    fixed = decode_step_bytes(shape, batch, ctx, "fp8", kv_dtype="bfloat16",
                              lm_head_dtype="bfloat16")  # fmt: skip
    assert new == pytest.approx(old * fixed.total / full.total)
    assert fixed.kv_cache == full.kv_cache and fixed.lm_head == full.lm_head
    assert 0.5 * old < new < 0.8 * old
