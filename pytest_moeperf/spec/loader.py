"""YAML -> ``Spec``, with one precise error per bad spec.

Every error names the dotted field, the value, the file *and line* and the fix, because a spec is
edited by hand and read back from a CI log. Lines come from ``yaml.compose`` node marks.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.spec._fields import MISSING, FieldCtx, FieldPath, line_index
from pytest_moeperf.spec._yaml import compose_and_load
from pytest_moeperf.spec.model import (
    DEFAULT_COOLDOWN_FRACTION,
    DEFAULT_WARMUP_FRACTION,
    DERIVED_FLAGS,
    EXECUTOR_BACKENDS,
    ArrivalSpec,
    EngineArgValue,
    ModelSpec,
    ParallelismSpec,
    ScalarArg,
    SearchSpec,
    Slo,
    Spec,
    WindowSpec,
    WorkloadSpec,
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

TOP_FIELDS = (
    "name", "model", "engine_args", "parallelism", "workload", "arrival", "slo", "search",
    "window", "runs",
)  # fmt: skip
MODEL_FIELDS = (
    "path",
    "served_name",
    "dtype",
    "max_model_len",
    "load_format",
    "tokenizer",
    "prefix_caching",
)
PARALLEL_FIELDS = (
    "tensor", "data", "pipeline", "expert", "distributed_executor_backend", "ray_address",
)  # fmt: skip
WORKLOAD_FIELDS = (
    "trace", "num_requests", "seed", "input_tokens", "output_tokens", "path", "scale",
    "max_input_tokens", "max_output_tokens",
)  # fmt: skip
ARRIVAL_FIELDS = ("process", "rate", "concurrency", "burstiness")
SLO_FIELDS = ("ttft_p99_ms", "tpot_p99_ms", "e2el_p99_ms")
SEARCH_FIELDS = (
    "rate_min", "rate_max", "tolerance", "max_probes", "probe_requests", "probe_duration_s",
    "warm_start", "drain_s",
)  # fmt: skip
WINDOW_FIELDS = ("warmup_s", "warmup_fraction", "cooldown_fraction")
TRACES = ("chat-mix-v1", "fixed", "replay")
PROCESSES = ("poisson", "concurrency")


def load_spec(path: Path) -> Spec:
    """Read and validate a spec file; relative paths inside it are relative to its folder."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            str(path), "spec file", str(path), f"cannot be read ({exc.strerror})", "check the path"
        ) from exc
    except UnicodeDecodeError as exc:
        raise UsageError(str(path), "spec file", str(path),
                         f"is not UTF-8 text (byte {exc.start}: {exc.reason})",
                         "save the spec as UTF-8") from None  # fmt: skip
    return load_spec_text(text, str(path), base_dir=path.parent.resolve())


def load_spec_text(text: str, source: str = "<string>", *, base_dir: Path | None = None) -> Spec:
    """Validate spec text; ``source`` names it in errors, ``base_dir`` anchors relative paths."""
    root, data = compose_and_load(text, source)  # bounded: no alias bomb gets past it
    lines: dict[FieldPath, int] = {}
    if root is not None:
        line_index(root, (), lines, source)
    ctx = FieldCtx(source, lines)
    base = base_dir if base_dir is not None else Path.cwd()
    return _build(ctx, data, base)


def _build(ctx: FieldCtx, data: object, base: Path) -> Spec:
    top = ctx.mapping(data, (), TOP_FIELDS)
    name = ctx.str_(top, (), "name")
    if not _NAME_RE.match(name):
        ctx.fail(("name",), name, "has characters unsafe in file names", "use [A-Za-z0-9._-]")
    model = _model(ctx, ctx.mapping(ctx.get(top, (), "model", MISSING), ("model",), MODEL_FIELDS))
    par_raw = ctx.mapping(ctx.get(top, (), "parallelism", {}), ("parallelism",), PARALLEL_FIELDS)
    parallelism = _parallelism(ctx, par_raw)
    engine_args = _engine_args(ctx, ctx.get(top, (), "engine_args", {}))
    has_search = top.get("search") is not None
    wl_raw = ctx.mapping(ctx.get(top, (), "workload", MISSING), ("workload",), WORKLOAD_FIELDS)
    workload = _workload(ctx, wl_raw, model, base)
    arr_raw = ctx.mapping(ctx.get(top, (), "arrival", {}), ("arrival",), ARRIVAL_FIELDS)
    arrival = _arrival(ctx, arr_raw, has_search)
    slo = _slo(ctx, ctx.mapping(ctx.get(top, (), "slo", MISSING), ("slo",), SLO_FIELDS))
    search = None
    if has_search:
        search = _search(ctx, ctx.mapping(top["search"], ("search",), SEARCH_FIELDS), slo)
        if workload.trace == "replay":
            ctx.fail(
                ("search",), "replay", "a replay trace keeps its own arrival times",
                "remove `search` or use trace chat-mix-v1 / fixed",
            )  # fmt: skip
    window = _window(ctx, ctx.mapping(ctx.get(top, (), "window", {}), ("window",), WINDOW_FIELDS))
    runs = ctx.int_(top, (), "runs", 3)
    return Spec(
        name=name, model=model, workload=workload, slo=slo, engine_args=engine_args,
        parallelism=parallelism, arrival=arrival, search=search, window=window, runs=runs,
        source=ctx.source, base_dir=base,
    )  # fmt: skip


def _model(ctx: FieldCtx, m: dict[str, Any]) -> ModelSpec:
    p: FieldPath = ("model",)
    return ModelSpec(
        path=ctx.str_(m, p, "path"),
        max_model_len=ctx.int_(m, p, "max_model_len", minimum=2),
        served_name=ctx.str_(m, p, "served_name", None),
        dtype=ctx.str_(m, p, "dtype", "bfloat16"),
        load_format=ctx.str_(m, p, "load_format", None),
        tokenizer=ctx.str_(m, p, "tokenizer", None),
        prefix_caching=_prefix_caching(ctx, m),
    )


WARM_FIX = "write `warm_start: true` to begin each probe with the steady-state population"


def _prefix_caching(ctx: FieldCtx, m: dict[str, Any]) -> bool | None:
    """``true``/``false``, or absent (vLLM's default, which is on): the hit rate is recorded."""
    value: bool | None = ctx.bool_(m, ("model",), "prefix_caching", None,
                                   "write `prefix_caching: false` to measure every prompt's "
                                   "prefill")  # fmt: skip
    return value


def _parallelism(ctx: FieldCtx, m: dict[str, Any]) -> ParallelismSpec:
    p: FieldPath = ("parallelism",)
    expert = ctx.bool_(m, p, "expert", False, "write `expert: true`")
    backend = ctx.choice(m, p, "distributed_executor_backend", EXECUTOR_BACKENDS, None)
    address = ctx.str_(m, p, "ray_address", None)
    if address is not None and backend != "ray":
        ctx.fail((*p, "ray_address"), address, "a Ray address needs vLLM's Ray executor",
                 "add `distributed_executor_backend: ray` to parallelism")  # fmt: skip
    return ParallelismSpec(
        tensor=ctx.int_(m, p, "tensor", 1),
        data=ctx.int_(m, p, "data", 1),
        pipeline=ctx.int_(m, p, "pipeline", 1),
        expert=expert,
        distributed_executor_backend=backend,
        ray_address=address,
    )


def _engine_args(ctx: FieldCtx, raw: object) -> tuple[tuple[str, EngineArgValue], ...]:
    p: FieldPath = ("engine_args",)
    if not isinstance(raw, dict):
        ctx.fail(p, raw, "must be a mapping of vLLM flags", "write e.g. `max-num-seqs: 64`")
    out: dict[str, EngineArgValue] = {}
    for key, value in raw.items():
        kp = (*p, str(key))
        if not isinstance(key, str) or not _FLAG_RE.match(key):
            fix = f"write `{str(key).lstrip('-')}:`" if str(key).startswith("-") else "use a-z0-9-"
            ctx.fail(kp, key, "is not a vLLM flag name (no leading --)", fix)
        flag = key.replace("_", "-")
        if flag in DERIVED_FLAGS:
            ctx.fail(kp, value, "is set from the spec", f"set `{DERIVED_FLAGS[flag]}` instead")
        if flag in out:
            ctx.fail(kp, key, "flag given twice (- and _ spellings)", "keep one spelling")
        if isinstance(value, list):
            if not value:
                ctx.fail(kp, value, "empty list", "remove the flag or give at least one value")
            out[flag] = tuple(_arg_scalar(ctx, (*kp, str(i)), v) for i, v in enumerate(value))
        elif isinstance(value, dict):
            out[flag] = json.dumps(value, sort_keys=True, separators=(",", ":"))
        else:
            out[flag] = _arg_scalar(ctx, kp, value)
    return tuple(sorted(out.items()))


def _arg_scalar(ctx: FieldCtx, path: FieldPath, value: object) -> ScalarArg:
    if isinstance(value, bool | int | float | str):
        return value
    fix = "give a string, number, true/false, a list of those, or a mapping (sent as JSON)"
    ctx.fail(path, value, "unsupported value", fix)


def _workload(ctx: FieldCtx, m: dict[str, Any], model: ModelSpec, base: Path) -> WorkloadSpec:
    p: FieldPath = ("workload",)
    trace = ctx.choice(m, p, "trace", TRACES, MISSING)
    for key, only in (("input_tokens", "fixed"), ("output_tokens", "fixed"), ("path", "replay")):
        if key in m and trace != only:
            ctx.fail((*p, key), m[key], f"only used by trace `{only}`", f"remove `{key}`")
    n_default = None if trace == "replay" else MISSING
    num_requests = ctx.int_(m, p, "num_requests", n_default)
    scale = ctx.num(m, p, "scale", 1.0)
    max_in = ctx.int_(m, p, "max_input_tokens", None)
    max_out = ctx.int_(m, p, "max_output_tokens", None)
    inp = out = None
    path = digest = resolved = None
    if trace == "fixed":
        inp, out = ctx.int_(m, p, "input_tokens"), ctx.int_(m, p, "output_tokens")
        from pytest_moeperf.spec.traces import scaled_length

        eff_in, eff_out = scaled_length(inp, scale, max_in), scaled_length(out, scale, max_out)
        if eff_in + eff_out > model.max_model_len:
            ctx.fail(
                (*p, "input_tokens"), inp,
                f"input + output = {eff_in} + {eff_out} tokens exceeds model.max_model_len "
                f"({model.max_model_len})",
                "lower input_tokens / output_tokens / scale or raise model.max_model_len",
            )  # fmt: skip
    elif trace == "replay":
        path = ctx.str_(m, p, "path")
        resolved = Path(path).expanduser()
        if not resolved.is_absolute():
            resolved = (base / resolved).resolve()
        try:
            digest = hashlib.sha256(resolved.read_bytes()).hexdigest()
        except OSError as exc:
            ctx.fail(
                (*p, "path"), path, f"cannot read {resolved} ({exc.strerror})",
                "give a JSONL trace path relative to the spec file",
            )  # fmt: skip
        from pytest_moeperf.spec.traces import read_replay

        n_lines = len(read_replay(resolved))
        if num_requests is not None and num_requests > n_lines:
            ctx.fail(
                (*p, "num_requests"), num_requests, f"the trace has only {n_lines} requests",
                f"use num_requests <= {n_lines} or omit it to replay the whole trace",
            )  # fmt: skip
    return WorkloadSpec(
        trace=trace, num_requests=num_requests, seed=ctx.int_(m, p, "seed", 0, minimum=0),
        input_tokens=inp, output_tokens=out, path=path, scale=scale, max_input_tokens=max_in,
        max_output_tokens=max_out, trace_sha256=digest, resolved_path=resolved,
    )  # fmt: skip


def _arrival(ctx: FieldCtx, m: dict[str, Any], has_search: bool) -> ArrivalSpec:
    p: FieldPath = ("arrival",)
    process = ctx.choice(m, p, "process", PROCESSES, "poisson")
    burstiness = ctx.num(m, p, "burstiness", 1.0)
    if process == "poisson":
        if "concurrency" in m:
            fix = "remove it or set `process: concurrency`"
            ctx.fail((*p, "concurrency"), m["concurrency"], "not used by process poisson", fix)
        rate = ctx.num(m, p, "rate", None if has_search else MISSING)
        return ArrivalSpec(process="poisson", rate=rate, burstiness=burstiness)
    if "rate" in m:
        fix = "remove it or set `process: poisson`"
        ctx.fail((*p, "rate"), m["rate"], "not used by process concurrency", fix)
    if has_search:
        ctx.fail(
            (*p, "process"), process, "the SLO search varies a Poisson rate",
            "set `process: poisson` or remove `search`",
        )  # fmt: skip
    concurrency = ctx.int_(m, p, "concurrency")
    return ArrivalSpec(process="concurrency", concurrency=concurrency, burstiness=burstiness)


def _slo(ctx: FieldCtx, m: dict[str, Any]) -> Slo:
    p: FieldPath = ("slo",)
    return Slo(
        ttft_p99_ms=ctx.num(m, p, "ttft_p99_ms"),
        tpot_p99_ms=ctx.num(m, p, "tpot_p99_ms"),
        e2el_p99_ms=ctx.num(m, p, "e2el_p99_ms", None),
    )


def _search(ctx: FieldCtx, m: dict[str, Any], slo: Slo) -> SearchSpec:
    p: FieldPath = ("search",)
    rate_min = ctx.num(m, p, "rate_min")
    rate_max = ctx.num(m, p, "rate_max", None)
    if rate_max is not None and rate_max <= rate_min:
        fix = f"use rate_max > rate_min ({rate_min:g}) or omit it"
        ctx.fail((*p, "rate_max"), rate_max, "must be above rate_min", fix)
    return SearchSpec(
        rate_min=rate_min,
        rate_max=rate_max,
        tolerance=ctx.num(m, p, "tolerance", 0.02, high=0.5),
        max_probes=ctx.int_(m, p, "max_probes", 7, minimum=2),
        probe_requests=ctx.int_(m, p, "probe_requests", None),
        probe_duration_s=ctx.num(m, p, "probe_duration_s", None),
        warm_start=ctx.bool_(m, p, "warm_start", False, WARM_FIX),
        drain_s=_drain(ctx, m, p, slo),
    )


def _drain(ctx: FieldCtx, m: dict[str, Any], p: FieldPath, slo: Slo) -> float | None:
    """``search.drain_s``: at least the TTFT SLO, so that a request cut without a first token
    has surely missed it."""
    drain: float | None = ctx.num(m, p, "drain_s", None)
    ttft = slo.ttft_p99_ms / 1e3
    if drain is not None and drain < ttft:
        ctx.fail((*p, "drain_s"), drain, f"is below the TTFT SLO ({ttft:g} s)",
                 f"use drain_s >= {ttft:g} or omit it (wait for every request)")  # fmt: skip
    return drain


def _window(ctx: FieldCtx, m: dict[str, Any]) -> WindowSpec:
    p: FieldPath = ("window",)
    if "warmup_s" in m and "warmup_fraction" in m:
        fix = "keep one of the two"
        ctx.fail((*p, "warmup_fraction"), m["warmup_fraction"], "exclusive with warmup_s", fix)
    warmup_s = ctx.num(m, p, "warmup_s", None, low_inclusive=True)
    wf_default = None if warmup_s is not None else DEFAULT_WARMUP_FRACTION
    wf = ctx.num(m, p, "warmup_fraction", wf_default, low_inclusive=True, high=1.0)
    cf = ctx.num(m, p, "cooldown_fraction", DEFAULT_COOLDOWN_FRACTION, low_inclusive=True, high=1.0)
    if (wf or 0.0) + cf >= 1.0:
        fix = "keep warmup_fraction + cooldown_fraction below 1 (e.g. 0.1 + 0.1)"
        ctx.fail((*p, "cooldown_fraction"), cf, "the window would be empty", fix)
    return WindowSpec(warmup_s=warmup_s, warmup_fraction=wf, cooldown_fraction=cf)
