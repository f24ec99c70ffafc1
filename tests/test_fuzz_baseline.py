"""Fuzzing the baseline reader: any file gives a valid Baseline or one clear UsageError.

Baselines are hand-merged in git, truncated by full disks and copied between machines, and
preflight reads every one before a measurement. Whatever the bytes, ``read_baseline_file``
must return a Baseline or raise UsageError (one line naming the file), never another
exception (that would be a traceback in setup), and must not blow up in memory.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_moeperf.baseline.storage import Baseline, read_baseline_file
from pytest_moeperf.errors import UsageError

#: Peak memory a read may take for the inputs below (all are under ~64 KiB).
MEMORY_LIMIT = 16 * 2**20

SETTINGS = settings(max_examples=300, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])  # fmt: skip


def _valid() -> dict[str, Any]:
    """A complete baseline as its file holds it."""
    from pytest_moeperf.baseline import BaselineKey, Provenance

    key = BaselineKey(backend="cpu", gpu_name="cpu", gpu_count=0, driver="", cuda="",
                      vllm_version="0.32.0", model="embedded", dtype="bfloat16", tp=1, dp=1,
                      spec_hash="0" * 16, moe_config_hash="in-tree")  # fmt: skip
    prov = Provenance("abc", "2026-01-01T00:00:00+00:00", "h", "pytest", "test", "0.1.0")
    base = Baseline("t.py::t", key, {"slo_goodput_tok_s": [1.0, 2.0, 3.0]}, [{"x": 1}], prov,
                    accuracy={"correct": [1, 0]})  # fmt: skip
    data: dict[str, Any] = json.loads(base.to_json())
    return data


def _read(tmp_path: Path, raw: bytes) -> None:
    """The property: a Baseline or one UsageError line naming the file, in bounded memory."""
    path = tmp_path / "b.json"
    path.write_bytes(raw)
    tracemalloc.start()
    try:
        got = read_baseline_file(path)
    except UsageError as exc:
        text = str(exc)
        assert str(path) in exc.source, text
        assert "\n" not in text and "Fix: " in text, text
    else:
        assert isinstance(got, Baseline)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"read took {peak / 2**20:.1f} MiB"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=5),
    max_leaves=30,
)  # fmt: skip

FIELDS = ("schema_version", "test_id", "key", "metrics", "runs", "accuracy", "provenance")
KEY_FIELDS = tuple(_valid()["key"])


@given(raw=st.binary(max_size=4096))
@example(raw=b"")
@example(raw=b"\xff\xfe{")
@example(raw=b"[" * 100_000)  # deeper than the json module's recursion
@example(raw=b'{"schema_version": 1' + b"9" * 5000 + b"}")  # past int's 4300-digit limit
@SETTINGS
def test_arbitrary_bytes(tmp_path: Path, raw: bytes) -> None:
    _read(tmp_path, raw)


@given(value=json_values)
@SETTINGS
def test_arbitrary_json(tmp_path: Path, value: object) -> None:
    _read(tmp_path, json.dumps(value).encode())


@given(field=st.sampled_from(FIELDS), value=json_values)
@SETTINGS
def test_one_field_replaced(tmp_path: Path, field: str, value: object) -> None:
    data = _valid()
    data[field] = value
    _read(tmp_path, json.dumps(data).encode())


@given(field=st.sampled_from(KEY_FIELDS), value=json_values)
@SETTINGS
def test_one_key_field_replaced(tmp_path: Path, field: str, value: object) -> None:
    data = _valid()
    data["key"][field] = value
    _read(tmp_path, json.dumps(data).encode())


@given(values=st.lists(st.integers() | st.floats() | st.text(max_size=5), max_size=8),
       name=st.text(max_size=10))  # fmt: skip
@example(values=[10**400], name="slo_goodput_tok_s")  # too large for a float
@example(values=[], name="\n")  # found by CI: an empty run list under a newline's name
@SETTINGS
def test_metric_values(tmp_path: Path, values: list[object], name: str) -> None:
    data = _valid()
    data["metrics"] = {name: values}
    _read(tmp_path, json.dumps(data).encode())


@given(cut=st.integers(min_value=0), drop=st.sampled_from((*FIELDS, None)))
@SETTINGS
def test_truncated_or_missing_a_field(tmp_path: Path, cut: int, drop: str | None) -> None:
    data = _valid()
    if drop is not None:
        data.pop(drop)
    text = json.dumps(data, indent=2).encode()
    _read(tmp_path, text[: cut % (len(text) + 1)])


@pytest.mark.parametrize(
    "text",
    [
        '{"schema_version": 1e999}',  # inf
        '{"schema_version": NaN}',
        '{"schema_version": 1, "metrics": {"m": [Infinity]}}',
        '{"schema_version": 1.0}',
        '{"schema_version": true}',
    ],
)  # fmt: skip
def test_json_extensions_python_accepts(tmp_path: Path, text: str) -> None:
    _read(tmp_path, text.encode())


def test_a_valid_file_reads_back(tmp_path: Path) -> None:
    """The control: the property is not met by raising on everything."""
    path = tmp_path / "b.json"
    path.write_text(json.dumps(_valid()))
    assert read_baseline_file(path).metrics == {"slo_goodput_tok_s": [1.0, 2.0, 3.0]}


def test_a_huge_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A baseline is a few KiB; a 1 GiB file (sparse here) is not read into memory."""
    path = tmp_path / "b.json"
    with path.open("wb") as f:
        f.truncate(2**30)
    tracemalloc.start()
    try:
        with pytest.raises(UsageError, match=r"b\.json: file = .*is 1024 MiB") as exc:
            read_baseline_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT
    assert "Fix: " in str(exc.value)
