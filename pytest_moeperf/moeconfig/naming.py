"""vLLM fused-MoE config file names: build, parse, and predict them from a model's config.json.

vLLM finds a tuned config only by its exact file name, so one wrong character (``N=1536`` instead
of ``N=768``, ``NVIDIA H200`` instead of ``NVIDIA_H200``) silently falls back to the default
tiling. Everything here mirrors ``vllm/model_executor/layers/fused_moe/fused_moe.py``
(``get_config_file_name``) and ``vllm/utils/platform_utils.py`` (``get_device_name_as_file_name``)
of vLLM 0.32 so a test can say *before* starting a server which file it should pick up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pytest_moeperf.errors import UsageError

# E=<int>,N=<int>,device_name=<no comma>[,dtype=<tok>][,block_shape=[n,k]][,backend=<tok>].json
_NAME_RE = re.compile(
    r"^E=(?P<E>[0-9]+),N=(?P<N>[0-9]+),device_name=(?P<device>[^,/\\]+)"
    r"(?:,dtype=(?P<dtype>[A-Za-z0-9_]+))?"
    r"(?:,block_shape=\[(?P<bn>[0-9]+),(?P<bk>[0-9]+)\])?"
    r"(?:,backend=(?P<backend>[A-Za-z0-9_]+))?"
    r"\.json$"
)
_LOOSE_RE = re.compile(r"^E=[^,]*,N=[^,]*,device_name=.*\.json$")

NAME_FORMAT = "E=<experts>,N=<intermediate>,device_name=<GPU>[,dtype=<q>][,block_shape=[n,k]].json"

# (experts key, intermediate-size keys in preference order) per model family, checked in order.
_EXPERT_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("n_routed_experts", ("moe_intermediate_size",)),  # DeepSeek-V2/V3, Kimi
    ("num_experts", ("moe_intermediate_size", "intermediate_size")),  # Qwen2/3-MoE, OLMoE
    # transformers 5 saves Qwen3-MoE with num_local_experts (and moe_intermediate_size)
    ("num_local_experts", ("moe_intermediate_size", "intermediate_size")),  # Mixtral, gpt-oss
)


@dataclass(frozen=True)
class MoeConfigName:
    """The identity of one tuned config file, i.e. what vLLM keys its lookup on.

    ``E`` is the number of experts *on one GPU* and ``N`` the intermediate size *of one shard*
    (what vLLM reads from the w2 weight shape), not the model's global numbers.
    """

    E: int
    N: int
    device_name: str
    dtype: str | None = None
    block_shape: tuple[int, int] | None = None
    backend: str | None = None

    def file_name(self) -> str:
        """The file name exactly as vLLM's ``get_config_file_name`` builds it."""
        dtype_sel = f",dtype={self.dtype}" if self.dtype else ""
        # vLLM drops the selector when any block dim is 0 (``not all(block_shape)``).
        block_sel = ""
        if self.block_shape is not None and all(self.block_shape):
            block_sel = f",block_shape=[{self.block_shape[0]},{self.block_shape[1]}]"
        backend_sel = f",backend={self.backend}" if self.backend else ""
        return (
            f"E={self.E},N={self.N},device_name={self.device_name}"
            f"{dtype_sel}{block_sel}{backend_sel}.json"
        )

    def __str__(self) -> str:
        return self.file_name()


def looks_like_config_name(file_name: str) -> bool:
    """True for anything shaped like a MoE config name, valid or not (for discovery + errors)."""
    return bool(_LOOSE_RE.match(file_name))


def is_config_file_name(file_name: str) -> bool:
    """True when ``file_name`` (a base name, no directory) parses as a MoE config name."""
    return bool(_NAME_RE.match(file_name))


def parse(file_name: str, source: str | None = None) -> MoeConfigName:
    """Inverse of :meth:`MoeConfigName.file_name`; a UsageError names the file when it is not one.

    ``source`` says where the name came from (a path, a marker argument); defaults to the name.
    """
    src = source or f"file {file_name}"
    m = _NAME_RE.match(file_name)
    if m is None:
        raise UsageError(
            src,
            "file name",
            file_name,
            f"not a vLLM fused-MoE config name ({NAME_FORMAT}), so vLLM would never load it",
            "rename it to the name vLLM looks up, e.g. "
            "'E=128,N=768,device_name=NVIDIA_H200.json' (see expected_config_name())",
        )
    block: tuple[int, int] | None = None
    if m.group("bn") is not None:
        block = (int(m.group("bn")), int(m.group("bk")))
    name = MoeConfigName(
        E=int(m.group("E")),
        N=int(m.group("N")),
        device_name=m.group("device"),
        dtype=m.group("dtype"),
        block_shape=block,
        backend=m.group("backend"),
    )
    if name.E <= 0 or name.N <= 0:
        raise UsageError(
            src, "file name", file_name, "E and N must be positive", "fix the E=/N= numbers"
        )
    device = normalize_device_name(name.device_name)
    if device != name.device_name:  # "NVIDIA H200", "NVIDIA_H200_NVL": vLLM never builds these
        fixed = replace(name, device_name=device).file_name()
        raise UsageError(
            src,
            "file name",
            file_name,
            f"vLLM spells this device_name {device!r} ({fixed!r}), so it would never load "
            "this file",
            f"rename it to {fixed!r}",
        )
    if name.file_name() != file_name:
        # e.g. leading zeros "E=0128" or a zero block dim: vLLM would never build this name.
        raise UsageError(
            src,
            "file name",
            file_name,
            f"vLLM would spell this config {name.file_name()!r}, so it would never load this file",
            f"rename it to {name.file_name()!r}",
        )
    return name


def normalize_device_name(raw: str) -> str:
    """``torch.cuda.get_device_name()`` -> the ``device_name=`` part vLLM puts in file names.

    Whitespace and '/' runs become '_' (``get_device_name_as_file_name``), and every H200 variant
    ("NVIDIA H200 NVL", "NVIDIA H200 141GB HBM3e") maps to "NVIDIA_H200" (``get_config_file_name``).
    """
    name = re.sub(r"[\s/]+", "_", raw.strip())
    if "H200" in name.split("_"):
        name = "NVIDIA_H200"
    return name


def moe_section(model_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal MoE models (Qwen3-VL-MoE, Llama 4) keep the MoE fields under text_config."""
    if any(k in model_config for k, _ in _EXPERT_KEYS):
        return model_config
    text = model_config.get("text_config")
    if isinstance(text, Mapping) and any(k in text for k, _ in _EXPERT_KEYS):
        return text
    return model_config


def _positive_int(value: object, source: str, what: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(source, what, value, "must be a positive integer", fix)
    return value


def expected_config_name(
    model_config: Mapping[str, Any],
    *,
    tp: int = 1,
    dp: int = 1,
    ep: bool = False,
    dtype: str | None,
    device_name: str,
    block_shape: tuple[int, int] | None = None,
    num_redundant_experts: int = 0,
    source: str = "model config.json",
) -> MoeConfigName:
    """Predict the config file vLLM looks up for a HF ``config.json`` dict.

    ``E`` and ``N`` are one GPU's (``moe_shard``). ``dtype`` is vLLM's selector: None for
    bf16/fp16, "fp8_w8a8", "int8_w8a16", "int4_w4a16", ...
    """
    experts, n = moe_shard(model_config, tp=tp, dp=dp, ep=ep,
                           num_redundant_experts=num_redundant_experts, source=source)  # fmt: skip
    return MoeConfigName(experts, n, normalize_device_name(device_name), dtype, block_shape)


def moe_shard(
    model_config: Mapping[str, Any],
    *,
    tp: int = 1,
    dp: int = 1,
    ep: bool = False,
    num_redundant_experts: int = 0,
    source: str = "model config.json",
) -> tuple[int, int]:
    """(E, N) of the MoE layer on one GPU, as vLLM's fused-MoE kernel sees it.

    Mirrors ``FusedMoEParallelConfig.make``: the MoE layer's TP size is ``tp * dp``; with
    ``ep`` (``--enable-expert-parallel``) that product becomes the EP size instead, so experts
    are split (E = experts // ep_size, rank 0 gets one more when it does not divide) and N stays
    unsharded. ``N`` is the per-shard intermediate size I/tp (vLLM reads it from w2's shape, not
    from w1's 2*I); for int4_w4a16 vLLM doubles the packed N back to the same number.
    """
    tp = _positive_int(tp, source, "tp", "pass the --tensor-parallel-size the server runs with")
    dp = _positive_int(dp, source, "dp", "pass the --data-parallel-size the server runs with")
    section = moe_section(model_config)
    experts_key = next((k for k, _ in _EXPERT_KEYS if k in section), None)
    if experts_key is None:
        raise UsageError(
            source,
            "experts field",
            sorted(section.keys()),
            "no MoE expert count found (looked for "
            + ", ".join(repr(k) for k, _ in _EXPERT_KEYS)
            + "); this does not look like a MoE model",
            "pass the config.json of a MoE model, or skip MoE config checks for dense models",
        )
    inter_keys = dict(_EXPERT_KEYS)[experts_key]
    inter_key = next((k for k in inter_keys if k in section), None)
    if inter_key is None:
        raise UsageError(
            source,
            "intermediate size field",
            None,
            f"model has {experts_key!r} but none of {list(inter_keys)!r}",
            "pass the model's full config.json (the per-expert intermediate size is required)",
        )
    fix_field = f"check {experts_key!r}/{inter_key!r} in config.json"
    experts = _positive_int(section[experts_key], source, experts_key, fix_field)
    inter = _positive_int(section[inter_key], source, inter_key, fix_field)
    if isinstance(num_redundant_experts, bool) or num_redundant_experts < 0:
        raise UsageError(
            source,
            "num_redundant_experts",
            num_redundant_experts,
            "must be >= 0",
            "pass the EPLB --num-redundant-experts value (0 without EPLB)",
        )
    moe_tp = tp * dp
    if num_redundant_experts and not (ep and moe_tp > 1):
        raise UsageError(
            source,
            "num_redundant_experts",
            num_redundant_experts,
            "redundant experts (EPLB) exist only with expert parallel over more than one GPU",
            "pass ep=True with tp*dp > 1, or num_redundant_experts=0",
        )
    if ep and moe_tp > 1:
        total = experts + num_redundant_experts
        local = total // moe_tp + (1 if total % moe_tp else 0)  # rank 0 of an uneven split
        return local, inter
    if inter % moe_tp:
        raise UsageError(
            source,
            inter_key,
            inter,
            f"not divisible by the MoE tensor-parallel size {moe_tp} (tp={tp} x dp={dp})",
            "use a tp/dp whose product divides the intermediate size, or enable expert parallel",
        )
    return experts, inter // moe_tp
