"""Per-M fused-MoE kernel timings and numerics of two config files, on vLLM's own Triton path.

A config PR re-tiles keys, and vLLM serves each batch size M through the nearest key, so the
A/B that says what changed is per M: the tiling each file serves at M (``perm.tiling``), timed
on one GPU with base and head interleaved, and each tiling's output checked against a plain-torch
reference. The timing is vLLM's ``benchmarks/kernels/benchmark_moe.py`` ``benchmark_config``:
random weights, ``fused_topk`` then ``fused_experts`` under ``override_config(tiling)``, 10
invocations captured in one CUDA graph, CUDA events around each replay. torch and vllm are
imported inside functions, so this module (and its CPU parts) work where neither GPU nor vLLM's
Triton path exists.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.perm import Side, check_m, m_values, tiling

if TYPE_CHECKING:
    import torch

DTYPES = ("bf16", "fp8_w8a8")
VLLM_API = "0.24.0"
INVOCATIONS = 10  # per CUDA graph, as benchmark_config captures them
WARMUP_ROUNDS = 2  # ABBA rounds replayed before timing (benchmark_config replays 5 times)
REPLAY_OVERHEAD_S = 60e-6  # gating copy + synchronize around each replay, for the time plan
#: (module, name, keyword parameters this file passes): vLLM 0.24.0's fused-MoE API.
SYMBOLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vllm.model_executor.layers.fused_moe", "override_config", ()),
    ("vllm.model_executor.layers.fused_moe", "fused_topk", ("renormalize",)),
    ("vllm.model_executor.layers.fused_moe", "fused_experts", ("quant_config",)),
    (
        "vllm.model_executor.layers.fused_moe.config",
        "fp8_w8a8_moe_quant_config",
        ("w1_scale", "w2_scale", "a1_scale", "a2_scale", "per_act_token_quant", "block_shape"),
    ),
    ("vllm.platforms", "current_platform", ()),
)


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # not installed, or broken: the error below names the symbol anyway
        return "(not importable)"


def resolve(symbols: Sequence[tuple[str, str, tuple[str, ...]]] = SYMBOLS) -> dict[str, Any]:
    """The vLLM functions this harness calls; one clear error naming the first that differs."""
    out: dict[str, Any] = {}
    fix = f"install vllm=={VLLM_API}, or port kernel_bench.SYMBOLS to this vLLM"
    for module, name, params in symbols:
        try:
            obj = out[name] = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            why = f"missing ({type(e).__name__}: {e}); this harness follows vLLM {VLLM_API}"
            where = f"{module}.{name}"
            raise UsageError(f"vLLM {_vllm_version()}", "symbol", where, why, fix) from e
        missing = [p + "=" for p in params if p not in inspect.signature(obj).parameters]
        if missing:
            where = f"{module}.{name}({', '.join(missing)})"
            why = f"no such parameter; this harness follows vLLM {VLLM_API}"
            raise UsageError(f"vLLM {_vllm_version()}", "signature", where, why, fix)
    return out


def skip_reason() -> str | None:
    """Why the per-M kernel A/B cannot run here, as a sentence; None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed, so there is no GPU to time fused-MoE kernels on"
    if not torch.cuda.is_available():
        return (
            f"no CUDA device: torch {torch.__version__} sees no GPU "
            "(torch.cuda.is_available() is False); the per-M kernel A/B needs an NVIDIA GPU"
        )
    try:
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
    except Exception as e:
        return f"vLLM is not importable ({type(e).__name__}: {e}); install vllm=={VLLM_API}"
    if current_platform.is_cpu():
        return f"vLLM {_vllm_version()} is the CPU build: it has no fused-MoE Triton kernels"
    if not current_platform.is_cuda():
        return f"vLLM's platform is {current_platform.device_name!r}, not CUDA"
    if not HAS_TRITON:
        return f"vLLM {_vllm_version()} finds no Triton, so fused_experts is not there"
    try:
        resolve()
    except UsageError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class MoeShape:
    """One MoE layer as fused_experts sees it on one GPU: w1 [E, 2N, K], w2 [E, K, N]."""

    experts: int
    n: int  # moe intermediate size per partition (the N of vLLM's config file name)
    k: int  # hidden size
    topk: int
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("experts", "n", "k", "topk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError("MoE shape", name, v, "must be a positive integer", "fix it")
        if self.topk > self.experts:
            raise UsageError("MoE shape", "topk", self.topk, "more than E experts", "fix it")
        if self.dtype not in DTYPES:
            raise UsageError("MoE shape", "dtype", self.dtype, "not timed here", f"use {DTYPES}")


@dataclass(frozen=True)
class MResult:
    """One M: µs per fused-MoE invocation per replay, and each tiling's relative error."""

    m: int
    base_us: tuple[float, ...]
    head_us: tuple[float, ...]
    same_tiling: bool
    base_error: float
    head_error: float


@dataclass(frozen=True)
class BenchResult:
    """Everything one A/B measured, with what it ran on; ``to_dict`` is what goes to JSON."""

    shape: MoeShape
    per_m: tuple[MResult, ...]
    device: str
    versions: dict[str, str]  # torch, vllm, triton
    wall_s: float
    timing_s: float  # in the timed replay loops alone
    invocations: int = INVOCATIONS

    def samples(self) -> dict[int, tuple[list[float], list[float]]]:
        return {r.m: (list(r.base_us), list(r.head_us)) for r in self.per_m}

    def errors(self, side: Side) -> dict[int, float]:
        return {r.m: r.base_error if side == "base" else r.head_error for r in self.per_m}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # tuples come out as JSON arrays

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BenchResult:
        rows = tuple(
            MResult(r["m"], tuple(r["base_us"]), tuple(r["head_us"]), r["same_tiling"],
                    r["base_error"], r["head_error"])
            for r in d["per_m"]
        )  # fmt: skip
        return cls(MoeShape(**d["shape"]), rows, d["device"], dict(d["versions"]),
                   d["wall_s"], d["timing_s"], d.get("invocations", INVOCATIONS))  # fmt: skip


def abba(rounds: int) -> list[tuple[Side, int]]:
    """Replay order: A B B A, then B A A B, ...; each pair of gating draws feeds both sides, so
    linear clock drift and routing noise hit base and head alike."""
    out: list[tuple[Side, int]] = []
    for r in range(rounds):
        ab: tuple[Side, Side] = ("base", "head") if r % 2 == 0 else ("head", "base")
        a, b = ab
        out += [(a, 2 * r), (b, 2 * r), (b, 2 * r + 1), (a, 2 * r + 1)]
    return out


def plan_rounds(replay_s: float, budget_s: float, min_rounds: int, max_rounds: int) -> int:
    """ABBA rounds (4 replays each) that fit ``budget_s``, clamped to [min, max]."""
    fit = int(budget_s / (4 * replay_s) + 1e-9) if replay_s > 0 else max_rounds
    return max(min_rounds, min(max_rounds, fit))


def quantize_fp8(w: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert (per-tensor) fp8 weights and their float32 scales, as vLLM's fp8 MoE keeps
    them (one scale per expert: the kernel's ``b_scale_ptr + off_experts``)."""
    import torch

    scale = w.abs().amax(dim=(1, 2)).float().clamp(min=1e-12) / torch.finfo(fp8).max
    q = torch.empty(w.shape, dtype=fp8, device=w.device)
    for e in range(w.shape[0]):  # one expert at a time: no fp32 copy of the whole tensor
        q[e] = (w[e].float() / scale[e]).to(fp8)
    return q, scale


def reference_moe(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y = sum_j w_j W2[e_j] (silu(g) * u) with [g; u] = W1[e_j] x: fused_experts with its
    default activation (silu_and_mul: the first N rows of W1 are the gate). Weights are
    dequantised (w * scale), activations unquantised; fp64 by default, so no TF32 question."""
    import torch

    dt = torch.float64 if dtype is None else dtype
    n = w2.shape[2]
    xf = x.to(dt)
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=dt, device=x.device)
    ids = topk_ids.long()
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        a = w1[e].float().to(dt) * (1.0 if w1_scale is None else w1_scale[e].to(dt))
        b = w2[e].float().to(dt) * (1.0 if w2_scale is None else w2_scale[e].to(dt))
        h = xf[tok] @ a.T
        y = (torch.nn.functional.silu(h[:, :n]) * h[:, n:]) @ b.T
        out.index_add_(0, tok, y * topk_weights[tok, slot].to(dt)[:, None])
    return out


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref|| (Frobenius, fp64); inf for a non-finite output."""
    import torch

    num = float(torch.linalg.vector_norm(y.double() - ref.double()))
    den = float(torch.linalg.vector_norm(ref.double()))
    if num != num or (den == 0 and num > 0):  # NaN output: a failure, not an input error
        return float("inf")
    return num / den if den else 0.0


def run_ab(
    base: Mapping[str, Any],
    head: Mapping[str, Any],
    shape: MoeShape,
    *,
    workload_ms: Iterable[int] = (),
    budget_s: float = 40.0,
    min_rounds: int = 8,
    max_rounds: int = 50,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> BenchResult:
    """Time and check every M of ``m_values(base, head, workload_ms)``; ``budget_s`` bounds the
    timed loops (shared out over the Ms still to do; compile and capture come on top)."""
    if not 1 <= min_rounds <= max_rounds:
        why, fix = "need 1 <= min_rounds <= max_rounds", "use e.g. 8 and 50"
        raise UsageError("run_ab", "rounds", (min_rounds, max_rounds), why, fix)
    if reason := skip_reason():
        raise UsageError("run_ab", "this machine", reason, "cannot time kernels", "use a GPU")
    import torch

    api = resolve()
    t0 = time.perf_counter()
    ms = m_values(base, head, workload_ms)
    tiles = {m: (tiling(base, m, source="base"), tiling(head, m, source="head")) for m in ms}
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    e, n, k, bf16 = shape.experts, shape.n, shape.k, torch.bfloat16
    w1 = torch.randn(e, 2 * n, k, dtype=bf16, device=dev, generator=gen)
    w2 = torch.randn(e, k, n, dtype=bf16, device=dev, generator=gen)
    s1: torch.Tensor | None = None
    s2: torch.Tensor | None = None
    qc: Any = None  # None: fused_experts' own unquantised config
    if shape.dtype == "fp8_w8a8":
        fp8 = api["current_platform"].fp8_dtype()
        (w1, s1), (w2, s2) = quantize_fp8(w1, fp8), quantize_fp8(w2, fp8)
        qc = api["fp8_w8a8_moe_quant_config"](
            w1_scale=s1, w2_scale=s2, a1_scale=None, a2_scale=None,
            per_act_token_quant=False, block_shape=None,
        )  # fmt: skip  # per-tensor weight scales, dynamic per-tensor activation quant
    x_all = torch.randn(max(ms), k, dtype=bf16, device=dev, generator=gen)
    left, timing, rows = float(budget_s), 0.0, []
    for i, m in enumerate(ms):
        x = x_all[: check_m(m)]
        draws = 2 * max(max_rounds, WARMUP_ROUNDS)
        gating = torch.randn(draws, m, e, dtype=torch.float32, device=dev, generator=gen)
        row, spent = _one_m(api, m, tiles[m], x, (w1, w2, s1, s2, qc), gating, shape,
                            left / (len(ms) - i), min_rounds, max_rounds)  # fmt: skip
        left, timing = max(0.0, left - spent), timing + spent
        rows.append(row)
        if log:
            b, h = row.base_us, row.head_us
            log(f"M={m}: base {sum(b) / len(b):.1f} µs, head {sum(h) / len(h):.1f} µs "
                f"(n={len(b)}/{len(h)}{', same tiling' if row.same_tiling else ''}); "
                f"rel. error {row.base_error:.2e} / {row.head_error:.2e}")  # fmt: skip
    versions = {name: str(importlib.import_module(name).__version__)
                for name in ("torch", "vllm", "triton")}  # fmt: skip
    return BenchResult(shape, tuple(rows), torch.cuda.get_device_name(dev), versions,
                       time.perf_counter() - t0, timing)  # fmt: skip


def _one_m(
    api: Mapping[str, Any],
    m: int,
    tiles: tuple[dict[str, Any], dict[str, Any]],
    x: torch.Tensor,
    weights: tuple[Any, ...],
    gating: torch.Tensor,
    shape: MoeShape,
    budget_s: float,
    min_rounds: int,
    max_rounds: int,
) -> tuple[MResult, float]:
    """benchmark_config for both tilings at one M, replays interleaved ABBA."""
    import torch

    w1, w2, s1, s2, qc = weights
    by_side: dict[Side, dict[str, Any]] = {"base": tiles[0], "head": tiles[1]}
    same = tiles[0] == tiles[1]
    sides: list[Side] = ["base"] if same else ["base", "head"]
    g_in = gating[0].clone()

    def run(cfg: dict[str, Any]) -> torch.Tensor:
        with api["override_config"](cfg):
            tw, ti, _ = api["fused_topk"](x, g_in, shape.topk, renormalize=True)
            out: torch.Tensor = api["fused_experts"](x, w1, w2, tw, ti, quant_config=qc)
            return out

    # Numerics on the inputs of the first replay; run() here is also benchmark_config's eager
    # JIT warm-up before capture (fused_topk is deterministic: the reference sees its routing).
    tw, ti, _ = api["fused_topk"](x, g_in, shape.topk, renormalize=True)
    ref = reference_moe(x, w1, w2, tw, ti, s1, s2)
    err: dict[Side, float] = {side: rel_error(run(by_side[side]), ref) for side in sides}
    err.setdefault("head", err["base"])
    del ref
    torch.cuda.synchronize()
    graphs: dict[Side, torch.cuda.CUDAGraph] = {}
    for side in sides:
        graphs[side] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[side]):
            for _ in range(INVOCATIONS):
                run(by_side[side])
    graphs.setdefault("head", graphs["base"])
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def replay(side: Side, idx: int) -> float:
        g_in.copy_(gating[idx])
        torch.cuda.synchronize()
        start.record()
        graphs[side].replay()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1000.0 / INVOCATIONS  # µs per invocation

    warm = [replay(s, i) for s, i in abba(WARMUP_ROUNDS)]
    per_replay = sum(warm) / len(warm) * INVOCATIONS / 1e6 + REPLAY_OVERHEAD_S
    rounds = plan_rounds(per_replay, budget_s, min_rounds, max_rounds)
    got: dict[Side, list[float]] = {"base": [], "head": []}
    t = time.perf_counter()
    for side, idx in abba(rounds):
        got[side].append(replay(side, idx))
    spent = time.perf_counter() - t
    for side in sides:
        graphs[side].reset()
    torch.cuda.empty_cache()
    row = MResult(m, tuple(got["base"]), tuple(got["head"]), same, err["base"], err["head"])
    return row, spent
