"""The ``moeperf`` fixture's driver: spec -> server -> load -> metrics -> baseline -> verdict.

``PerfTest.run()`` is the whole flow of one perf test. Each step lives in its own module; this
one decides the order, collects what every step says into one result record, and turns gate
failures into one-line test failures (never exceptions from the summary hook).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_moeperf import markers, options, settings
from pytest_moeperf.errors import GateFailure, UsageError
from pytest_moeperf.run.figures import MbuInputs
from pytest_moeperf.run.probe import Endpoint, RunMeasurement, ServerDied
from pytest_moeperf.run.record import (
    collect_metrics,
    metric_entry,
    result_table,
    setup_key,
    slo_failures,
    spec_summary,
    stored_bracket,
    vocab_size,
)
from pytest_moeperf.server.embedded import EMBEDDED_NAME
from pytest_moeperf.server.fixture import ServerFactory
from pytest_moeperf.session import MoePerfSession, PerfResult
from pytest_moeperf.spec.model import Slo, Spec

if TYPE_CHECKING:
    from pytest_moeperf.baseline import BaselineKey
    from pytest_moeperf.report.schema import ResultRecord
    from pytest_moeperf.run.driver import RunDriver
    from pytest_moeperf.run.source import Served, ServerSource
    from pytest_moeperf.server.process import VllmServer
    from pytest_moeperf.verdict import Verdict


@dataclass(frozen=True)
class Plan:
    """Everything resolved from markers, options and the spec before anything starts."""

    spec: Spec
    slo: Slo
    slo_source: str
    runs: int
    quick: bool
    moe: markers.MoeConfigChoice
    accuracy: markers.AccuracyGate | None
    server_url: str | None
    probe_requests: int
    max_probes: int


class PerfTest:
    def __init__(self, item: pytest.Item, session: MoePerfSession, factory: ServerFactory,
                 workdir: Path) -> None:  # fmt: skip
        self.item = item
        self.session = session
        self.factory = factory
        self.workdir = workdir
        self.config = item.config
        # what one run() learns on its way, read by later steps (None until then)
        self.server: VllmServer | None = None  # the server this test started (not an external)
        self.verdicts: list[Verdict] = []  # against the stored baseline, for the table
        self._seen: dict[str, Any] = {}  # the test's baseline files as the run started
        self._candidate: tuple[Any, Any] | None = None  # (store, baseline) a refresh writes
        self._setup_key: BaselineKey | None = None  # this run's setup key, once built

    # -- plan ---------------------------------------------------------------------------------
    def plan(self) -> Plan:
        s = settings.of(self.item)  # resolved once, in preflight
        spec = s.spec.value
        if spec is None:
            raise UsageError(f"test {self.item.nodeid}", "marker", None,
                             "the moeperf fixture needs a workload spec",
                             "add @pytest.mark.moeperf_spec('cpu-smoke.yaml')")  # fmt: skip
        quick = bool(s.quick.value)
        runs = 1 if quick else int(s.runs.value)  # quick mode: one run, whatever the source
        from pytest_moeperf.run.driver import probe_budget

        probe_requests, max_probes = probe_budget(spec, quick)
        return Plan(spec, s.slo.value, s.slo.source, runs, quick, s.moe_config.value,
                    s.accuracy.value, s.server_url.value, probe_requests,
                    max_probes)  # fmt: skip

    # -- the flow -----------------------------------------------------------------------------
    def run(self) -> PerfResult:
        plan = self.plan()
        self._setup_key = None  # built afresh by each run()
        from pytest_moeperf.report.schema import MoeConfigEntry, ResultRecord

        data = ResultRecord(nodeid=self.item.nodeid, quick=plan.quick,
                            config_label=plan.moe.name)  # fmt: skip
        reasons: list[str] = []
        root = settings.of(self.item).baseline_dir.value
        from pytest_moeperf import pending
        from pytest_moeperf.baseline import BaselineStore, calibration

        # the test's baseline files as this run starts: a refresh then sees a concurrent one
        self._seen = pending.snapshot(BaselineStore(root), self.item.nodeid) if root else {}

        source = self.source(plan)
        if source.on_this_machine:  # once a session, before a server runs
            calibration.measure_for_session(self.config)
        served = source.start(plan.spec, plan.moe)
        self.server = served.server
        endpoint, model_dir, check = served.endpoint, served.model_dir, served.check
        env = self.environment(plan, served)
        from pytest_moeperf.hygiene import check_before_load  # after startup, before load

        data.hygiene, noisy = check_before_load(self.server,
                                                   env.gpu_indices, backend=env.backend,
                                                   server_url=source.url)  # fmt: skip
        if noisy:
            self.session.warn(f"{self.item.nodeid}: {noisy}")
        data.spec = spec_summary(plan)
        data.moe_config = MoeConfigEntry(name=plan.moe.name, check=check,
                                         loaded=list(self._loaded()))  # fmt: skip
        runs: list[RunMeasurement] = []  # filled run by run: a death keeps the finished ones
        partial: str | None = None
        interrupted: KeyboardInterrupt | None = None
        try:
            self._measure(plan, endpoint, model_dir, env, runs)
        except ServerDied as died:
            server = self.server
            partial = f"{died} (run {len(runs) + 1} of {plan.runs})"
            reasons.append(partial + (server.death_note() if server is not None else ""))
            data.partial = True
            data.partial_probes = died.partial
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM from a CI runner's timeout
            partial = f"interrupted ({stop or 'KeyboardInterrupt'}) during run {len(runs) + 1} " \
                      f"of {plan.runs}; the finished runs are kept"  # fmt: skip
            reasons.append(partial)
            data.partial = True
            interrupted = stop
        metrics = collect_metrics(runs)
        entries = data.metrics = {n: metric_entry(n, v, runs) for n, v in metrics.items()}
        data.search_runs = [r.to_dict() for r in runs]
        reasons.extend(slo_failures(plan, runs))
        accuracy = self._accuracy(plan, endpoint) if partial is None else None
        data.accuracy = accuracy
        data.setup = self.setup_data(plan, env, data.search_runs)
        self._baseline(plan, env, model_dir, metrics, runs, accuracy, data, reasons, partial)
        outcome = "partial" if partial else ("failed" if reasons else "passed")
        result = PerfResult(self.item.nodeid, outcome, data, table=self._table(data),
                            reasons=reasons)  # fmt: skip
        # The outcome (and a refresh's file) waits for the test body (pending.settle); an
        # interrupt skips makereport, so its result is final now.
        self.session.record(result, notify=interrupted is not None)
        if interrupted is None:
            store, baseline = self._candidate or (None, None)
            pending.defer(self.item, pending.PendingBaseline(result, self._table, store, baseline,
                                                             self._seen))  # fmt: skip
        for name, entry in entries.items():
            self.item.user_properties.append((f"moeperf.{name}", entry.center))
        self.item.user_properties.append(("moeperf.outcome", outcome))
        if interrupted is not None:  # recorded first: results.json keeps what was measured
            raise interrupted
        if reasons:
            raise GateFailure("; ".join(reasons))
        return result

    def source(self, plan: Plan) -> ServerSource:
        """The server this test measures: one it starts, or the external URL it was given."""
        from pytest_moeperf.run.source import ExternalUrl, LocalVllm

        if plan.server_url:
            return ExternalUrl(self.config, plan.server_url)
        return LocalVllm(self.config, self.factory, self.model_dir)

    def _loaded(self) -> tuple[str, ...]:
        return self.server.moe_observation().loaded if self.server is not None else ()

    def model_dir(self, spec: Spec) -> Path:
        loc = spec.model_location()
        if loc == EMBEDDED_NAME:
            from pytest_moeperf.server.embedded import ensure_embedded_model

            return ensure_embedded_model(settings.of(self.item).cache_dir.value)
        p = Path(loc)
        models = settings.of(self.item).models_dir
        if not p.is_absolute():
            p = models.value / loc
        if not p.is_dir():
            raise UsageError(spec.source, "model.path", spec.model.path, f"no model folder {p}",
                             "use 'embedded', a folder relative to the spec, or a name under "
                             f"{models.value} (models folder: {models.source})")  # fmt: skip
        return p

    def environment(self, plan: Plan, served: Served) -> Any:
        from pytest_moeperf import environment

        engine = self.source(plan).engine(served)
        return environment.collect(engine_version=engine.version, backend_hint=engine.backend,
                                   gpus_needed=plan.spec.parallelism.gpus,
                                   cwd=Path(self.config.rootpath),
                                   devices=engine.devices)  # fmt: skip

    def driver(self, plan: Plan, model_dir: Path | None, env: Any) -> RunDriver:
        """The run driver: meter (hook or NVML), prompt vocabulary, MBU inputs, progress."""
        from pytest_moeperf.metrics.energy import make_default_meter
        from pytest_moeperf.run.driver import RunDriver, warm_levels

        meter = self.config.hook.pytest_moeperf_energy_meter(
            config=self.config, device_indices=list(env.gpu_indices)
        ) or self.source(plan).energy_fallback(tuple(env.gpu_indices))
        if meter is None:
            meter = make_default_meter(list(env.gpu_indices))
        return RunDriver(plan.spec, plan.slo, meter, vocab_size(model_dir),
                         self._mbu_inputs(plan, model_dir, env), plan.probe_requests,
                         plan.max_probes, say=self.say, probe_start=self._probe_start,
                         warm=warm_levels(plan.spec, gpu=bool(env.gpu_indices)),
                         records_dir=self._records_dir(plan))  # fmt: skip

    def _records_dir(self, plan: Plan) -> Path | None:
        """``--moeperf-records``' folder for this test and config, or None."""
        from pytest_moeperf.baseline.key import safe_name

        raw = options.resolve(self.config, "moeperf_records").value
        if raw is None:
            return None
        return options.rooted(self.config, raw) / safe_name(self.item.nodeid) / safe_name(
            plan.moe.name)  # fmt: skip

    def _probe_start(self, endpoint: Endpoint, run_number: int, probe_number: int,
                     rate: float) -> None:  # fmt: skip
        self.config.hook.pytest_moeperf_probe_start(
            config=self.config, nodeid=self.item.nodeid, run_number=run_number,
            probe_number=probe_number, rate=rate, server_pid=endpoint.server_pid)  # fmt: skip

    def say(self, line: str) -> None:
        """One progress line on the terminal, through output capture (-s not needed)."""
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            tr.write_line(line)

    def _measure(self, plan: Plan, endpoint: Endpoint, model_dir: Path | None,
                 env: Any, out: list[RunMeasurement]) -> None:  # fmt: skip
        """Appends run by run, so a server death keeps the runs that finished."""
        driver = self.driver(plan, model_dir, env)
        seed = self._baseline_bracket(plan, env, model_dir)
        driver.warm_up(endpoint, f"moeperf {self.item.name}", seeded=seed is not None)
        if seed is not None:
            met, missed, path = seed
            with contextlib.suppress(ValueError):  # shown from the rootdir where it lies there
                path = str(Path(path).relative_to(self.config.rootpath))
            driver.seed_bracket(endpoint, f"moeperf {self.item.name}", met, missed, path)
        label = f"moeperf {self.item.name}: run {{}}/{plan.runs}"
        for i in range(plan.runs):
            out.append(driver.run(endpoint, i, label.format(i + 1)))

    def _mbu_inputs(self, plan: Plan, model_dir: Path | None, env: Any) -> MbuInputs | None:
        from pytest_moeperf.metrics.hardware import rated_bandwidth
        from pytest_moeperf.metrics.mbu import step_dtypes
        from pytest_moeperf.metrics.model_shape import load_model_shape

        if model_dir is None or not (model_dir / "config.json").exists():
            return None
        override = settings.of(self.item).hbm_bandwidth.value
        override_bs = float(override) * 1e12 if override else None
        if env.accelerator == "cpu" and override_bs is None:
            return MbuInputs(
                None,
                plan.spec.model.dtype,
                1,
                None,
                "no rated HBM bandwidth for a CPU (set --moeperf-hbm-bandwidth)",
            )
        spec = plan.spec
        try:
            dt = step_dtypes(spec.model.dtype, spec.engine_arg("quantization"),
                             spec.engine_arg("kv-cache-dtype"))  # fmt: skip
        except UsageError as e:
            return MbuInputs(None, spec.model.dtype, 1, None, str(e))
        bw, source = rated_bandwidth(env.accelerator, override_bs)
        shape = load_model_shape(model_dir / "config.json")
        return MbuInputs(shape, dt.weights, max(1, env.gpu_count), bw, source, dt.kv, dt.lm_head)

    def _accuracy(self, plan: Plan, endpoint: Endpoint) -> dict[str, Any] | None:
        if plan.accuracy is None:
            return None
        from pytest_moeperf.accuracy import run_gsm8k

        limit = plan.accuracy.limit
        scope = f"first {limit} questions (marker limit)" if limit else "all questions"
        if plan.quick:
            limit = min(limit or 20, 20)
            scope = f"first {limit} questions (quick mode limit; marker: {plan.accuracy.limit})"
        result = run_gsm8k(endpoint.base_url, endpoint.model, shots=plan.accuracy.shots,
                           limit=limit)  # fmt: skip
        return {**result.to_dict(), "scope": scope}

    def setup_data(self, plan: Plan, env: Any,
                   search_runs: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
        """The setup block of the result. It carries the session's host calibration too: a
        result judged "another machine" by it shows there what this machine measured (an H100
        night, 2026-12-07, printed only the figure that moved and the results kept neither)."""
        from pytest_moeperf.baseline import calibration
        from pytest_moeperf.metrics.hardware import rated_bandwidth

        p = plan.spec.parallelism
        energy = [e for r in search_runs for e in r["energy"]]
        source = energy[0]["method"] if energy else "not_measured"
        override = settings.of(self.item).hbm_bandwidth.value
        bw, _ = rated_bandwidth(env.accelerator, float(override) * 1e12 if override else None)
        quant = plan.spec.engine_arg("quantization")
        cal = calibration.for_key(self.config, env.gpus)
        return {**env.to_dict(), "model": plan.spec.model.path, "dtype": plan.spec.model.dtype,
                "quantization": quant, "tp": p.tensor, "dp": p.data, "ep": p.expert,
                "pp": p.pipeline, "gpus_per_server": p.gpus,
                "power_source": source, "command": self.session.payload()["command"],
                "rated_bandwidth_tb_s": bw / 1e12 if bw else None,
                "calibration": cal.to_dict() if cal else None}  # fmt: skip

    def _key(self, plan: Plan, env: Any, model_dir: Path | None) -> BaselineKey:
        """The setup this run is stored and compared under (``baseline.key``): built once a
        run (it hashes the model's files), read by the seed and by the baseline step."""
        if self._setup_key is None:
            folder = self.server.config.tuned_config_folder if self.server is not None else None
            self._setup_key = setup_key(self.config, plan, env, model_dir, folder)
        return self._setup_key

    def _baseline_bracket(self, plan: Plan, env: Any,
                          model_dir: Path | None) -> tuple[float, float, str] | None:  # fmt: skip
        """Where the first search starts when this run compares against a stored baseline
        (``record.stored_bracket``); never when refreshing (a new baseline rests on nothing
        stored) or in quick mode."""
        s = settings.of(self.item)
        if s.refresh_baselines.value or plan.quick or s.baseline_dir.value is None:
            return None
        return stored_bracket(s.baseline_dir.value, self.item.nodeid,
                              self._key(plan, env, model_dir))  # fmt: skip

    def _baseline(self, plan: Plan, env: Any, model_dir: Path | None,
                  metrics: dict[str, list[float]], runs: list[RunMeasurement],
                  accuracy: dict[str, Any] | None, data: ResultRecord, reasons: list[str],
                  partial: str | None) -> None:  # fmt: skip
        from pytest_moeperf import gates
        from pytest_moeperf.baseline import BaselineStore
        from pytest_moeperf.report.schema import BaselineEntry, VerdictEntry

        s = settings.of(self.item)
        root = s.baseline_dir.value
        assert root is not None
        store = BaselineStore(root)
        key = self._key(plan, env, model_dir)
        test_id = self.item.nodeid
        target = self.item.nodeid.split("::")[0]
        outcome = gates.compare(
            store,
            test_id,
            key,
            metrics,
            ci_mode=bool(s.ci.value),
            allow_other_hardware=bool(s.allow_other_hardware.value),
            target=target,
            accuracy=accuracy,
            accuracy_gate=plan.accuracy,
            refreshing=bool(s.refresh_baselines.value),
            candidate_runs=[r.to_dict() for r in runs],
        )
        self.verdicts = list(outcome.verdicts)
        data.verdicts = [VerdictEntry.model_validate(v.to_dict()) for v in outcome.verdicts]
        block = data.baseline = BaselineEntry(path=outcome.path, status=outcome.status)
        # assigned, not passed: validation would copy the list, and the notes below go in it
        warnings = block.warnings = list(outcome.warnings)
        if outcome.accuracy is not None and data.accuracy is not None:
            data.accuracy["verdict"] = outcome.accuracy
        for w in outcome.warnings:
            self.session.warn(f"{test_id}: {w}")
        reasons.extend(outcome.failures)
        refreshing = bool(s.refresh_baselines.value)
        if refreshing and not plan.quick and accuracy is not None and plan.accuracy is not None:
            from pytest_moeperf.accuracy.health import refresh_refusal

            refused = refresh_refusal(accuracy, plan.accuracy)  # failed requests, near zero
            if refused:
                reasons.append(refused)
        if refreshing:
            from pytest_moeperf.run.refresh import why_not_written

            refusal = why_not_written(
                runs=runs, planned_runs=plan.runs, quick=plan.quick, partial=partial,
                reasons=reasons, status=outcome.status, path=outcome.path,
                had_runs=max((v.n_baseline for v in self.verdicts), default=0),
                verdicts=self.verdicts,
            )  # fmt: skip
            if refusal.why is not None:
                block.status = "not-written"
                block.refresh = f"not-written: {refusal.why}"
                self.session.warn(f"{test_id}: baseline not-written: {refusal.why}")
                return
            if refusal.note is not None:
                warnings.append(refusal.note)
                self.session.warn(f"{test_id}: {refusal.note}")
            run_dicts = [r.to_dict() for r in runs]  # stalled but first: written, with a warning
            self._candidate = (store, gates.candidate(
                test_id, key, metrics, run_dicts, accuracy=accuracy,
                reason=str(s.reason.value or "")))  # fmt: skip
            block.status = "pending"
            block.refresh = "pending: written once the test body has passed"
            from pytest_moeperf.verdict.server_cost import capped, stalled_recording

            notes = [f"this baseline was {stalled}"] if (
                stalled := stalled_recording(run_dicts)) is not None else []  # fmt: skip
            if all(capped(r) for r in run_dicts):
                notes.append("this baseline's boundary is a floor: every run met the SLO at "
                             "search.rate_max, so SLO goodput compared with it reads "
                             "inconclusive while both sides meet the cap")  # fmt: skip
            for note in notes:
                warnings.append(note)
                self.session.warn(f"{test_id}: {note}")

    def _table(self, data: ResultRecord) -> str:
        return result_table(data, self.verdicts)
