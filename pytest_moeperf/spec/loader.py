"""YAML -> ``Spec``, with one precise error per bad spec.

Every error names the dotted field, the value, the file *and line* and the fix, because a spec is
edited by hand and read back from a CI log. Lines come from ``yaml.compose`` node marks.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_moeperf.errors import UsageError
from pytest_moeperf.spec._fields import FieldCtx, FieldPath, line_index
from pytest_moeperf.spec._yaml import compose_and_load
from pytest_moeperf.spec.model import (
    DEFAULT_COOLDOWN_FRACTION,
    DEFAULT_WARMUP_FRACTION,
    DERIVED_FLAGS,
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

if TYPE_CHECKING:
    from pytest_moeperf.spec import schema

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


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
    """Types and ranges from the schema (``spec.schema``), then the rules across fields."""
    from pytest_moeperf.spec import schema

    top = schema.validate(data, ctx)
    if not _NAME_RE.match(top.name):
        ctx.fail(("name",), top.name, "has characters unsafe in file names", "use [A-Za-z0-9._-]")
    model = ModelSpec(**top.model.model_dump())
    parallelism = _parallelism(ctx, top.parallelism)
    engine_args = _engine_args(ctx, {} if top.engine_args is None else top.engine_args)
    workload = _workload(ctx, top.workload, model, base)
    arrival = _arrival(ctx, top.arrival, top.search is not None)
    slo = Slo(**top.slo.model_dump())
    search = None
    if top.search is not None:
        search = _search(ctx, top.search, slo)
        if workload.trace == "replay":
            ctx.fail(
                ("search",), "replay", "a replay trace keeps its own arrival times",
                "remove `search` or use trace chat-mix-v1 / fixed",
            )  # fmt: skip
    return Spec(
        name=top.name, model=model, workload=workload, slo=slo, engine_args=engine_args,
        parallelism=parallelism, arrival=arrival, search=search, window=_window(ctx, top.window),
        runs=top.runs, source=ctx.source, base_dir=base,
    )  # fmt: skip


def _parallelism(ctx: FieldCtx, m: schema.ParallelismIn) -> ParallelismSpec:
    if m.ray_address is not None and m.distributed_executor_backend != "ray":
        ctx.fail(("parallelism", "ray_address"), m.ray_address,
                 "a Ray address needs vLLM's Ray executor",
                 "add `distributed_executor_backend: ray` to parallelism")  # fmt: skip
    return ParallelismSpec(**m.model_dump())


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


def _workload(ctx: FieldCtx, m: schema.WorkloadIn, model: ModelSpec, base: Path) -> WorkloadSpec:
    p: FieldPath = ("workload",)
    if m.num_requests is None and m.trace != "replay":
        ctx.missing((*p, "num_requests"))
    digest = resolved = None
    if m.trace == "fixed":
        if m.input_tokens is None or m.output_tokens is None:
            ctx.missing((*p, "input_tokens" if m.input_tokens is None else "output_tokens"))
        from pytest_moeperf.spec.traces import scaled_length

        eff_in = scaled_length(m.input_tokens, m.scale, m.max_input_tokens)
        eff_out = scaled_length(m.output_tokens, m.scale, m.max_output_tokens)
        if eff_in + eff_out > model.max_model_len:
            ctx.fail(
                (*p, "input_tokens"), m.input_tokens,
                f"input + output = {eff_in} + {eff_out} tokens exceeds model.max_model_len "
                f"({model.max_model_len})",
                "lower input_tokens / output_tokens / scale or raise model.max_model_len",
            )  # fmt: skip
    elif m.trace == "replay":
        if m.path is None:
            ctx.missing((*p, "path"))
        resolved = Path(m.path).expanduser()
        if not resolved.is_absolute():
            resolved = (base / resolved).resolve()
        try:
            digest = hashlib.sha256(resolved.read_bytes()).hexdigest()
        except OSError as exc:
            ctx.fail(
                (*p, "path"), m.path, f"cannot read {resolved} ({exc.strerror})",
                "give a JSONL trace path relative to the spec file",
            )  # fmt: skip
        from pytest_moeperf.spec.traces import read_replay

        n_lines = len(read_replay(resolved))
        if m.num_requests is not None and m.num_requests > n_lines:
            ctx.fail(
                (*p, "num_requests"), m.num_requests, f"the trace has only {n_lines} requests",
                f"use num_requests <= {n_lines} or omit it to replay the whole trace",
            )  # fmt: skip
    return WorkloadSpec(**m.model_dump(), trace_sha256=digest, resolved_path=resolved)


def _arrival(ctx: FieldCtx, m: schema.ArrivalIn, has_search: bool) -> ArrivalSpec:
    p: FieldPath = ("arrival",)
    if m.process == "poisson":
        if m.rate is None and not has_search:
            ctx.missing((*p, "rate"))
        return ArrivalSpec(process="poisson", rate=m.rate, burstiness=m.burstiness)
    if has_search:
        ctx.fail(
            (*p, "process"), m.process, "the SLO search varies a Poisson rate",
            "set `process: poisson` or remove `search`",
        )  # fmt: skip
    if m.concurrency is None:
        ctx.missing((*p, "concurrency"))
    return ArrivalSpec(process="concurrency", concurrency=m.concurrency, burstiness=m.burstiness)


def _search(ctx: FieldCtx, m: schema.SearchIn, slo: Slo) -> SearchSpec:
    p: FieldPath = ("search",)
    if m.rate_max is not None and m.rate_max <= m.rate_min:
        fix = f"use rate_max > rate_min ({m.rate_min:g}) or omit it"
        ctx.fail((*p, "rate_max"), m.rate_max, "must be above rate_min", fix)
    # drain_s is at least the TTFT SLO, so that a request cut without a first token has surely
    # missed it
    ttft = slo.ttft_p99_ms / 1e3
    if m.drain_s is not None and m.drain_s < ttft:
        ctx.fail((*p, "drain_s"), m.drain_s, f"is below the TTFT SLO ({ttft:g} s)",
                 f"use drain_s >= {ttft:g} or omit it (wait for every request)")  # fmt: skip
    return SearchSpec(**m.model_dump())


def _window(ctx: FieldCtx, m: schema.WindowIn) -> WindowSpec:
    p: FieldPath = ("window",)
    if m.warmup_s is not None and m.warmup_fraction is not None:
        fix = "keep one of the two"
        ctx.fail((*p, "warmup_fraction"), m.warmup_fraction, "exclusive with warmup_s", fix)
    wf = m.warmup_fraction
    if wf is None and m.warmup_s is None:
        wf = DEFAULT_WARMUP_FRACTION
    cf = DEFAULT_COOLDOWN_FRACTION if m.cooldown_fraction is None else m.cooldown_fraction
    if (wf or 0.0) + cf >= 1.0:
        fix = "keep warmup_fraction + cooldown_fraction below 1 (e.g. 0.1 + 0.1)"
        ctx.fail((*p, "cooldown_fraction"), cf, "the window would be empty", fix)
    return WindowSpec(warmup_s=m.warmup_s, warmup_fraction=wf, cooldown_fraction=cf)
