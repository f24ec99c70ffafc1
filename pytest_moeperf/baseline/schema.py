"""The baseline file's schema: pydantic models of what ``BaselineStore`` writes and reads.

One declaration gives the validation and a JSON Schema (``docs/baseline.schema.json``) for the
tools that read baselines out of git. Errors keep the plugin's one-line form (``b.json:12:
key.gpu_count = 'two': must be an integer. Fix: ...``): :func:`validate` turns pydantic's first
error into that line, with the wording each field had before the models.

Unknown keys: at the top level they are kept (``Baseline.extra``, written back on a rewrite),
so that a field a newer plugin adds survives an older plugin's refresh; inside ``key``,
``provenance`` and ``key.calibration`` they are ignored, as before. Types are strict: a number
where a string belongs, or a bool where a number belongs, is an error, not a conversion.
Semantic checks (a metric without runs, no gated metric) stay in ``storage``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_moeperf.baseline.storage import RERECORD
from pytest_moeperf.errors import UsageError

_KEY_FIX = "fix the field or re-record the baseline"

FiniteNumber = Annotated[float, Field(allow_inf_nan=False)]
Figure = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[int, Field(ge=1)]


class _Part(BaseModel):
    """An object inside the file: strict types, unknown keys ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class CalibrationEntry(_Part):
    """``key.calibration``: the machine's measured speed (``baseline/calibration.py``)."""

    version: Positive
    threads: Positive
    figures: dict[str, Figure]
    spread: dict[str, Figure] = Field(default_factory=dict)
    gpus: list[dict[str, Any]] = Field(default_factory=list)


class KeyEntry(_Part):
    """``key``: what must match for two measurements to be compared (``baseline/key.py``)."""

    backend: str
    gpu_name: str
    gpu_count: int
    driver: str
    cuda: str
    vllm_version: str
    model: str
    dtype: str
    tp: int
    dp: int
    spec_hash: str
    moe_config_hash: str
    calibration: CalibrationEntry | None = None  # absent or null: not measured


class ProvenanceEntry(_Part):
    """``provenance``: who wrote the baseline, when, from which commit and why."""

    commit: str
    date: str
    host: str
    command: str
    reason: str
    plugin_version: str


class BaselineFile(BaseModel):
    """A baseline file. Field order is the order problems are reported in."""

    model_config = ConfigDict(strict=True, extra="allow")

    schema_version: Positive
    test_id: str
    metrics: dict[str, list[FiniteNumber]]
    runs: list[dict[str, Any]]
    accuracy: dict[str, Any] | None  # required, may be null
    key: KeyEntry
    provenance: ProvenanceEntry


M = TypeVar("M", bound=BaseModel)

#: (path of the field, problem, fix), by the first step of pydantic's error location below the
#: object; the value shown is the field's whole value (a list of runs, not its bad element).
_RULES: dict[str, tuple[str, str]] = {
    "test_id": ("must be a string", RERECORD),
    "key": ("must be a JSON object", "rewrite the baseline"),
    "provenance": ("must be a JSON object", RERECORD),
    "metrics": ("must be an object", RERECORD),
    "runs": ("must be a list of objects", RERECORD),
    "accuracy": ("must be an object or null", RERECORD),
    "schema_version": ("must be a positive integer", RERECORD),
    "calibration": ("must be an object or null", RERECORD),
    "version": ("must be a positive integer", RERECORD),
    "threads": ("must be a positive integer", RERECORD),
    "figures": ("must map names to finite numbers >= 0", RERECORD),
    "spread": ("must map names to finite numbers >= 0", RERECORD),
    "gpus": ("must be a list of objects", RERECORD),
}
#: Where each object sits in the file, and the fix for a field it misses.
_OBJECTS: dict[type[BaseModel], tuple[str, str]] = {
    BaselineFile: ("baseline", RERECORD),
    KeyEntry: ("key", "re-record the baseline (--moeperf-update-baseline) or add the fields"),
    ProvenanceEntry: ("provenance", RERECORD),
    CalibrationEntry: ("key.calibration", RERECORD),
}


def validate(model: type[M], data: object, source: str) -> M:
    """``data`` as ``model``, or the one-line UsageError for its first problem."""
    if not isinstance(data, dict):  # the object's own rule, as when it sits in a file
        if model is BaselineFile:
            raise UsageError(source, "top level", type(data).__name__, "must be a JSON object",
                             RERECORD)  # fmt: skip
        where = _OBJECTS[model][0]
        problem, fix = _RULES[where.rsplit(".", 1)[-1]]
        raise UsageError(source, where, data, problem, fix)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _usage_error(model, data, e, source) from None


def _usage_error(model: type[BaseModel], data: dict[str, Any], e: ValidationError,
                 source: str) -> UsageError:  # fmt: skip
    errors = e.errors(include_url=False, include_input=False)
    # a field missing is said first, all of them at once, as one object's problem
    missing = [err for err in errors if err["type"] == "missing"]
    first = min(missing, key=lambda err: len(err["loc"])) if missing else errors[0]
    loc = list(first["loc"])
    parent: list[Any] = []
    obj: dict[Any, Any] = data
    kind = model
    for part in loc[:-1]:  # down to the object holding the field (key, its calibration, ...)
        inner = _field_model(kind, part)
        if inner is None or not isinstance(obj.get(part), dict):
            break
        parent, obj, kind = [*parent, part], obj[part], inner
    prefix = "" if model is BaselineFile else _OBJECTS[model][0] + "."
    if first["type"] == "missing" and kind is not CalibrationEntry:
        names = [str(err["loc"][-1]) for err in missing if list(err["loc"][:-1]) == parent]
        where, fix = _OBJECTS[kind]
        return UsageError(source, where, sorted(obj), f"misses field(s) {', '.join(names)}", fix)
    head = [str(p) for p in loc[: len(parent) + 1]]
    name = head[-1]
    field = prefix + ".".join(head)
    value = obj.get(name)
    if name in _RULES and not (name == "metrics" and len(loc) > 1):
        problem, fix = _RULES[name]
        return UsageError(source, field, value, problem, fix)
    if kind is KeyEntry:
        want = "an integer" if KeyEntry.model_fields[name].annotation is int else "a string"
        return UsageError(source, field, value, f"must be {want}", _KEY_FIX)
    if head[0] == "metrics":  # one metric's runs: named, in one line
        metric = str(loc[1])
        shown = metric if metric.isprintable() else repr(metric)
        return UsageError(source, f"metrics.{shown}", data["metrics"][loc[1]],
                          "must be a list of finite numbers (one per run)", RERECORD)  # fmt: skip
    if kind is ProvenanceEntry:
        return UsageError(source, field, value, "must be a string", RERECORD)
    return UsageError(source, field, value, str(first["msg"]), RERECORD)


def _field_model(kind: type[BaseModel], name: object) -> type[BaseModel] | None:
    """The model of field ``name`` of ``kind`` (``X | None``: the X); None: not an object."""
    field = kind.model_fields.get(str(name))
    annotation = None if field is None else field.annotation
    for candidate in _OBJECTS:
        if annotation is candidate or candidate in getattr(annotation, "__args__", ()):
            return candidate
    return None


def json_schema() -> str:
    """The JSON Schema of a baseline file, as committed in ``docs/baseline.schema.json``."""
    schema = BaselineFile.model_json_schema()
    schema["title"] = "moeperf baseline file"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(json_schema(), end="")
