"""The spec file's schema as pydantic models: each field's type, range, default, and which keys
a section knows. Unknown keys are refused (a typo must not silently fall back to a default).

pydantic finds every error; ``validate`` reports the first in the order the file is read (an
unknown key before a section's fields, sections top to bottom) in the project's one-line form:
file and line, the dotted field, the value and the fix, with the hints a hand-edited YAML file
needs (PyYAML reads ``1e3`` as a string; did you mean `workload`?). Rules across fields (a
trace's own fields, the window's sum, a search's rate range) are the loader's.
"""

from __future__ import annotations

import difflib
import json
from typing import Annotated, Any, Literal, NoReturn, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from pytest_moeperf.spec._fields import (
    YAML11,
    FieldCtx,
    FieldPath,
    yaml_spellings,
    yaml_string_number,
)

Text = Annotated[str, Field(pattern=r"\S")]
Count = Annotated[int, Field(ge=1)]
Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]


class _Section(BaseModel):
    """A mapping of the spec: strict types, no unknown keys, ``key: null`` read as absent (a
    true/false field excepted, where null is refused as before)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if v is not None or k not in fields or fields[k].annotation is bool}  # fmt: skip


class ModelIn(_Section):
    path: Text
    served_name: Text | None = None
    dtype: Text = "bfloat16"
    max_model_len: Annotated[int, Field(ge=2)]
    load_format: Text | None = None
    tokenizer: Text | None = None
    prefix_caching: bool | None = None


class ParallelismIn(_Section):
    tensor: Count = 1
    data: Count = 1
    pipeline: Count = 1
    expert: bool = False
    #: vLLM's own executors ("mp" on one node, "ray" for one node or a Ray cluster); the plugin
    #: never distributes anything itself
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    ray_address: Text | None = None


class WorkloadIn(_Section):
    trace: Literal["chat-mix-v1", "fixed", "replay"]
    num_requests: Count | None = None  # required but for a replay (the loader says so)
    seed: Annotated[int, Field(ge=0)] = 0
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    path: Text | None = None
    scale: Positive = 1.0
    max_input_tokens: Count | None = None
    max_output_tokens: Count | None = None


class ArrivalIn(_Section):
    process: Literal["poisson", "concurrency"] = "poisson"
    rate: Positive | None = None
    concurrency: Count | None = None
    burstiness: Positive = 1.0


class SloIn(_Section):
    ttft_p99_ms: Positive
    tpot_p99_ms: Positive
    e2el_p99_ms: Positive | None = None


class SearchIn(_Section):
    rate_min: Positive
    rate_max: Positive | None = None
    tolerance: Annotated[float, Field(gt=0, lt=0.5)] = 0.02
    max_probes: Annotated[int, Field(ge=2)] = 7
    probe_requests: Count | None = None
    probe_duration_s: Positive | None = None
    warm_start: bool = False
    drain_s: Positive | None = None


class WindowIn(_Section):
    warmup_s: Annotated[float, Field(ge=0)] | None = None
    warmup_fraction: Fraction | None = None
    cooldown_fraction: Fraction | None = None


class SpecIn(_Section):
    """The whole file. ``engine_args`` is free-form (vLLM's flags): the loader checks it."""

    name: Text
    model: ModelIn
    engine_args: Any = None
    parallelism: ParallelismIn = Field(default_factory=ParallelismIn)
    workload: WorkloadIn
    arrival: ArrivalIn = Field(default_factory=ArrivalIn)
    slo: SloIn
    search: SearchIn | None = None
    window: WindowIn = Field(default_factory=WindowIn)
    runs: Count = 3


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelIn, "parallelism": ParallelismIn, "workload": WorkloadIn,
    "arrival": ArrivalIn, "slo": SloIn, "search": SearchIn, "window": WindowIn,
}  # fmt: skip

#: The fix of a true/false field given something else.
BOOL_FIX = {
    "prefix_caching": "write `prefix_caching: false` to measure every prompt's prefill",
    "expert": "write `expert: true`",
    "warm_start": "write `warm_start: true` to begin each probe with the steady-state population",
}


def validate(data: object, ctx: FieldCtx) -> SpecIn:
    """The validated spec, or the first error (in reading order) raised in the one-line form."""
    if not isinstance(data, dict):
        ctx.fail((), data, "the spec must be a mapping", "write the spec as `key: value` lines")
    errors: list[Any] = _unused(data)
    try:
        spec = SpecIn.model_validate(data)
    except ValidationError as exc:
        errors += exc.errors()
    if errors:
        _raise(ctx, min(errors, key=_reading_order))
    return spec


#: Fields that only one trace (one arrival process) reads: (section, key) -> (selector, value).
ONLY_FOR = {("workload", "input_tokens"): ("trace", "fixed"),
            ("workload", "output_tokens"): ("trace", "fixed"),
            ("workload", "path"): ("trace", "replay"),
            ("arrival", "rate"): ("process", "poisson"),
            ("arrival", "concurrency"): ("process", "concurrency")}  # fmt: skip


def _unused(data: dict[Any, Any]) -> list[dict[str, Any]]:
    """Fields that this trace or arrival process does not read, whatever their value (null
    too): reported before their type, since the fix is to remove them, not to correct them."""
    out = []
    for (section, key), (selector, only) in ONLY_FOR.items():
        raw = data.get(section)
        if not isinstance(raw, dict) or key not in raw:
            continue
        field = SECTIONS[section].model_fields[selector]
        chosen = raw.get(selector) or (None if field.is_required() else field.default)
        if chosen != only and chosen in _choices(field):
            out.append({"type": "unused", "loc": (section, key), "input": raw[key],
                        "ctx": {"selector": selector, "chosen": chosen, "only": only}})  # fmt: skip
    return out


def _model_at(loc: tuple[Any, ...]) -> type[_Section]:
    return SECTIONS.get(str(loc[0]), SpecIn) if len(loc) > 1 else SpecIn


def _reading_order(err: Any) -> tuple[int, ...]:
    """Sections in file order; inside one, its unknown keys first, then its fields in order."""
    loc, unknown = err["loc"], err["type"] in ("extra_forbidden", "invalid_key", "unused")
    out = []
    for depth, part in enumerate(loc[:2]):
        names = list((SpecIn if depth == 0 else _model_at(loc)).model_fields)
        last = depth == len(loc) - 1
        out.append(-1 if unknown and last else names.index(part) if part in names else len(names))
    return tuple(out)


def _raise(ctx: FieldCtx, err: Any) -> NoReturn:
    loc = tuple(err["loc"])
    path: FieldPath = tuple(str(p) for p in loc)
    model, key, value, kind = _model_at(loc), path[-1], err["input"], err["type"]
    info = model.model_fields.get(key)
    if kind == "missing":
        ctx.missing(path)
    if kind in ("extra_forbidden", "invalid_key"):
        known = list(model.model_fields)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`?" if close else "remove it"
        ctx.fail(path, loc[-1], "unknown field", f"{hint} Known fields here: {', '.join(known)}")
    if kind == "unused" and err["ctx"]["selector"] == "trace":
        ctx.fail(path, value, f"only used by trace `{err['ctx']['only']}`", f"remove `{key}`")
    if kind == "unused":
        ctx.fail(path, value, f"not used by process {err['ctx']['chosen']}",
                 f"remove it or set `process: {err['ctx']['only']}`")  # fmt: skip
    if kind == "model_type":
        what = f"`{'.'.join(path)}`"
        ctx.fail(path, value, f"{what} must be a mapping", f"write {what} as `key: value` lines")
    if kind == "bool_type":
        ctx.fail(path, value, "must be true or false", BOOL_FIX.get(key, "write true or false"))
    if kind == "literal_error" and info is not None and isinstance(value, str) and value.strip():
        options = _choices(info)
        close = difflib.get_close_matches(value, options, n=1, cutoff=0.5)
        hint = f"did you mean `{close[0]}`? " if close else ""
        ctx.fail(path, value, "unknown choice", f"{hint}use one of {', '.join(options)}")
    if kind in ("string_type", "string_pattern_mismatch", "literal_error"):
        ctx.fail(path, value, "must be a non-empty string", "quote it: key: 'text'")
    if info is not None and _integer(info):
        low = _constraints(info).get("ge", 1)
        number = yaml_string_number(value)
        if kind == "greater_than_equal":
            ctx.fail(path, value, f"must be >= {low:g}", f"use a value >= {low:g}")
        if number is not None and number.is_integer():
            ctx.fail(path, value, f"must be an integer; {YAML11}", f"write `{int(number)}`")
        ctx.fail(path, value, "must be an integer", f"write a whole number >= {low:g}")
    if info is not None and kind in ("float_type", "finite_number") and not _is_inf(value):
        number = yaml_string_number(value)
        if number is not None:
            spellings = " or ".join(f"`{s}`" for s in yaml_spellings(number))
            ctx.fail(path, value, f"must be a number; {YAML11}", f"write {spellings}")
        ctx.fail(path, value, "must be a number", "write a plain number, e.g. 1.5")
    if info is not None:  # a number out of its range (infinity included)
        rng = _range(info)
        ctx.fail(path, value, f"must be {rng}", f"use a finite number {rng}")
    ctx.fail(path, value, err["msg"], "see docs/specs.md for the field")


def _inner(info: FieldInfo) -> tuple[Any, list[Any]]:
    """The field's type and its constraints, seen through ``X | None`` and ``Annotated``
    (``Count | None`` is ``Annotated[int, Field(ge=1)] | None``): one place for the nesting."""
    kind, found = info.annotation, list(info.metadata)
    args = [a for a in get_args(kind) if a is not type(None)]
    if type(None) in get_args(kind) and len(args) == 1:
        kind = args[0]
    if get_origin(kind) is Annotated:  # Annotated[float, Field(gt=0)]
        kind, *subs = get_args(kind)
        found += [m for sub in subs for m in getattr(sub, "metadata", [])]
    return kind, found


def _choices(info: FieldInfo) -> list[str]:
    return [c for c in get_args(_inner(info)[0]) if isinstance(c, str)]


def _integer(info: FieldInfo) -> bool:
    return _inner(info)[0] is int


def _is_inf(value: object) -> bool:
    return isinstance(value, float) and value in (float("inf"), float("-inf"))


def _constraints(info: FieldInfo) -> dict[str, float]:
    """``{"gt": 0.0}``: the field's bounds."""
    return {name: float(getattr(m, name)) for m in _inner(info)[1] for name in ("gt", "ge", "lt")
            if hasattr(m, name)}  # fmt: skip


def _range(info: FieldInfo) -> str:
    """``> 0``, ``>= 0 and < 1``: the range the field's constraints allow."""
    c = _constraints(info)
    text = f">= {c['ge']:g}" if "ge" in c else f"> {c.get('gt', 0.0):g}"
    return text + (f" and < {c['lt']:g}" if "lt" in c else "")


#: The keys each section knows, in reading order (the fuzzers mutate them).
TOP_FIELDS = tuple(SpecIn.model_fields)
MODEL_FIELDS, PARALLEL_FIELDS, WORKLOAD_FIELDS, ARRIVAL_FIELDS, SLO_FIELDS, SEARCH_FIELDS, \
    WINDOW_FIELDS = (tuple(m.model_fields) for m in SECTIONS.values())  # fmt: skip


def json_schema() -> str:
    """The JSON Schema of a spec file, as committed in ``docs/spec.schema.json`` (for an
    editor's YAML language server: ``# yaml-language-server: $schema=...``)."""
    schema = SpecIn.model_json_schema()
    schema["title"] = "moeperf workload spec"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
