"""Model bandwidth utilisation (MBU) of MoE decode: bytes a decode step must read / TPOT / HBM BW.

Why: decode is memory-bound, so the share of rated HBM bandwidth a config achieves says how much
room a fused-MoE kernel config has left, independent of the load level. For MoE the bytes depend
on the batch: B tokens with top-k routing touch only some of the E experts of a layer (see
``expected_distinct_experts``). Formulas and assumptions: docs/energy-and-mbu.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import UsageError

_DTYPE_GROUPS: dict[float, tuple[str, ...]] = {
    4.0: ("float32", "fp32"),
    2.0: ("bfloat16", "bf16", "float16", "fp16", "half"),
    1.0: ("fp8", "float8", "fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "int8"),
    0.5: ("int4",),
}
DTYPE_BYTES: dict[str, float] = {n: b for b, names in _DTYPE_GROUPS.items() for n in names}

#: Weight element type of vLLM ``--quantization`` methods whose weight width is fixed. Methods
#: whose width is a per-checkpoint choice (gptq, bitsandbytes, compressed-tensors) are absent:
#: MBU is then not computed rather than computed with the unquantized width.
QUANTIZATION_WEIGHT_DTYPE: dict[str, str] = {
    "fp8": "fp8", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8", "awq": "int4", "awq_marlin": "int4",
}  # fmt: skip


@dataclass(frozen=True)
class StepDtypes:
    """Element types a decode step reads: quantized weights, the KV cache, the LM head."""

    weights: str
    kv: str
    lm_head: str


def step_dtypes(dtype: str, quantization: str | None, kv_cache_dtype: str | None) -> StepDtypes:
    """What each part of a decode step is stored as, from the spec's dtype and engine args.

    vLLM's online fp8 (``--quantization fp8`` on a bf16 checkpoint) stores linear and expert
    weights in fp8 but keeps the LM head and, unless ``--kv-cache-dtype`` says otherwise, the
    KV cache in the model dtype: counting fp8 weights as bf16 doubled MBU on the H200.
    """
    kv = dtype if kv_cache_dtype in (None, "", "auto") else str(kv_cache_dtype)
    if kv in ("fp8_e4m3", "fp8_e5m2", "fp8_inc"):
        kv = "fp8"
    if not quantization:
        return StepDtypes(dtype, kv, dtype)
    weights = QUANTIZATION_WEIGHT_DTYPE.get(quantization.lower())
    if weights is None:
        raise UsageError(
            "MBU",
            "quantization",
            quantization,
            "has no fixed weight width known to moeperf",
            f"MBU is left out; known: {', '.join(sorted(QUANTIZATION_WEIGHT_DTYPE))}",
        )
    return StepDtypes(weights, kv, dtype)


def dtype_bytes(dtype: str, what: str = "dtype") -> float:
    """Bytes per element of a weight or KV dtype name (scales of quantised formats not counted)."""
    b = DTYPE_BYTES.get(str(dtype).lower())
    if b is None:
        raise UsageError(
            "decode_step_bytes",
            what,
            dtype,
            "unknown dtype",
            f"use one of {', '.join(sorted(DTYPE_BYTES))}",
        )
    return b


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a decoder that decide how many bytes one decode step reads.

    ``attention`` is "mha" (GQA/MHA, ``num_kv_heads`` x ``head_dim`` per K and V) or "mla"
    (DeepSeek latent attention: one ``kv_lora_rank + qk_rope_head_dim`` vector per token).
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    dense_intermediate_size: int = 0
    moe_layers: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    qk_norm: bool = False
    attention: str = "mha"
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk
            else:
                q = h * self.num_heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + self.num_heads * self.v_head_dim * h
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return h * q_out + 2 * h * kv_out + q_out * h

    @property
    def norm_params_per_layer(self) -> int:
        n = 2 * self.hidden_size  # input and post-attention RMSNorm
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.attention == "mla":
            n += (self.q_lora_rank or 0) + self.kv_lora_rank
        return n

    @property
    def expert_params(self) -> int:
        """One routed expert: gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def shared_params_per_layer(self) -> int:
        gate = self.hidden_size if self.shared_expert_gate else 0
        return 3 * self.hidden_size * self.shared_expert_intermediate_size + gate

    @property
    def dense_mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.dense_intermediate_size

    def kv_elements_per_token(self) -> int:
        """KV-cache elements one context token holds over all layers."""
        if self.attention == "mla":
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def total_params(self) -> int:
        per_layer = self.attention_params_per_layer + self.norm_params_per_layer
        moe = self.router_params_per_layer + self.num_experts * self.expert_params
        moe += self.shared_params_per_layer
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return (
            self.num_layers * per_layer
            + self.moe_layers * moe
            + self.dense_layers * self.dense_mlp_params_per_layer
            + embed
            + head
            + self.hidden_size  # final norm
        )

    def active_params(self) -> int:
        """Parameters one token uses, counting the whole embedding as vendors' model cards do."""
        idle = (self.num_experts - self.experts_per_tok) * self.expert_params
        return self.total_params() - self.moe_layers * idle

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], source: str = "config.json") -> ModelShape:
        return _shape_from_config(cfg, source)


def load_model_shape(path: str | Path) -> ModelShape:
    """ModelShape from a Hugging Face ``config.json`` file."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(
            str(p),
            "config.json",
            str(p),
            f"cannot read it as JSON ({e})",
            "point at the model's config.json",
        ) from None
    if not isinstance(cfg, dict):
        raise UsageError(
            str(p),
            "config.json",
            type(cfg).__name__,
            "not a JSON object",
            "use the model's config.json",
        )
    return _shape_from_config(cfg, str(p))


def _int(cfg: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise UsageError(
            source, key, None, "missing from the model config", f"add {key!r} to the config.json"
        )
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UsageError(
            source, key, v, "must be a non-negative integer", "fix the config.json value"
        )
    return v


def _shape_from_config(cfg: Mapping[str, Any], source: str) -> ModelShape:
    hidden = _int(cfg, "hidden_size", source)
    layers = _int(cfg, "num_hidden_layers", source)
    heads = _int(cfg, "num_attention_heads", source)
    if hidden == 0 or layers == 0 or heads == 0:
        raise UsageError(
            source,
            "hidden_size/num_hidden_layers/num_attention_heads",
            (hidden, layers, heads),
            "a transformer needs all three > 0",
            "fix the config.json values",
        )
    kv_heads = _int(cfg, "num_key_value_heads", source, heads)
    head_dim = _int(cfg, "head_dim", source, hidden // heads)
    vocab = _int(cfg, "vocab_size", source)
    tied = bool(cfg.get("tie_word_embeddings", False))
    model_type = str(cfg.get("model_type", ""))
    deepseek = "n_routed_experts" in cfg
    experts = _int(cfg, "n_routed_experts" if deepseek else "num_experts", source, 0)
    if not deepseek and experts == 0:
        experts = _int(cfg, "num_local_experts", source, 0)  # Mixtral
    top_k = _int(cfg, "num_experts_per_tok", source, 0) if experts else 0
    if experts and not 0 < top_k <= experts:
        raise UsageError(
            source,
            "num_experts_per_tok",
            top_k,
            f"must be in 1..{experts} (the number of experts)",
            "fix the config.json value",
        )
    dense_inter = _int(cfg, "intermediate_size", source, 0)
    moe_inter = _int(cfg, "moe_intermediate_size", source, dense_inter) if experts else 0
    if deepseek:
        first_dense = _int(cfg, "first_k_dense_replace", source, 0)
        freq = max(1, _int(cfg, "moe_layer_freq", source, 1))
        is_moe = [experts > 0 and i >= first_dense and i % freq == 0 for i in range(layers)]
        shared = _int(cfg, "n_shared_experts", source, 0) * moe_inter
    else:
        step = max(1, _int(cfg, "decoder_sparse_step", source, 1))
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        is_moe = [experts > 0 and i not in mlp_only and (i + 1) % step == 0 for i in range(layers)]
        shared = _int(cfg, "shared_expert_intermediate_size", source, 0) if experts else 0
    mla = "kv_lora_rank" in cfg and cfg.get("kv_lora_rank") is not None
    q_lora = cfg.get("q_lora_rank") if mla else None
    return ModelShape(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        num_experts=experts,
        experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        dense_intermediate_size=dense_inter,
        moe_layers=sum(is_moe),
        shared_expert_intermediate_size=shared,
        shared_expert_gate=model_type == "qwen2_moe" and shared > 0,
        qk_norm=model_type.startswith("qwen3"),
        attention="mla" if mla else "mha",
        q_lora_rank=int(q_lora) if isinstance(q_lora, int) else None,
        kv_lora_rank=_int(cfg, "kv_lora_rank", source, 0) if mla else 0,
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", source, 0) if mla else 0,
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", source, 0) if mla else 0,
        v_head_dim=_int(cfg, "v_head_dim", source, 0) if mla else 0,
    )


def expected_distinct_experts(num_experts: int, top_k: int, batch_size: int) -> float:
    """E * (1 - (1 - k/E)^B): experts of one layer a batch of B tokens touches, uniform routing.

    A token picks a uniform k-subset, so a given expert is missed with probability 1 - k/E;
    B independent tokens all miss it with probability (1 - k/E)^B.
    """
    if num_experts <= 0 or top_k <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch_size)


@dataclass
class StepBytes:
    """Bytes one decode step of the whole batch reads from HBM, by component."""

    attention: float
    norms: float
    router: float
    experts: float
    shared_experts: float
    dense_mlp: float
    embeddings: float
    lm_head: float
    kv_cache: float
    distinct_experts_per_layer: float
    batch_size: int
    context_tokens: float

    @property
    def weights(self) -> float:
        return self.total - self.kv_cache

    @property
    def total(self) -> float:
        return (
            self.attention
            + self.norms
            + self.router
            + self.experts
            + self.shared_experts
            + self.dense_mlp
            + self.embeddings
            + self.lm_head
            + self.kv_cache
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["weights"] = self.weights
        d["total"] = self.total
        return d


def decode_step_bytes(
    shape: ModelShape,
    batch_size: int,
    mean_context_tokens: float,
    dtype: str,
    kv_dtype: str | None = None,
    distinct_experts: float | None = None,
    lm_head_dtype: str | None = None,
) -> StepBytes:
    """Bytes one decode step of ``batch_size`` sequences reads (weights once, KV per sequence).

    ``distinct_experts`` is a measured mean count of experts touched per MoE layer; without it the
    uniform-routing expectation is used. ``lm_head_dtype`` defaults to ``dtype`` (fp8 checkpoints
    often keep the LM head in bf16: pass "bfloat16" then).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(
            "decode_step_bytes",
            "batch_size",
            batch_size,
            "must be an integer >= 1",
            "pass the number of sequences decoded in one step",
        )
    if not math.isfinite(mean_context_tokens) or mean_context_tokens < 0:
        raise UsageError(
            "decode_step_bytes",
            "mean_context_tokens",
            mean_context_tokens,
            "must be a finite number >= 0",
            "pass mean prompt + generated tokens per sequence",
        )
    wb = dtype_bytes(dtype)
    kvb = dtype_bytes(kv_dtype if kv_dtype is not None else dtype, "kv_dtype")
    hb = dtype_bytes(lm_head_dtype if lm_head_dtype is not None else dtype, "lm_head_dtype")
    d = _distinct(shape, batch_size, distinct_experts)
    context = batch_size * float(mean_context_tokens)
    return StepBytes(
        attention=shape.num_layers * shape.attention_params_per_layer * wb,
        norms=(shape.num_layers * shape.norm_params_per_layer + shape.hidden_size) * wb,
        router=shape.moe_layers * shape.router_params_per_layer * wb,
        experts=shape.moe_layers * d * shape.expert_params * wb,
        shared_experts=shape.moe_layers * shape.shared_params_per_layer * wb,
        dense_mlp=shape.dense_layers * shape.dense_mlp_params_per_layer * wb,
        embeddings=batch_size * shape.hidden_size * wb,
        lm_head=shape.vocab_size * shape.hidden_size * hb,
        kv_cache=shape.kv_elements_per_token() * kvb * context,
        distinct_experts_per_layer=d,
        batch_size=batch_size,
        context_tokens=context,
    )


def _distinct(shape: ModelShape, batch_size: int, measured: float | None) -> float:
    if measured is None:
        return expected_distinct_experts(shape.num_experts, shape.experts_per_tok, batch_size)
    if shape.num_experts == 0:
        raise UsageError(
            "decode_step_bytes",
            "distinct_experts",
            measured,
            "the model has no routed experts",
            "leave distinct_experts unset for a dense model",
        )
    lo = float(shape.experts_per_tok)
    hi = float(min(shape.num_experts, batch_size * shape.experts_per_tok))
    if not (math.isfinite(measured) and lo <= measured <= hi):
        raise UsageError(
            "decode_step_bytes",
            "distinct_experts",
            measured,
            f"B={batch_size} tokens with top-{shape.experts_per_tok} of {shape.num_experts} "
            f"experts touch between {lo:g} and {hi:g} experts per layer",
            "pass the measured mean number of distinct experts per MoE layer",
        )
    return float(measured)


def mbu(
    step_bytes: StepBytes | float, tpot_s: float, rated_bw_bytes_per_s: float, gpus: int = 1
) -> float:
    """bytes / TPOT / (rated bandwidth x GPUs): share of the fleet's HBM bandwidth decode uses."""
    total = step_bytes.total if isinstance(step_bytes, StepBytes) else float(step_bytes)
    if not math.isfinite(total) or total <= 0:
        raise UsageError("mbu", "step_bytes", total, "must be > 0", "pass decode_step_bytes(...)")
    if not math.isfinite(tpot_s) or tpot_s <= 0:
        raise UsageError(
            "mbu",
            "tpot_s",
            tpot_s,
            "must be a positive number of seconds",
            "pass the measured time per output token (needs outputs of >= 2 tokens)",
        )
    if not math.isfinite(rated_bw_bytes_per_s) or rated_bw_bytes_per_s <= 0:
        raise UsageError(
            "mbu",
            "rated_bw_bytes_per_s",
            rated_bw_bytes_per_s,
            "must be > 0",
            "pass hardware.rated_bandwidth(...) or set --moeperf-hbm-bandwidth",
        )
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise UsageError(
            "mbu", "gpus", gpus, "must be an integer >= 1", "pass the GPUs the server uses"
        )
    return total / tpot_s / (rated_bw_bytes_per_s * gpus)
