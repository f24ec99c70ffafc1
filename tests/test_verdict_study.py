"""The analysis of ``benchmarks/verdict_study.py`` on synthetic and recorded-shaped runs.

No server: the combinations, the counting (per metric and "the test fails"), detection at a
known shift, the reading of results / captured records, the resampling, and the step-delay
plugin's sleep accounting. The study's real runs are in docs/results/verdict-study-*/.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.load.records import RequestRecord, RunRecord

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


def _load(name: str, path: Path) -> types.ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


vs = _load("verdict_study", BENCH / "verdict_study.py")
from verdict_study_helpers import step_delay  # type: ignore[import-not-found]  # noqa: E402

GOODPUT = "slo_goodput_tok_s"
TTFT = "ttft_p99_ms"


def run(
    batch: str,
    i: int,
    goodput: float,
    ttft: float = 400.0,
    *,
    complete: bool = True,
    fraction: float = 0.0,
    **extra: float,
) -> Any:
    return vs.RunData(batch, i, fraction, {GOODPUT: goodput, TTFT: ttft, **extra}, complete)


def session(name: str, values: list[float], fraction: float = 0.0, **kw: Any) -> Any:
    return vs.Session(
        name, fraction, [run(name, i, v, fraction=fraction, **kw) for i, v in enumerate(values)]
    )


def noisy(
    name: str,
    n: int,
    rng: random.Random,
    *,
    cv: float = 0.01,
    level: float = 1.0,
    fraction: float = 0.0,
) -> Any:
    return vs.Session(
        name,
        fraction,
        [
            run(
                name,
                i,
                470.0 * level * math.exp(rng.gauss(0, cv)),
                400.0 / level * math.exp(rng.gauss(0, cv)),
                fraction=fraction,
            )
            for i in range(n)
        ],
    )


# -- combinations --------------------------------------------------------------------------
def test_across_sessions_counts_every_ordered_pair_of_subsets() -> None:
    a = session("a", [470, 471, 469, 470, 472])
    b = session("b", [470, 468, 471, 470])
    t = vs.aa_across([a, b], 3)
    assert t.n == 10 * 4 + 4 * 10  # C(5,3) x C(4,3), both ways
    assert sum(t.by_metric[GOODPUT].values()) == t.n


def test_within_session_subsets_are_disjoint() -> None:
    s = session("a", [470, 471, 469, 470, 472, 471])
    assert vs.aa_within([s], 3).n == 20  # C(6,3) baselines, each with its one complement
    assert vs.aa_within([session("b", [470, 471, 469, 470, 472])], 3).n == 0  # 5 < 3 + 3


def test_incomplete_runs_never_form_a_baseline_but_are_judged_as_candidates() -> None:
    a = session("a", [470, 471, 469])
    a.runs[0].complete = False
    b = session("b", [470, 468, 471])
    assert len(vs.subsets(a.runs, 3, complete_only=True)) == 0
    assert len(vs.subsets(a.runs, 3)) == 1
    assert vs.aa_across([a, b], 3).n == 1  # only b's baseline against a's runs


# -- counting -------------------------------------------------------------------------------
def test_a_clear_drop_is_regressed_every_time_and_fails_the_test() -> None:
    rng = random.Random(1)
    base = noisy("unchanged-1", 5, rng)
    slow = noisy("slow", 3, rng, level=0.7, fraction=0.3)
    t = vs.detection(slow, [base], 3)
    assert t.n == 10
    assert t.by_metric[GOODPUT]["regressed"] == 10
    assert t.by_metric[TTFT]["regressed"] == 10
    assert t.failed == 10 and t.rate() == 1.0
    # the other way round it is an improvement, which never fails a test
    back = vs.detection(base, [slow], 3)
    assert back.by_metric[GOODPUT]["improved"] == back.n and back.failed == 0


def test_an_informational_metric_regressing_does_not_fail_the_test() -> None:
    b = [run("a", i, 470.0 + i * 0.1, power_w=100.0 + i * 0.1) for i in range(3)]
    c = [run("b", i, 470.0 + i * 0.1, power_w=150.0 + i * 0.1) for i in range(3)]
    t = vs.compare_sets([b], [c], vs.Tally())
    assert t.by_metric["power_w"]["regressed"] == 1
    assert t.failed == 0


def test_a_metric_only_one_side_measured_is_not_judged() -> None:
    b = [run("a", i, 470.0 + i, mbu=0.5) for i in range(3)]
    c = [run("b", i, 470.0 + i) for i in range(3)]
    t = vs.compare_sets([b], [c], vs.Tally())
    assert "mbu" not in t.by_metric and GOODPUT in t.by_metric


def test_false_alarms_on_quiet_synthetic_runs_stay_low() -> None:
    rng = random.Random(7)
    sessions = [noisy(f"u{i}", 6, rng) for i in range(3)]
    t = vs.aa_across(sessions, 3)
    assert t.n == 6 * 20 * 20
    assert t.rate() <= 0.02  # the verdict's alpha is 1 % per metric, two gating metrics here


def test_tally_rates_and_dict() -> None:
    t = vs.Tally()
    rate = t.rate()
    assert rate is None
    b = [run("a", i, 470.0 + i) for i in range(3)]
    t = vs.compare_sets([b], [b], t)
    d = t.to_dict()
    assert d["comparisons"] == 1 and d["test_failed"] == 0
    assert d["by_metric"][GOODPUT]["n"] == 1 and d["by_metric"][GOODPUT]["regressed_rate"] == 0


# -- known shifts ---------------------------------------------------------------------------
def test_shift_curve_detects_a_known_shift_and_not_a_null_one() -> None:
    rng = random.Random(3)
    sessions = [noisy(f"u{i}", 5, rng, cv=0.01) for i in range(2)]
    pairs = vs.aa_pairs(sessions, 3, limit=200)
    assert len(pairs) == 200
    curve = dict(vs.shift_curve(pairs, GOODPUT, grid=(0.0, 0.005, 0.2, 0.5)))
    assert curve[0.0] <= 0.02
    assert curve[0.2] == 1.0 and curve[0.5] == 1.0
    s95 = vs.first_reaching(list(curve.items()), 0.95)
    assert s95 == 0.2


def test_shifted_moves_each_metric_the_bad_way() -> None:
    assert vs.shifted([100.0], GOODPUT, 0.1) == [pytest.approx(90.0)]
    assert vs.shifted([100.0], TTFT, 0.1) == [pytest.approx(110.0)]


def test_first_reaching_needs_every_larger_shift_to_reach_the_goal() -> None:
    assert vs.first_reaching([(0.1, 0.96), (0.2, 0.9), (0.3, 0.97), (0.4, 1.0)], 0.95) == 0.3
    assert vs.first_reaching([(0.1, 0.5), (0.2, 0.9)], 0.95) is None
    assert vs.first_reaching([(0.1, math.nan)], 0.95) is None


def test_sensitivity_is_the_slope_of_the_observed_change() -> None:
    u = session("u", [100.0, 100.0, 100.0])
    s5 = session("s5", [95.0, 95.0, 95.0], fraction=0.05)
    s10 = session("s10", [90.0, 90.0, 90.0], fraction=0.10)
    sens = vs.sensitivity([s5, s10], [u], [GOODPUT])[GOODPUT]
    assert sens["change"] == {"0.05": pytest.approx(-0.05), "0.1": pytest.approx(-0.10)}
    assert sens["per_unit_fraction"] == pytest.approx(-1.0)
    logs = (0.05 * math.log(0.95) + 0.1 * math.log(0.9)) / (0.05**2 + 0.1**2)
    assert sens["log_per_unit_fraction"] == pytest.approx(logs)


def test_projected_detection_grows_with_the_injected_fraction() -> None:
    rng = random.Random(5)
    sessions = [noisy(f"u{i}", 4, rng, cv=0.01) for i in range(2)]
    pairs = vs.aa_pairs(sessions, 3, limit=32)
    curve = dict(vs.projected_any(pairs, grid=(0.0, 0.3)))
    assert curve[0.0] <= 0.1 and curve[0.3] == 1.0


# -- band -----------------------------------------------------------------------------------
def test_band_width_is_the_verdicts_own() -> None:
    s = session("u", [100.0, 101.0, 99.0])
    w = vs.band_widths([s], 3, GOODPUT)
    from scipy.special import stdtrit

    logs = [math.log(x) for x in (100.0, 101.0, 99.0)]
    m = sum(logs) / 3
    sb = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    half = float(stdtrit(2, 0.99)) * sb * math.sqrt(2 / 3)
    assert w is not None and w["median"] == pytest.approx(-math.expm1(-half))  # the lower edge
    assert vs.run_cv([s], GOODPUT) == pytest.approx(sb)


def test_runs_for_is_the_verdicts_own_advice() -> None:
    from pytest_moeperf.verdict import runs_needed

    got = vs.runs_for(0.015)
    assert got is not None and set(got) == {"0.03", "0.05", "0.1"}
    assert got["0.03"] == runs_needed(0.015, math.log1p(0.03), alpha=0.01, power=0.95)
    assert got["0.03"] > got["0.05"] > got["0.1"]
    assert vs.runs_for(None) is None


# -- reading results and records ------------------------------------------------------------
def _result(boundary: float) -> dict[str, Any]:
    probes = [
        {"rate": 4.0, "met": True},
        {"rate": 16.0, "met": False},
        {"rate": boundary, "met": True},
    ]
    return {
        "search_runs": [
            {
                "index": 0,
                "converged": True,
                "boundary_rate": boundary,
                "probes": probes,
                "metrics": {GOODPUT: 469.4, "slo_rate_rps": boundary, TTFT: 393.7, "mbu": None},
            },
            {
                "index": 1,
                "converged": False,
                "boundary_rate": None,
                "probes": probes[:2],
                "metrics": {GOODPUT: None},
            },
        ]
    }


def _record(n: int, seed: int, gap: float = 0.05) -> RunRecord:
    rng = random.Random(seed)
    reqs = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / gap)
        first = t + 0.02 + rng.random() * 0.01
        times = [first + 0.004 * j for j in range(32)]
        reqs.append(RequestRecord(i, t, t, 128, 32, "ok", first, times[-1], 32, times))
    return RunRecord("poisson", 1 / gap, 1.0, 0, t, reqs, 0.0)


def test_runs_from_result_keeps_none_out_and_marks_incomplete_runs() -> None:
    runs = vs.runs_from_result("b", 0.0, _result(14.5))
    assert runs[0].metrics == {GOODPUT: 469.4, "slo_rate_rps": 14.5, TTFT: 393.7}
    assert runs[0].complete and not runs[1].complete and runs[1].metrics == {}
    assert vs.boundary_probe_number(_result(14.5)["search_runs"][0]) == 3


def test_attach_records_takes_the_last_capture_of_the_boundary_probe() -> None:
    res = _result(14.5)
    runs = vs.runs_from_result("b", 0.0, res)
    early, kept, other = _record(5, 1), _record(7, 2), _record(9, 3)
    lines = [
        json.dumps({"pytest_moeperf": "/x/pytest_moeperf/__init__.py"}),
        json.dumps({"run": 1, "probe": 3, "rate": 14.5, "record": early.to_dict()}),
        json.dumps({"run": 1, "probe": 3, "rate": 14.5, "record": kept.to_dict()}),
        json.dumps({"run": 1, "probe": 2, "rate": 16.0, "record": other.to_dict()}),
        "",
    ]
    vs.attach_records(runs, res, lines)
    assert runs[0].boundary_records is not None and len(runs[0].boundary_records) == 7
    assert runs[1].boundary_records is None


def test_resampling_reproduces_and_varies_around_the_run() -> None:
    from pytest_moeperf.run.window import summarize_steady
    from pytest_moeperf.spec.loader import load_spec

    spec = load_spec(vs.SPEC)
    rec = _record(200, 4)
    s = summarize_steady(rec, spec.slo, spec)
    r = vs.RunData(
        "b",
        0,
        0.0,
        {GOODPUT: s.output_tok_s, TTFT: s.ttft.p99_ms, "slo_rate_rps": 20.0},
        True,
        20.0,
        rec.requests,
    )
    assert vs.reproduce(r, spec) == pytest.approx(0.0, abs=1e-12)
    r.metrics[GOODPUT] *= 1.1
    assert vs.reproduce(r, spec) == pytest.approx(1 - 1 / 1.1)
    pool = vs.pseudo_pool(r, spec, 30, random.Random(0))
    assert len(pool) == 30 and all(p.metrics["slo_rate_rps"] == 20.0 for p in pool)
    goodputs = [p.metrics[GOODPUT] for p in pool]
    assert len(set(goodputs)) > 1  # resampled, not copied
    assert abs(sum(goodputs) / len(goodputs) / s.output_tok_s - 1) < 0.05


def test_bootstrap_draws_distinct_real_runs_per_side() -> None:
    rng = random.Random(2)
    a, b = noisy("a", 4, rng), noisy("b", 4, rng)
    pools = {r.label: [r] for s in (a, b) for r in s.runs}  # a pseudo-run = the run itself
    t = vs.bootstrap([a, b], [a, b], pools, 3, 50, rng, same_session=False)
    assert t.n == 50
    assert vs.bootstrap([a], [a], pools, 3, 10, rng, same_session=False).n == 0  # no pair
    assert vs.bootstrap([a], [a], pools, 3, 10, rng, same_session=True).n == 0  # 4 < 3 + 3


def test_load_sessions_reads_finished_batches_only(tmp_path: Path) -> None:
    for name, started, meta in (
        ("unchanged-1", 2.0, True),
        ("slow-5pct", 1.0, True),
        ("unfinished", 0.0, False),
    ):
        d = tmp_path / name
        d.mkdir()
        (d / "results.json").write_text(json.dumps({"results": [_result(14.5)]}))
        if meta:
            frac = 0.05 if name.startswith("slow") else 0.0
            (d / "meta.json").write_text(
                json.dumps({"fraction": frac, "started": started, "wall_s": 60.0, "runs": 2})
            )
    sessions = vs.load_sessions(tmp_path)
    assert [s.name for s in sessions] == ["slow-5pct", "unchanged-1"]
    assert sessions[0].fraction == 0.05 and len(sessions[1].runs) == 2


def test_a_finished_batch_is_not_run_again(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "meta.json").write_text(json.dumps({"wall_s": 5.0, "x": 1}))
    meta = vs.run_batch(tmp_path, vs.Batch("b", 0.0, 3), tmp_path, lock=False)
    assert meta == {"wall_s": 5.0, "x": 1}


def test_the_full_plan_puts_the_slowed_sessions_between_unchanged_ones() -> None:
    plan = vs.full_plan(2, 10, 3)
    assert [(b.name, b.fraction, b.runs) for b in plan] == [
        ("unchanged-1", 0.0, 10),
        ("slow-3pct", 0.03, 3),
        ("slow-5pct", 0.05, 3),
        ("slow-10pct", 0.10, 3),
        ("unchanged-2", 0.0, 10),
    ]


def test_analyze_and_markdown_on_synthetic_sessions() -> None:
    rng = random.Random(11)
    sessions = [
        noisy("unchanged-1", 4, rng),
        noisy("slow-10pct", 3, rng, level=0.5, fraction=0.1),
        noisy("unchanged-2", 4, rng),
    ]
    for s in sessions:
        s.meta = {"wall_s": 100.0, "load_before": [0.1], "load_after": [0.2]}
    fig = vs.analyze(sessions, k=3, boot_n=20, pool_n=2, shift_pairs=16)
    assert fig["aa_across"]["comparisons"] == 2 * 4 * 4
    assert fig["detection"]["0.1"]["test_failed_rate"] == 1.0
    assert fig["resampling"]["runs_with_records"] == 0
    text = vs.markdown(fig)
    assert "| 10 % slower steps, real runs |" in text
    assert "100.0 % (8/8)" in text  # 1 candidate subset x 4 + 4 baseline subsets, all caught
    json.dumps(fig)  # the figures file is plain JSON


# -- the step-delay plugin ------------------------------------------------------------------
class FakeTime:
    """A clock whose sleeps overshoot by 60 us, as time.sleep does."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s + 60e-6


def test_step_delay_pays_its_debt_despite_sleep_overshoot() -> None:
    t = FakeTime()
    d = step_delay.StepDelay(0.03, clock=t.clock, sleep=t.sleep)

    def step() -> None:
        t.now += 0.002  # 2 ms of compute: 60 us owed per step, as much as one overshoot

    wrapped = d.wrap(step)
    for _ in range(1000):
        wrapped()
    assert d.busy_s == pytest.approx(2.0)
    assert d.slept_s / d.busy_s == pytest.approx(0.03, abs=0.0001)
    assert d.calls == 1000


def test_step_delay_off_sleeps_never() -> None:
    t = FakeTime()
    d = step_delay.StepDelay(0.0, clock=t.clock, sleep=t.sleep)
    d.after(0.01)
    assert d.slept_s == 0 and t.now == 0


def test_step_delay_reads_a_changed_fraction_file(tmp_path: Path) -> None:
    f = tmp_path / "fraction"
    f.write_text("0")
    t = FakeTime()
    d = step_delay.StepDelay(0.0, file=f, clock=t.clock, sleep=t.sleep)
    d.after(0.001)
    assert d.fraction == 0.0
    f.write_text("0.1")
    import os

    os.utime(f, (1e9, 1e9))
    t.now += 1.0
    d.after(0.001)  # reads the file after this call
    d.after(0.01)
    assert d.fraction == 0.1
    assert d.by_fraction["0.1"][0] == pytest.approx(0.01)


def test_patch_module_wraps_once_and_keeps_results() -> None:
    class Runner:
        def execute_model(self, x: int) -> int:
            return x + 1

        def sample_tokens(self, g: int) -> int:
            return g * 2

    mod = types.ModuleType("fake_runner")
    mod.GPUModelRunner = Runner  # type: ignore[attr-defined]
    t = FakeTime()
    d = step_delay.StepDelay(0.5, clock=t.clock, sleep=t.sleep)
    step_delay.patch_module(mod, d)
    step_delay.patch_module(mod, d)
    r = Runner()
    assert r.execute_model(1) == 2 and r.sample_tokens(3) == 6
    assert d.calls == 2  # wrapped once, not twice


def test_register_with_no_fraction_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(step_delay.FRACTION_ENV, "0")
    monkeypatch.delenv(step_delay.FILE_ENV, raising=False)
    before = list(sys.meta_path)
    step_delay.register()
    assert sys.meta_path == before


def test_register_with_a_fraction_hooks_the_model_runner_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(step_delay.FRACTION_ENV, "0.05")
    monkeypatch.delenv(step_delay.FILE_ENV, raising=False)
    monkeypatch.delitem(sys.modules, step_delay.TARGET, raising=False)
    before = list(sys.meta_path)
    try:
        step_delay.register()
        hooks = [f for f in sys.meta_path if f not in before]
        assert len(hooks) == 1 and getattr(hooks[0], "delay").fraction == 0.05  # noqa: B009
        step_delay.register()  # loaded twice in one process: still one hook
        assert len([f for f in sys.meta_path if f not in before]) == 1
    finally:
        sys.meta_path[:] = before


def test_spin_mode_holds_the_core_for_exactly_what_is_owed() -> None:
    t = FakeTime()
    ticks = []

    def clock() -> float:
        t.now += 1e-5  # every look at the clock costs 10 us of spinning
        ticks.append(t.now)
        return t.now

    d = step_delay.StepDelay(0.1, clock=clock, sleep=t.sleep, mode="spin")
    d.after(0.01)
    assert d.slept_s == pytest.approx(0.001, abs=2e-5)
    assert d.by_fraction == {"spin:0.1": [0.01, pytest.approx(0.001, abs=2e-5)]}
    assert step_delay.parse_delay("spin:0.05") == ("spin", 0.05)
    assert step_delay.parse_delay("0.05") == ("sleep", 0.05)
    with pytest.raises(ValueError):
        step_delay.parse_delay("nap:0.05")


def test_fixed_mode_owes_the_same_time_every_model_step_whatever_its_compute() -> None:
    class Runner:
        def execute_model(self, x: int) -> int:
            t.now += 0.001 * x  # compute grows with the batch
            return x

        def sample_tokens(self, g: int) -> int:
            t.now += 0.0005
            return g

    mod = types.ModuleType("fake_runner")
    mod.GPUModelRunner = Runner  # type: ignore[attr-defined]
    t = FakeTime()
    d = step_delay.StepDelay(0.1, clock=t.clock, sleep=t.sleep, mode="fixed")
    step_delay.patch_module(mod, d)
    r = Runner()
    for x in (1, 5, 20, 1):
        r.execute_model(x)
        r.sample_tokens(x)
    # 0.1 s per execute_model, nothing after sample_tokens, overshoot paid back
    assert d.slept_s == pytest.approx(0.4, abs=1e-4)
    assert d.calls == 8
    assert step_delay.parse_delay("fixed:0.1") == ("fixed", 0.1)
    assert "fixed:0.1" in d.by_fraction


def test_parse_fraction() -> None:
    assert step_delay.parse_fraction(None) == 0.0
    assert step_delay.parse_fraction(" ") == 0.0
    assert step_delay.parse_fraction("0.05") == 0.05
    with pytest.raises(ValueError):
        step_delay.parse_fraction("-0.1")


def test_the_dist_info_declares_the_plugin_to_vllm(tmp_path: Path) -> None:
    folder = vs.plugin_dir(tmp_path)
    dists = list(importlib.metadata.distributions(path=[str(folder)]))
    assert [d.metadata["Name"] for d in dists] == ["moeperf-step-delay"]
    (ep,) = [e for e in dists[0].entry_points if e.group == "vllm.general_plugins"]
    assert ep.value == "verdict_study_helpers.step_delay:register"
    env = vs.batch_env(folder, 0.05, tmp_path / "s", tmp_path / "r.jsonl")
    assert env["PYTHONPATH"].split(":")[:2] == [str(BENCH), str(folder)]
    assert env["MOEPERF_STEP_DELAY"] == "spin:0.05"
    assert vs.batch_env(folder, 0.0, None, None)["MOEPERF_STEP_DELAY"] == "0"
    assert vs.batch_env(folder, 0.05, None, None, mode="sleep")["MOEPERF_STEP_DELAY"] == "0.05"


# -- other servers on the machine -----------------------------------------------------------
def test_foreign_servers_sees_others_but_not_its_own_children() -> None:
    import subprocess
    import time

    sleep = [sys.executable, "-c", "import time; time.sleep(10)"]
    server = subprocess.Popen([*sleep, "VLLM::EngineCore"])  # a vLLM-like process of ours
    bystander = subprocess.Popen(sleep)
    try:
        for _ in range(50):  # until both have exec'd python
            if vs.foreign_servers(me=bystander.pid):
                break
            time.sleep(0.1)
        assert server.pid in vs.foreign_servers(me=bystander.pid)  # not below the bystander
        assert server.pid not in vs.foreign_servers()  # below this process: the study's own
    finally:
        for p in (server, bystander):
            p.kill()
            p.wait()


def test_wait_quiet_gives_up_after_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vs, "foreign_servers", lambda: [123])
    got = vs.wait_quiet(100.0, 0.0, every_s=0.0)
    assert got["quiet"] is False and got["foreign"] == 1
    monkeypatch.setattr(vs, "foreign_servers", lambda: [])
    got = vs.wait_quiet(100.0, 10.0, settle=2, every_s=0.0)
    assert got["quiet"] is True


def test_monitor_counts_samples_with_another_server(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = iter([[1], [], [1, 2]] + [[]] * 100)
    monkeypatch.setattr(vs, "foreign_servers", lambda: next(calls))
    import time

    with vs.Monitor(every_s=0.01) as mon:
        time.sleep(0.2)
    s = mon.summary()
    assert s["samples"] >= 3 and s["foreign_server_samples"] == 2
    assert s["foreign_server_s"] == pytest.approx(0.02)
