"""Model bandwidth utilisation (MBU) of MoE decode: bytes a decode step must read / TPOT / HBM BW.

Why: decode is memory-bound, so the share of rated HBM bandwidth a config achieves says how much
room a fused-MoE kernel config has left, independent of the load level. For MoE the bytes depend
on the batch: B tokens with top-k routing touch only some of the E experts of a layer (see
``expected_distinct_experts``). Formulas and assumptions: docs/energy-and-mbu.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.metrics.model_shape import ModelShape

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
