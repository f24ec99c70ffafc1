"""The results file's schema: pydantic models of what the plugin writes and the report reads.

Why pydantic: one declaration gives the validation, the typed fields and a JSON Schema
(``docs/results.schema.json``, ``python -m pytest_moeperf.report.schema``) for the dashboards
that read these files. Extra keys are refused where the plugin owns the whole object (a typo'd
field in a hand-edited file is an error, not a silently missing figure); free-form blocks
(``setup``, ``search_runs``, ``accuracy``, ...) are objects whose keys other modules own.

Errors keep the plugin's one-line form: ``file: results[0].metrics.mbu.center = 'x': must be a
number or null. Fix: ...``: :func:`usage_error` turns pydantic's first error into that line.
"""

from __future__ import annotations

import json
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_moeperf.errors import UsageError
from pytest_moeperf.report import RESULTS_SCHEMA_VERSION as SCHEMA_VERSION

FIX = (
    "pass a results file written by the moeperf plugin (--moeperf-results), "
    f"schema_version {SCHEMA_VERSION}"
)

Number = float | None  # JSON numbers; strict: a string or a bool is refused, not converted
FreeForm = dict[str, Any]


class _Owned(BaseModel):
    """An object the plugin writes whole: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=True)


class MetricEntry(_Owned):
    """One metric: a value per run, their median (null: not measured) and why not."""

    runs: list[float] | None = None
    center: Number = None
    unit: str | None = None
    note: str | None = None


class VerdictEntry(_Owned):
    """One metric judged against its baseline (``verdict/``'s ``Verdict.to_dict``)."""

    metric: str | None = None
    outcome: str | None = None
    baseline_center: Number = None
    candidate_center: Number = None
    band: list[Number] | None = Field(default=None, min_length=2, max_length=2)
    delta_rel: Number = None
    p_value: Number = None
    unit: str | None = None
    reason: str | None = None
    advice: str | None = None
    gating: bool | None = None  # null: gating
    n_baseline: int | None = None
    n_candidate: int | None = None
    direction: str | None = None
    scale: str | None = None


class MoeConfigEntry(_Owned):
    """The MoE config a result served with and the proof the server's log gave."""

    name: str | None = None
    check: str | None = None
    loaded: list[str] | None = None
    hash: str | None = None
    file: str | None = None  # A/B sides: the config file's name and where it came from
    source: str | None = None


class BaselineEntry(_Owned):
    """What became of the baseline: compared, missing, written or not written, and why."""

    path: str | None = None
    status: str | None = None
    refresh: str | None = None
    warnings: list[str] | None = None
    concurrent: str | None = None


class ResultRecord(_Owned):
    """One perf test x one MoE config, as ``PerfResult.to_dict`` writes it."""

    nodeid: str
    outcome: str | None = None
    reasons: list[str] | None = None
    quick: bool | None = None
    config_label: str | None = None
    partial: bool | str | None = None  # an A/B run says why it stopped short
    partial_probes: list[FreeForm] | None = None
    spec: FreeForm | None = None
    setup: FreeForm | None = None
    moe_config: MoeConfigEntry | None = None
    metrics: dict[str, MetricEntry] | None = None
    verdicts: list[VerdictEntry] | None = None
    baseline: BaselineEntry | None = None
    accuracy: FreeForm | None = None
    fleet: FreeForm | None = None
    search_runs: list[FreeForm] | None = None
    sweep: list[FreeForm] | None = None
    hygiene: FreeForm | None = None  # checked by hygiene/model.py's HygieneReport.from_dict
    ab: FreeForm | None = None


class ResultsFile(_Owned):
    """One session's results file (``--moeperf-results``)."""

    schema_version: int = SCHEMA_VERSION
    plugin_version: str | None = None
    command: str | None = None
    quick: bool | None = None
    started: Number = None
    finished: Number = None
    warnings: list[str] | None = None
    results: list[ResultRecord]


#: Fields whose wrong type reads better said of the whole list than of one element.
_LIST_WORDS = {"runs": "must be a list of numbers", "reasons": "must be a list of strings",
               "warnings": "must be a list of strings", "loaded": "must be a list of strings",
               "band": "must be [low, high]"}  # fmt: skip
_SCALAR_TYPES = {"float_type", "float_parsing", "int_type", "string_type", "bool_type",
                 "finite_number", "int_from_float", "none_required"}  # fmt: skip


def validate(payload: object, source: str) -> ResultsFile:
    """The payload as a ``ResultsFile``, or one UsageError naming ``source`` and the field."""
    try:
        return ResultsFile.model_validate(payload)
    except ValidationError as e:
        raise usage_error(e, payload, source) from None


def validate_record(record: object, source: str) -> ResultRecord:
    try:
        return ResultRecord.model_validate(record)
    except ValidationError as e:
        raise usage_error(e, record, source, top="result") from None


def usage_error(err: ValidationError, data: object, source: str, top: str = "") -> UsageError:
    """pydantic's first error as the plugin's one line: source, dotted field, value, problem."""
    first = err.errors(include_url=False)[0]
    loc = list(first["loc"])
    kind = first["type"]
    fix = FIX
    if kind in _SCALAR_TYPES and len(loc) >= 2 and isinstance(loc[-1], int):
        loc = loc[:-1]  # "runs = [1.0, 'fast']: must be a list of numbers", not "runs[1]"
    parent = loc[-2] if len(loc) >= 2 else None
    if kind == "missing":
        problem = "is missing" + {"nodeid": ": every result names its test",
                                  "results": ": not a moeperf session results file"}.get(
                                      str(loc[-1]), "")  # fmt: skip
    elif kind == "extra_forbidden":
        problem = "is not a field of a moeperf results file (a typo, or a newer plugin's field)"
        known = _fields_at(ResultRecord if top else ResultsFile, loc[:-1])
        fix = f"correct or remove it; the fields here are {', '.join(known)}" if known else FIX
    elif isinstance(loc[-1], str) and loc[-1] in _LIST_WORDS:
        problem = _LIST_WORDS[loc[-1]]
    elif kind in {"model_type", "dict_type", "model_attributes_type"}:
        problem = "must be an object with runs and center" if parent == "metrics" else (
            "must be an object")  # fmt: skip
    elif kind == "list_type":
        problem = "must be a list"
    elif kind == "string_type":
        problem = "must be a string"
    elif kind == "bool_type":
        problem = "must be true or false"
    elif kind in _SCALAR_TYPES:
        problem = "must be a number or null"
    else:
        problem = str(first["msg"])
    where = _dotted(loc, top, missing=kind == "missing")
    value = None if kind == "missing" else _short(_at(data, loc))
    return UsageError(source, where, value, problem, fix)


def _fields_at(model: type[BaseModel], loc: list[Any]) -> list[str]:
    """The field names of the model at ``loc`` (list indexes and dict keys stepped through)."""
    kind: Any = model
    for part in loc:
        kind = _unwrap(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel) and isinstance(part, str):
            field = kind.model_fields.get(part)
            if field is None:
                return []
            kind = field.annotation
        elif get_origin(kind) is list and isinstance(part, int):
            kind = get_args(kind)[0]
        elif get_origin(kind) is dict and isinstance(part, str):
            kind = get_args(kind)[1]
        else:
            return []
    kind = _unwrap(kind)
    ok = isinstance(kind, type) and issubclass(kind, BaseModel)
    return sorted(kind.model_fields) if ok else []


def _unwrap(kind: Any) -> Any:
    """``X | None``: the X (every optional field here has one other type)."""
    while get_origin(kind) in (UnionType, Union):
        kind = next(a for a in get_args(kind) if a is not type(None))
    return kind


def _dotted(loc: list[Any], top: str, *, missing: bool) -> str:
    """``results[0].metrics.mbu``; a top-level field's wrong type reads ``(top level).x``, a
    missing one ``x``."""
    if not loc:
        return top or "(top level)"
    if not top and len(loc) == 1 and not missing:
        top = "(top level)"
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return f"{top}.{text}" if top else text


def _at(data: object, loc: list[Any]) -> object:
    for p in loc:
        if isinstance(data, dict) and isinstance(p, str):
            data = data.get(p)
        elif isinstance(data, list) and isinstance(p, int) and p < len(data):
            data = data[p]
        else:
            return None
    return data


def _short(value: object) -> object:
    text = repr(value)
    return value if len(text) <= 80 else text[:77] + "..."


def json_schema() -> str:
    """The JSON Schema of a results file, as committed in ``docs/results.schema.json``."""
    schema = ResultsFile.model_json_schema()
    schema["title"] = f"moeperf results file, schema_version {SCHEMA_VERSION}"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(json_schema(), end="")
