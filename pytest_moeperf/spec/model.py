"""A workload spec as frozen dataclasses: what to serve, what traffic to send, what SLO to meet.

The spec is the unit a baseline is keyed on, so it is immutable, has a canonical dict form and a
stable content hash. Paths stay exactly as written (relative to the spec file) so the hash does
not change from one checkout to another; ``Spec.base_dir`` resolves them at run time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

TraceKind = Literal["chat-mix-v1", "fixed", "replay"]
ArrivalProcess = Literal["poisson", "concurrency"]
ScalarArg = str | int | float | bool
EngineArgValue = ScalarArg | tuple[ScalarArg, ...]

#: Default window when a spec has no ``window`` section: drop the first and last tenth.
DEFAULT_WARMUP_FRACTION = 0.1
DEFAULT_COOLDOWN_FRACTION = 0.1

#: vLLM flags the spec derives from ``model`` / ``parallelism``; engine_args may not set them.
DERIVED_FLAGS: dict[str, str] = {
    "tensor-parallel-size": "parallelism.tensor",
    "data-parallel-size": "parallelism.data",
    "pipeline-parallel-size": "parallelism.pipeline",
    "enable-expert-parallel": "parallelism.expert",
    "distributed-executor-backend": "parallelism.distributed_executor_backend",
    "dtype": "model.dtype",
    "max-model-len": "model.max_model_len",
    "load-format": "model.load_format",
    "served-model-name": "model.served_name",
    "tokenizer": "model.tokenizer",
    "enable-prefix-caching": "model.prefix_caching",
    "no-enable-prefix-caching": "model.prefix_caching",
    "model": "model.path",
}


def is_named_model(path: str) -> bool:
    """A bare name ("embedded", "qwen3-30b-a3b-shape") is resolved by the plugin, not the disk."""
    return "/" not in path and "\\" not in path and not path.startswith((".", "~"))


@dataclass(frozen=True)
class ModelSpec:
    path: str
    max_model_len: int
    served_name: str | None = None
    dtype: str = "bfloat16"
    load_format: str | None = None
    tokenizer: str | None = None
    #: vLLM's automatic prefix caching: True/False sets it; None leaves vLLM's default (on).
    #: Repeated prompt prefixes are served from cache, so a run that hits it measures mostly
    #: decode: the hit rate of every probe is recorded either way.
    prefix_caching: bool | None = None


@dataclass(frozen=True)
class ParallelismSpec:
    """vLLM's own parallel settings; the server uses ``gpus`` = tensor x pipeline x data GPUs.

    ``ray_address`` says where the Ray cluster is (``RAY_ADDRESS`` of the server); it is where,
    not what, so like a path it stays out of the spec hash.
    """

    tensor: int = 1
    data: int = 1
    pipeline: int = 1
    expert: bool = False
    distributed_executor_backend: str | None = None
    ray_address: str | None = field(default=None, compare=False)

    @property
    def gpus(self) -> int:
        """GPUs of one server (vLLM's world size across data parallel ranks)."""
        return self.tensor * self.pipeline * self.data

    @property
    def local_gpus(self) -> int:
        """GPUs to lease on this node: none when a Ray cluster places the workers."""
        return 0 if self.ray_address else self.gpus

    def server_env(self) -> dict[str, str]:
        """Environment of the server process: ``RAY_ADDRESS`` for vLLM's ``ray.init()``."""
        return {"RAY_ADDRESS": self.ray_address} if self.ray_address else {}

    def canonical(self) -> dict[str, Any]:
        """Hashed content: unset new fields are left out so older specs keep their hash."""
        d = asdict(self)
        d.pop("ray_address")
        if d["distributed_executor_backend"] is None:
            d.pop("distributed_executor_backend")
        return d


@dataclass(frozen=True)
class WorkloadSpec:
    """Request lengths and count. ``resolved_path`` is where a replay trace lies on this disk."""

    trace: TraceKind
    num_requests: int | None
    seed: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    path: str | None = None
    scale: float = 1.0
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    trace_sha256: str | None = None
    resolved_path: Path | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ArrivalSpec:
    process: ArrivalProcess = "poisson"
    rate: float | None = None
    concurrency: int | None = None
    burstiness: float = 1.0


@dataclass(frozen=True)
class Slo:
    """p99 targets in milliseconds; a run meets the SLO when every given p99 is at or below it."""

    ttft_p99_ms: float
    tpot_p99_ms: float
    e2el_p99_ms: float | None = None


@dataclass(frozen=True)
class SearchSpec:
    rate_min: float
    rate_max: float | None = None
    tolerance: float = 0.02
    max_probes: int = 7
    probe_requests: int | None = None
    probe_duration_s: float | None = None
    #: begin each probe with the steady-state population (``load.warmstart``)
    warm_start: bool = False
    #: seconds after its last send a probe waits for its requests; the rest are cut
    drain_s: float | None = None


@dataclass(frozen=True)
class WindowSpec:
    """Steady-state window: ramp-up (warmup) and drain (cooldown) are cut off before summarizing."""

    warmup_s: float | None = None
    warmup_fraction: float | None = DEFAULT_WARMUP_FRACTION
    cooldown_fraction: float = DEFAULT_COOLDOWN_FRACTION

    def resolve(self, send_span_s: float) -> tuple[float, float]:
        """(warmup_s, cooldown_s) for a run whose sends span ``send_span_s`` seconds."""
        if self.warmup_s is not None:
            warmup = self.warmup_s
        else:
            warmup = (self.warmup_fraction or 0.0) * send_span_s
        return warmup, self.cooldown_fraction * send_span_s


@dataclass(frozen=True)
class Spec:
    name: str
    model: ModelSpec
    workload: WorkloadSpec
    slo: Slo
    engine_args: tuple[tuple[str, EngineArgValue], ...] = ()
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    search: SearchSpec | None = None
    window: WindowSpec = field(default_factory=WindowSpec)
    runs: int = 3
    source: str = field(default="<string>", compare=False)
    base_dir: Path = field(default_factory=Path.cwd, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Canonical content: every default filled in, no machine-specific paths."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("source", "base_dir"):
                continue
            value = getattr(self, f.name)
            if f.name == "engine_args":
                out[f.name] = {k: list(v) if isinstance(v, tuple) else v for k, v in value}
            elif value is None:
                out[f.name] = None
            elif isinstance(value, int | str):
                out[f.name] = value
            elif isinstance(value, ParallelismSpec):
                out[f.name] = value.canonical()
            elif isinstance(value, ModelSpec):
                out[f.name] = asdict(value)
                if value.prefix_caching is None:  # unset: older specs keep their hash
                    out[f.name].pop("prefix_caching")
            else:
                d = asdict(value)
                d.pop("resolved_path", None)
                if isinstance(value, SearchSpec):  # unset: older specs keep their hash
                    for key, unset in (("warm_start", False), ("drain_s", None)):
                        if d[key] == unset:
                            d.pop(key)
                out[f.name] = d
        return out

    def engine_arg(self, key: str) -> str | None:
        """The value ``engine_args`` gives vLLM flag ``key`` (without ``--``) as text, or None."""
        v = next((v for k, v in self.engine_args if k == key), None)
        return None if v is None else str(v)

    @property
    def max_num_seqs(self) -> int:
        """vLLM's cap on sequences in a batch: the spec's ``max-num-seqs``, else vLLM's 256."""
        v = self.engine_arg("max-num-seqs")
        return 256 if v is None else int(v)

    def hash(self) -> str:
        """sha256 of the canonical JSON; equal for specs that differ only in layout or defaults."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def resolve_path(self, path: str) -> Path:
        """A path from the spec, relative to the spec file's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def model_location(self) -> str:
        """The name ("embedded") or the absolute local folder to hand to ``vllm serve``."""
        if is_named_model(self.model.path):
            return self.model.path
        return str(self.resolve_path(self.model.path))

    def vllm_args(self) -> list[str]:
        """vLLM CLI flags for this spec, without the model itself (``vllm serve MODEL <flags>``)."""
        m, p = self.model, self.parallelism
        args: list[str] = []
        if m.served_name is not None:
            args += ["--served-model-name", m.served_name]
        args += ["--dtype", m.dtype, "--max-model-len", str(m.max_model_len)]
        if m.load_format is not None:
            args += ["--load-format", m.load_format]
        if m.prefix_caching is not None:
            args.append(
                "--enable-prefix-caching" if m.prefix_caching else "--no-enable-prefix-caching"
            )
        if m.tokenizer is not None:
            tok = m.tokenizer
            args += ["--tokenizer", tok if is_named_model(tok) else str(self.resolve_path(tok))]
        args += ["--tensor-parallel-size", str(p.tensor)]
        args += ["--data-parallel-size", str(p.data)]
        args += ["--pipeline-parallel-size", str(p.pipeline)]
        if p.expert:
            args.append("--enable-expert-parallel")
        if p.distributed_executor_backend is not None:
            args += ["--distributed-executor-backend", p.distributed_executor_backend]
        for key, value in self.engine_args:
            flag = "--" + key
            values = value if isinstance(value, tuple) else (value,)
            for v in values:
                if v is True:
                    args.append(flag)
                elif v is False:
                    continue
                else:
                    args += [flag, str(v)]
        return args
