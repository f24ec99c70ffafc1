"""Baseline keys and files: round trip, atomicity, concurrency, and every kind of bad file."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from baseline_helpers import PROV, make_key

import pytest_moeperf
from pytest_moeperf.baseline import (
    HARDWARE_FIELDS,
    SCHEMA_VERSION,
    SOFTWARE_FIELDS,
    Baseline,
    BaselineKey,
    BaselineStore,
    Provenance,
    read_baseline_file,
    safe_name,
)
from pytest_moeperf.errors import UsageError

TEST_ID = "tests/perf/test_moe.py::test_goodput[qwen-moe/tp2-1024]"


def make_baseline(
    test_id: str = TEST_ID, key: BaselineKey | None = None, scale: float = 1.0
) -> Baseline:
    return Baseline(
        test_id=test_id,
        key=key or make_key(),
        metrics={
            "slo_goodput_tok_s": [1000.0 * scale, 1010.0 * scale, 990.0 * scale],
            "ttft_p99_ms": [120.5, 118.0, 121.25],
        },
        runs=[{"run": i, "requests": 200, "aborted": False} for i in range(3)],
        provenance=PROV,
        accuracy={"q1": True, "q2": False},
    )


def write_raw(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


# ---- keys


def test_key_fields_are_classified() -> None:
    names = {f for f in BaselineKey.__dataclass_fields__} - {"calibration"}  # judged apart
    assert set(HARDWARE_FIELDS) | set(SOFTWARE_FIELDS) == names
    assert not set(HARDWARE_FIELDS) & set(SOFTWARE_FIELDS)


def test_mismatches_name_hardware_and_software_fields() -> None:
    a, b = make_key(), make_key(gpu_name="NVIDIA A100", tp=4, moe_config_hash="x")
    assert a.mismatches(b) == ["gpu_name", "tp", "moe_config_hash"]
    assert a.hardware_mismatches(b) == ["gpu_name"]
    assert a.software_mismatches(b) == ["tp", "moe_config_hash"]
    text = a.describe_mismatches(b)
    assert text.startswith("hardware: gpu_name 'NVIDIA H200' vs 'NVIDIA A100'")
    assert "software: tp 2 vs 4" in text
    assert a.describe_mismatches(make_key()) == "identical"


def test_slug_is_readable_safe_and_unique() -> None:
    k = make_key()
    slug = k.slug()
    assert re.fullmatch(r"[A-Za-z0-9._-]+", slug)
    assert "Qwen3-30B-A3B" in slug and "tp2dp1" in slug and "H200x2" in slug
    assert slug == make_key().slug()
    for name in HARDWARE_FIELDS + SOFTWARE_FIELDS:
        value = getattr(k, name)
        changed: Any = value + 1 if isinstance(value, int) else value + "z"
        other = replace(k, **{name: changed})
        assert other.slug() != slug, name


def test_slug_of_a_long_model_name_is_bounded() -> None:
    assert len(make_key(model="org/" + "m" * 500).slug()) <= 80 + 11


def test_key_from_dict_round_trip() -> None:
    k = make_key()
    assert BaselineKey.from_dict(k.to_dict()) == k


def test_key_from_dict_missing_field() -> None:
    d = make_key().to_dict()
    del d["driver"]
    with pytest.raises(UsageError, match="misses field\\(s\\) driver"):
        BaselineKey.from_dict(d, source="x.json")


def test_key_from_dict_wrong_type() -> None:
    d = make_key().to_dict()
    d["gpu_count"] = "2"
    with pytest.raises(
        UsageError, match=re.escape("x.json: key.gpu_count = '2': must be an integer")
    ):
        BaselineKey.from_dict(d, source="x.json")


def test_key_from_dict_not_an_object() -> None:
    with pytest.raises(UsageError, match="must be a JSON object"):
        BaselineKey.from_dict(["cuda"], source="x.json")


def test_safe_name() -> None:
    assert safe_name("tests/a.py::t[x/y z]") == "tests_a.py_t_x_y_z"
    assert safe_name("///") == "_"
    assert len(safe_name("a" * 300, limit=50)) == 50


# ---- paths


def test_test_ids_map_to_distinct_safe_directories(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    ids = [TEST_ID, TEST_ID.replace("/", "_"), "t::a[1]", "t::a[1 ]", "t::a]1["]
    dirs = [store.dir_for(i) for i in ids]
    assert len(set(dirs)) == len(ids)
    for d in dirs:
        assert d.parent == tmp_path
        assert re.fullmatch(r"[A-Za-z0-9._-]+", d.name)
    assert store.path_for(TEST_ID, make_key()).name == make_key().slug() + ".json"


# ---- round trip and format


def test_round_trip(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    b = make_baseline()
    path = store.write(b, complete=True)
    assert path == store.path_for(TEST_ID, b.key)
    loaded = store.load(TEST_ID, b.key)
    assert loaded == b
    assert loaded is not None and loaded.schema_version == SCHEMA_VERSION


def test_load_absent_is_none(tmp_path: Path) -> None:
    assert BaselineStore(tmp_path).load(TEST_ID, make_key()) is None


def test_file_is_sorted_one_value_per_line_and_deterministic(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_baseline(), complete=True)
    text = path.read_text()
    assert text.endswith("}\n")
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert re.search(r"^ {6}1010\.0,$", text, re.M)  # each run value on its own line
    first = path.read_bytes()
    store.write(make_baseline(), complete=True)
    assert path.read_bytes() == first


def test_written_file_is_world_readable(tmp_path: Path) -> None:
    path = BaselineStore(tmp_path).write(make_baseline(), complete=True)
    assert path.stat().st_mode & 0o777 == 0o644


def test_unknown_top_level_fields_survive_a_rewrite(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_baseline(), complete=True)
    data = json.loads(path.read_text())
    data["note_from_future"] = {"x": 1}
    path.write_text(json.dumps(data))
    loaded = store.load(TEST_ID, make_key())
    assert loaded is not None and loaded.extra == {"note_from_future": {"x": 1}}
    store.write(loaded, complete=True)
    assert json.loads(path.read_text())["note_from_future"] == {"x": 1}


# ---- atomic write


def test_write_leaves_no_temp_files(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for i in range(5):
        store.write(make_baseline(scale=1 + i / 100), complete=True)
    files = sorted(p.name for p in store.dir_for(TEST_ID).iterdir())
    assert files == [make_key().slug() + ".json"]


def test_failed_replace_keeps_old_file_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_baseline(), complete=True)
    before = path.read_bytes()

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        store.write(make_baseline(scale=2.0), complete=True)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_partial_run_is_refused_and_nothing_written(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    with pytest.raises(UsageError, match="complete = False: the run was partial"):
        store.write(make_baseline(), complete=False)
    assert not store.dir_for(TEST_ID).exists()


def test_partial_run_does_not_replace_an_existing_baseline(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_baseline(), complete=True)
    before = path.read_bytes()
    with pytest.raises(UsageError):
        store.write(make_baseline(scale=0.5), complete=False)
    assert path.read_bytes() == before


def test_nan_metric_is_refused(tmp_path: Path) -> None:
    b = make_baseline()
    b.metrics["mbu"] = [0.5, float("nan")]
    with pytest.raises(UsageError, match=r"metrics\.mbu"):
        BaselineStore(tmp_path).write(b, complete=True)


def test_metric_without_runs_is_refused(tmp_path: Path) -> None:
    """An empty list would be skipped by the gate: the file would silently gate nothing."""
    b = make_baseline()
    b.metrics["ttft_p99_ms"] = []
    with pytest.raises(UsageError, match=r"metrics\.ttft_p99_ms = \[\]: has no runs"):
        BaselineStore(tmp_path).write(b, complete=True)


def test_baseline_without_a_gated_metric_is_refused(tmp_path: Path) -> None:
    b = make_baseline()
    b.metrics = {"power_w": [500.0, 501.0, 499.0]}  # informational only
    with pytest.raises(
        UsageError, match=r"holds no gated metric .* so this baseline gates nothing"
    ):
        BaselineStore(tmp_path).write(b, complete=True)


def test_unserialisable_run_summary_is_refused(tmp_path: Path) -> None:
    b = make_baseline()
    b.runs.append({"when": datetime(2026, 1, 1)})
    with pytest.raises(UsageError, match="cannot be written as JSON"):
        BaselineStore(tmp_path).write(b, complete=True)
    assert not list(tmp_path.rglob("*.tmp"))


# ---- bad files


def test_corrupt_file_names_file_line_and_column(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "b.json", '{\n  "schema_version": 1,\n  "test_id": oops\n}\n')
    with pytest.raises(UsageError) as err:
        read_baseline_file(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "line 3 column 14" in msg
    assert "corrupt or truncated" in msg


def test_truncated_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_baseline(), complete=True)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(UsageError, match=r"line \d+ column \d+.*corrupt or truncated"):
        store.load(TEST_ID, make_key())


def test_empty_file(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "b.json", "")
    with pytest.raises(UsageError, match="is empty: the file was truncated"):
        read_baseline_file(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_baseline_file(tmp_path / "nope.json")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="cannot be read"):
        read_baseline_file(path)


def test_newer_schema_says_upgrade(tmp_path: Path) -> None:
    d = make_baseline().to_dict()
    d["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(UsageError) as err:
        read_baseline_file(write_raw(tmp_path / "b.json", d))
    msg = str(err.value)
    assert "schema_version = 2" in msg and "newer pytest-moeperf" in msg
    assert "upgrade the plugin" in msg


@pytest.mark.parametrize("version", [0, "1", 1.0, True])
def test_bad_schema_version(tmp_path: Path, version: object) -> None:
    d = make_baseline().to_dict()
    d["schema_version"] = version
    with pytest.raises(UsageError, match="schema_version"):
        read_baseline_file(write_raw(tmp_path / "b.json", d))


def test_missing_schema_version(tmp_path: Path) -> None:
    d = make_baseline().to_dict()
    del d["schema_version"]
    with pytest.raises(UsageError, match="schema_version = None: is missing"):
        read_baseline_file(write_raw(tmp_path / "b.json", d))


@pytest.mark.parametrize("field", ["test_id", "key", "metrics", "runs", "accuracy", "provenance"])
def test_missing_top_level_field(tmp_path: Path, field: str) -> None:
    d = make_baseline().to_dict()
    del d[field]
    with pytest.raises(UsageError, match=f"misses field\\(s\\) {field}"):
        read_baseline_file(write_raw(tmp_path / "b.json", d))


def test_missing_provenance_field(tmp_path: Path) -> None:
    d = make_baseline().to_dict()
    del d["provenance"]["commit"]
    with pytest.raises(UsageError, match=r"provenance.*misses field\(s\) commit"):
        read_baseline_file(write_raw(tmp_path / "b.json", d))


def test_top_level_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="must be a JSON object"):
        read_baseline_file(write_raw(tmp_path / "b.json", [1, 2]))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("metrics", {"mbu": ["0.5"]}, "metrics.mbu"),
        ("metrics", {"mbu": 0.5}, "metrics.mbu"),
        ("metrics", [], "metrics"),
        ("runs", [1, 2], "runs"),
        ("accuracy", [True], "accuracy"),
        ("test_id", 7, "test_id"),
    ],
)
def test_wrong_field_types(tmp_path: Path, field: str, value: object, match: str) -> None:
    d = make_baseline().to_dict()
    d[field] = value
    with pytest.raises(UsageError, match=match):
        read_baseline_file(write_raw(tmp_path / "b.json", d))


def test_file_in_the_wrong_place_is_refused(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    other = store.write(make_baseline(test_id="tests/x.py::other"), complete=True)
    target = store.path_for(TEST_ID, make_key())
    target.parent.mkdir(parents=True)
    target.write_bytes(other.read_bytes())
    with pytest.raises(UsageError, match="does not match the file's place"):
        store.load(TEST_ID, make_key())


# ---- other keys (other hardware / software)


def test_find_other_keys(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    here, a100, vllm = make_key(), make_key(gpu_name="NVIDIA A100"), make_key(vllm_version="0.10")
    for k in (here, a100, vllm):
        store.write(make_baseline(key=k), complete=True)
    store.write(make_baseline(test_id="tests/x.py::other", key=make_key(cuda="13")), complete=True)
    others = store.find_other_keys(TEST_ID, exclude=here)
    assert set(others) == {a100, vllm}
    assert [here.hardware_mismatches(k) for k in sorted(others, key=lambda k: k.gpu_name)] == [
        ["gpu_name"],
        [],
    ]
    assert set(store.find_other_keys(TEST_ID)) == {here, a100, vllm}
    assert store.load(TEST_ID, make_key(gpu_name="NVIDIA B200")) is None


def test_find_other_keys_of_unknown_test(tmp_path: Path) -> None:
    assert BaselineStore(tmp_path).find_other_keys("tests/none.py::t") == []


def test_find_other_keys_reports_a_corrupt_neighbour(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.write(make_baseline(), complete=True)
    bad = store.dir_for(TEST_ID) / "broken.json"
    bad.write_text("{")
    with pytest.raises(UsageError, match=r"broken\.json"):
        store.find_other_keys(TEST_ID)


# ---- provenance


def test_provenance_collect_outside_git(tmp_path: Path) -> None:
    p = Provenance.collect("nightly", command="pytest -x", cwd=tmp_path)
    assert p.commit == "unknown"
    assert p.command == "pytest -x" and p.reason == "nightly"
    assert p.plugin_version == pytest_moeperf.__version__
    assert datetime.fromisoformat(p.date).tzinfo is not None
    assert p.host


# ---- concurrency (pytest-xdist workers share one baseline directory)


def _writer(root: str, worker: int, rounds: int) -> None:
    store = BaselineStore(Path(root))
    for r in range(rounds):
        own = make_baseline(key=make_key(spec_hash=f"w{worker}"), scale=1 + r / 1000)
        store.write(own, complete=True)
        shared = make_baseline(key=make_key(), scale=1 + worker / 10)
        shared.runs.append({"writer": worker, "round": r, "pad": "x" * 2000})
        store.write(shared, complete=True)


def _reader(root: str, rounds: int, out: Any) -> None:
    store = BaselineStore(Path(root))
    seen = 0
    for _ in range(rounds):
        try:
            if store.load(TEST_ID, make_key()) is not None:
                seen += 1
        except UsageError as e:  # a torn read would land here
            out.put(f"torn: {e}")
            return
    out.put(seen)


def test_concurrent_writers_leave_valid_files(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 15)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = BaselineStore(tmp_path)
    files = sorted(store.dir_for(TEST_ID).iterdir())
    assert len(files) == 9  # 8 own files + 1 shared
    for f in files:
        b = read_baseline_file(f)
        assert b.test_id == TEST_ID
    shared = store.load(TEST_ID, make_key())
    assert shared is not None and shared.runs[-1]["round"] == 14
    assert not list(tmp_path.rglob("*.tmp"))


def test_readers_never_see_a_torn_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.write(make_baseline(), complete=True)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), w, 10)) for w in range(4)]
    readers = [ctx.Process(target=_reader, args=(str(tmp_path), 200, q)) for _ in range(4)]
    for p in writers + readers:
        p.start()
    for p in writers + readers:
        p.join(60)
        assert p.exitcode == 0
    results = [q.get(timeout=10) for _ in readers]
    assert results == [200] * 4, results


# -- gates.compare on a missing baseline
@pytest.mark.parametrize("ci_mode", [False, True])
def test_missing_baseline_is_a_warning_or_a_ci_failure_naming_the_refresh(
    tmp_path: Path, ci_mode: bool
) -> None:
    from pytest_moeperf import gates

    store = BaselineStore(tmp_path)
    out = gates.compare(store, "t.py::test_a", make_key(), {"slo_goodput_tok_s": [1.0, 2.0]},
                        allow_other_hardware=False, ci_mode=ci_mode, target="t.py")  # fmt: skip
    assert out.status == "missing"
    (msg,) = out.failures if ci_mode else out.warnings
    assert msg.startswith("no baseline for t.py::test_a at ")
    assert "--moeperf-refresh-baselines" in msg


@pytest.mark.parametrize("ci_mode", [False, True])
def test_missing_baseline_while_refreshing_is_silent(tmp_path: Path, ci_mode: bool) -> None:
    """The refresh run is creating it: no "create it with --moeperf-refresh-baselines" advice,
    and no CI failure that would stop the refresh from writing it."""
    from pytest_moeperf import gates

    store = BaselineStore(tmp_path)
    out = gates.compare(store, "t.py::test_a", make_key(), {"slo_goodput_tok_s": [1.0, 2.0]},
                        allow_other_hardware=False, ci_mode=ci_mode, target="t.py",
                        refreshing=True)  # fmt: skip
    assert (out.status, out.failures, out.warnings) == ("missing", [], [])
