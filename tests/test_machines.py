"""One baseline per machine of the same names (``baseline/machines.py``).

Two lent H100 hosts (2026-12-06) had every GPU identity field in common and copy figures of
180 and 63.6 GB/s; their boundaries were 39 % apart. A refresh on the second replaced the
first's file, so each host's nightly would call the other's baseline "another machine" in
turn. Now each machine keeps a file: ``<slug>.json``, ``<slug>.m2.json``, ...
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from baseline_helpers import PROV
from test_calibration import CONFTEST, FAST, SLOW, TEST, TEST_ID, cpu_key, goodput

from pytest_moeperf import gates
from pytest_moeperf.baseline import Baseline, BaselineStore, Calibration
from pytest_moeperf.baseline.machines import for_reading, for_writing, gap, machine_index

pytest_plugins = ["pytester"]

#: a third machine, 2.5x slower than SLOW: neither stored machine's
SLOWER = Calibration({"gemm_gflops": 9.8, "copy_gb_s": 2.0}, threads=1)
#: SLOW measured in another session, within x1.5 (the tolerance is x2): the same machine
SLOW_AGAIN = Calibration({"gemm_gflops": 27.9, "copy_gb_s": 4.6}, threads=1)


def _write(store: BaselineStore, cal: Calibration | None, center: float) -> Path:
    return store.write(Baseline(TEST_ID, cpu_key(cal), goodput(center), [], PROV), complete=True)


def _compare(store: BaselineStore, here: Calibration | None, center: float,
             **kw: Any) -> gates.BaselineOutcome:  # fmt: skip
    opts: dict[str, Any] = {"allow_other_hardware": False, "ci_mode": True, **kw}
    return gates.compare(store, TEST_ID, cpu_key(here), goodput(center),
                         target="perf_tests/test_embedded.py", **opts)  # fmt: skip


def test_a_second_machine_writes_beside_the_first_and_each_reads_its_own(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    fast = _write(store, FAST, 1000.0)
    before = fast.read_bytes()
    slow = _write(store, SLOW, 250.0)
    assert fast.name == f"{cpu_key(FAST).slug()}.json"
    assert slow.name == f"{cpu_key(SLOW).slug()}.m2.json"
    assert fast.read_bytes() == before  # the first machine's baseline is untouched
    for here, center, path in ((FAST, 1000.0, fast), (SLOW_AGAIN, 250.0, slow)):
        out = _compare(store, here, center)
        assert out.status == "compared" and out.path == str(path) and out.failures == []
        assert [v.outcome for v in out.verdicts] == ["unchanged"]


def test_each_machine_is_judged_against_its_own_numbers(tmp_path: Path) -> None:
    """No cross-talk: a 30 % slowdown on the slow machine is a regression of *its* baseline,
    and the same figure on the fast machine is not read against the slow one's."""
    store = BaselineStore(tmp_path)
    _write(store, FAST, 1000.0)
    _write(store, SLOW, 250.0)
    slowed = _compare(store, SLOW_AGAIN, 175.0)
    assert slowed.status == "compared" and slowed.verdicts[0].outcome == "regressed"
    assert slowed.failures[0].startswith("slo_goodput_tok_s regressed vs baseline: ")
    fast = _compare(store, FAST, 1000.0)
    assert fast.status == "compared" and fast.verdicts[0].outcome == "unchanged"


def test_a_machine_refreshing_again_replaces_only_its_own_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    fast = _write(store, FAST, 1000.0)
    slow = _write(store, SLOW, 250.0)
    again = _write(store, SLOW_AGAIN, 260.0)
    assert again == slow
    assert sorted(p.name for p in slow.parent.glob("*.json")) == sorted([fast.name, slow.name])
    stored = json.loads(slow.read_text())
    assert stored["metrics"]["slo_goodput_tok_s"][0] == pytest.approx(260.0)


def test_a_third_machine_is_told_the_closest_one_and_records_a_third_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    _write(store, FAST, 1000.0)
    slow = _write(store, SLOW, 250.0)
    out = _compare(store, SLOWER, 100.0, ci_mode=False, refreshing=True)
    assert out.status == "other-setup" and out.path == str(slow) and out.verdicts == []
    assert "calibration GEMM 9.8 vs 24.6 GFLOP/s (-60 %); copy 2 vs 5.1 GB/s (-61 %)" \
        in out.warnings[0]  # fmt: skip
    assert out.warnings[0].endswith("(this refresh records this machine's baseline beside it)")
    third = _write(store, SLOWER, 100.0)
    assert third.name == f"{cpu_key(SLOWER).slug()}.m3.json"


def test_an_uncalibrated_file_is_replaced_not_kept_beside(tmp_path: Path) -> None:
    """A baseline from before calibrations existed asks to be re-recorded: the refresh does."""
    store = BaselineStore(tmp_path)
    old = _write(store, None, 1000.0)
    assert _write(store, FAST, 900.0) == old
    assert len(list(old.parent.glob("*.json"))) == 1


def test_a_remote_server_reads_and_writes_the_first_file_by_names(tmp_path: Path) -> None:
    """An external server's key has no calibration (this machine's speed says nothing)."""
    store = BaselineStore(tmp_path)
    first = _write(store, FAST, 1000.0)
    _write(store, SLOW, 250.0)
    assert store.path_for(TEST_ID, cpu_key(None)) == first
    assert _write(store, None, 990.0) == first


def test_a_damaged_machine_file_is_unreadable_and_named(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    _write(store, FAST, 1000.0)
    slow = _write(store, SLOW, 250.0)
    slow.write_text('{"schema_version": ')
    out = _compare(store, FAST, 1000.0)
    assert out.status == "unreadable" and str(slow) in out.failures[0]


@pytest.mark.parametrize(("name", "index"), [
    ("{slug}.json", 1), ("{slug}.m2.json", 2), ("{slug}.m17.json", 17), ("{slug}.m1.json", None),
    ("{slug}.m0.json", None), ("{slug}.m02.json", None), ("{slug}x.m2.json", None),
    ("other-{slug}.m2.json", None), (".{slug}.abc.tmp", None),
])  # fmt: skip
def test_machine_file_names(name: str, index: int | None) -> None:
    slug = "cpu-Intel_R_Xeon_R_Processorx2-embedded_7c5e24bb7269-bfloat16-tp1dp1-fe8d0f9d1c"
    assert machine_index(Path(name.format(slug=slug)), slug) == index


def test_reading_prefers_a_matching_machine_then_the_closest_then_names() -> None:
    a, b, c = Path("a.json"), Path("a.m2.json"), Path("a.m3.json")
    assert for_reading(SLOW_AGAIN, [(a, FAST), (b, SLOW), (c, SLOWER)]) == b
    assert for_reading(Calibration({"gemm_gflops": 400.0, "copy_gb_s": 80.0}, threads=1),
                       [(a, FAST), (b, SLOW)]) == a  # fmt: skip
    assert for_reading(FAST, [(a, None), (b, SLOW)]) == b  # a calibrated machine's figures
    assert for_reading(FAST, [(a, None)]) == a  # -> "uncalibrated"
    assert for_reading(None, [(a, FAST), (b, SLOW)]) == a
    assert for_reading(FAST, []) is None
    assert gap(FAST, FAST) == 0.0
    assert gap(FAST, Calibration(FAST.figures, threads=2)) >= 100.0  # threads: another machine


def test_writing_never_lands_on_another_machines_file(tmp_path: Path) -> None:
    slug = "k"
    a, b = tmp_path / "k.json", tmp_path / "k.m2.json"
    assert for_writing(FAST, [], tmp_path, slug) == a
    assert for_writing(SLOW, [(a, FAST)], tmp_path, slug) == b
    assert for_writing(SLOWER, [(a, FAST), (b, SLOW)], tmp_path, slug) == tmp_path / "k.m3.json"
    assert for_writing(SLOW_AGAIN, [(a, FAST), (b, SLOW)], tmp_path, slug) == b
    assert for_writing(SLOW, [(b, FAST)], tmp_path, slug) == tmp_path / "k.m3.json"  # a gap


def test_two_machines_through_the_plugin_keep_a_baseline_each(
    pytester: pytest.Pytester, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refresh on a 'fast' machine, then on a 'slow' one with the same names: two files; a
    later run on each is compared with its own file (the verdicts themselves are not the point:
    a fake server on a loaded machine)."""
    from test_pending import OWN_SPEC

    url, _ = serve(delay_s=0.001)
    (pytester.path / "perf_tests" / "specs").mkdir(parents=True)
    (pytester.path / "perf_tests" / "specs" / "calib.yaml").write_text(
        OWN_SPEC.replace("name: pending", "name: calib")
    )
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_calib=TEST)
    args = ["-p", "no:cacheprovider", "--moeperf-server-url", url, "--moeperf-results", "r.json"]
    refresh = ["--moeperf-refresh-baselines", "--moeperf-reason", "machine"]
    files = {}
    for name, figures in (("fast", "86.3,17.7"), ("slow", "24.6,5.1")):
        monkeypatch.setenv("FAKE_CALIBRATION", figures)
        pytester.runpytest_subprocess(*args, *refresh).assert_outcomes(passed=1)
        (res,) = json.loads((pytester.path / "r.json").read_text())["results"]
        files[name] = res["baseline"]["refresh"].removeprefix("written: ")
    assert files["fast"].endswith(".json") and not files["fast"].endswith(".m2.json")
    assert files["slow"].endswith(".m2.json")
    assert len(list((pytester.path / "baselines").glob("*/*.json"))) == 2
    for name, figures in (("fast", "86.3,17.7"), ("slow", "24.6,5.1")):
        monkeypatch.setenv("FAKE_CALIBRATION", figures)
        pytester.runpytest_subprocess(*args)
        (res,) = json.loads((pytester.path / "r.json").read_text())["results"]
        assert res["baseline"]["status"] == "compared", res["baseline"]
        assert res["baseline"]["path"] == files[name]
