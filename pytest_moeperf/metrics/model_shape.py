"""The shapes of a decoder that decide the bytes a decode step reads, from its ``config.json``.

Apart from ``mbu`` because reading Hugging Face configs (dense, MoE with shared experts, MLA) is
its own job with its own errors; ``mbu`` only does the arithmetic over a shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import UsageError


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
