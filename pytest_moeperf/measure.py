"""The ``moeperf`` fixture's driver: spec -> server -> load -> metrics -> baseline -> verdict.

``PerfTest.run()`` is the whole flow of one perf test. Each step lives in its own module; this
one decides the order, collects what every step says into one result record, and turns gate
failures into one-line test failures (never exceptions from the summary hook).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf import markers, options
from pytest_moeperf.errors import MoePerfError, UsageError
from pytest_moeperf.load.probe import Endpoint, MbuInputs, RunMeasurement, ServerDied
from pytest_moeperf.server.embedded import EMBEDDED_NAME
from pytest_moeperf.server.fixture import ServerFactory
from pytest_moeperf.session import MoePerfSession, PerfResult
from pytest_moeperf.spec.model import Slo, Spec

METRIC_UNITS = {"slo_goodput_tok_s": "tok/s", "slo_rate_rps": "req/s", "ttft_p99_ms": "ms",
                "tpot_p99_ms": "ms", "e2el_p99_ms": "ms", "tok_per_j": "tok/J",
                "power_w": "W", "mbu": "fraction"}  # fmt: skip


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

    # -- plan ---------------------------------------------------------------------------------
    def plan(self) -> Plan:
        from pytest_moeperf.spec.loader import load_spec

        specs_dir = Path(self.config.rootpath) / "perf_tests" / "specs"
        choice = markers.spec_choice(self.item, specs_dir)
        if choice is None:
            raise UsageError(f"test {self.item.nodeid}", "marker", None,
                             "the moeperf fixture needs a workload spec",
                             "add @pytest.mark.moeperf_spec('cpu-smoke.yaml')")  # fmt: skip
        spec = load_spec(choice.path)
        gate = markers.slo_gate(self.item)
        if gate is not None:
            slo = Slo(gate.ttft_p99_ms, gate.tpot_p99_ms, gate.e2el_p99_ms)
            slo_source = gate.source
        else:
            slo, slo_source = spec.slo, f"spec {choice.path}"
        quick = bool(options.value(self.config, "moeperf_quick"))
        runs_opt = options.value(self.config, "moeperf_runs")
        runs = 1 if quick else int(runs_opt or choice.runs or spec.runs)
        search = spec.search
        probe_requests = (search.probe_requests if search and search.probe_requests
                          else spec.workload.num_requests or 40)  # fmt: skip
        max_probes = search.max_probes if search else 7
        if quick:
            probe_requests, max_probes = max(10, probe_requests // 2), min(max_probes, 4)
        moe = markers.moe_config_choice(self.item) or markers.MoeConfigChoice(
            markers.IN_TREE, None, None, "default (in-tree)"
        )
        return Plan(spec, slo, slo_source, runs, quick, moe, markers.accuracy_gate(self.item),
                    options.value(self.config, "moeperf_server_url"), probe_requests,
                    max_probes)  # fmt: skip

    # -- the flow -----------------------------------------------------------------------------
    def run(self) -> PerfResult:
        plan = self.plan()
        data: dict[str, Any] = {"quick": plan.quick, "config_label": plan.moe.name}
        reasons: list[str] = []
        endpoint, model_dir, check = self._start(plan)
        env = self._environment(plan, endpoint)
        data["spec"] = _spec_summary(plan)
        data["moe_config"] = {"name": plan.moe.name, "check": check,
                              "loaded": list(self._loaded())}  # fmt: skip
        runs: list[RunMeasurement] = []
        partial: str | None = None
        try:
            runs = self._measure(plan, endpoint, model_dir, env)
        except ServerDied as died:
            partial = str(died)
            reasons.append(partial)
            data["partial_probes"] = died.partial
        metrics: dict[str, list[float]] = {
            n: [v for r in runs if (v := r.metrics.get(n)) is not None] for n in METRIC_UNITS
        }
        data["metrics"] = {n: _metric_entry(n, v, runs) for n, v in metrics.items()}
        data["search_runs"] = [r.to_dict() for r in runs]
        if runs and not metrics["slo_goodput_tok_s"]:
            reasons.append(f"SLO gate ({plan.slo_source}): no probed rate met p99 TTFT <= "
                           f"{plan.slo.ttft_p99_ms:g} ms and p99 TPOT <= "
                           f"{plan.slo.tpot_p99_ms:g} ms; " + runs[0].search.note)  # fmt: skip
        accuracy = self._accuracy(plan, endpoint) if partial is None else None
        data["accuracy"] = accuracy
        data["setup"] = self._setup(plan, env, data)
        self._baseline(plan, env, model_dir, metrics, runs, accuracy, data, reasons, partial)
        outcome = "partial" if partial else ("failed" if reasons else "passed")
        result = PerfResult(self.item.nodeid, outcome, data, table=self._table(data),
                            reasons=reasons)  # fmt: skip
        self.session.record(result)
        for name, entry in data["metrics"].items():
            self.item.user_properties.append((f"moeperf.{name}", entry["center"]))
        self.item.user_properties.append(("moeperf.outcome", outcome))
        if reasons:
            pytest.fail("; ".join(reasons), pytrace=False)
        return result

    def _start(self, plan: Plan) -> tuple[Endpoint, Path | None, str]:
        if plan.server_url:
            model = _served_model(plan.server_url)
            return (Endpoint(plan.server_url, model), None,
                    f"declared, not set: external server {plan.server_url}")  # fmt: skip
        model_dir = self._model_dir(plan.spec)
        args = plan.spec.vllm_args()
        self.config.hook.pytest_moeperf_server_command(config=self.config, command=args)
        server = self.factory(model_dir, args, name=plan.moe.name,
                              moe_config_folder=plan.moe.folder,
                              moe_config_files=plan.moe.files)  # fmt: skip
        self._server = server
        return (Endpoint(server.base_url, server.model_name, server.alive), model_dir,
                self.factory.checks[-1].message)  # fmt: skip

    def _loaded(self) -> tuple[str, ...]:
        server = getattr(self, "_server", None)
        return server.moe_observation().loaded if server is not None else ()

    def _model_dir(self, spec: Spec) -> Path:
        loc = spec.model_location()
        if loc == EMBEDDED_NAME:
            from pytest_moeperf.server.embedded import ensure_embedded_model

            return ensure_embedded_model(options.resolve_path(self.config, "moeperf_cache_dir"))
        p = Path(loc)
        if not p.is_absolute():
            p = Path(self.config.rootpath) / "perf_tests" / "models" / loc
        if not p.is_dir():
            raise UsageError(spec.source, "model.path", spec.model.path, f"no model folder {p}",
                             "use 'embedded', a folder relative to the spec, or a name under "
                             "perf_tests/models/")  # fmt: skip
        return p

    def _environment(self, plan: Plan, endpoint: Endpoint) -> Any:
        from pytest_moeperf import environment
        from pytest_moeperf.server.logscan import engine_version

        server = getattr(self, "_server", None)
        log = server.log_text() if server is not None else ""
        backend = (
            "external"
            if plan.server_url
            else (
                "cpu"
                if server is not None and server.moe_observation().backend == "cpu"
                else "cuda"
            )
        )
        p = plan.spec.parallelism
        return environment.collect(engine_version=engine_version(log) if log else None,
                                   backend_hint=backend,
                                   gpus_needed=p.tensor * p.data * p.pipeline,
                                   cwd=Path(self.config.rootpath))  # fmt: skip

    def _measure(self, plan: Plan, endpoint: Endpoint, model_dir: Path | None,
                 env: Any) -> list[RunMeasurement]:  # fmt: skip
        from pytest_moeperf.load.probe import measure_run
        from pytest_moeperf.metrics.energy import make_default_meter

        meter = self.config.hook.pytest_moeperf_energy_meter(
            config=self.config, device_indices=list(env.gpu_indices)
        )
        if meter is None:
            meter = make_default_meter(list(env.gpu_indices))
        vocab = _vocab_size(model_dir)
        mbu_inputs = self._mbu_inputs(plan, model_dir, env)
        spec_rate_min = (plan.spec.search.rate_min if plan.spec.search
                         else (plan.spec.arrival.rate or 1.0))  # fmt: skip
        rate_min = spec_rate_min
        out: list[RunMeasurement] = []
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        for i in range(plan.runs):

            def progress(k: int, rate: float, res: Any, i: int = i) -> None:
                s = res.summary
                if tr is None:
                    return
                capman = self.config.pluginmanager.get_plugin("capturemanager")
                with capman.global_and_fixture_disabled() if capman else _null():
                    tr.write_line(f"moeperf {self.item.name}: run {i + 1}/{plan.runs} "
                        f"probe {k + 1} "
                        f"rate {rate:.3g} req/s: {'met' if res.met else 'missed'} "
                        f"(ttft p99 {s['ttft']['p99_ms']:.0f} ms, tpot p99 "
                                  f"{s['tpot']['p99_ms']:.1f} ms, attainment "
                                  f"{100 * s['slo_attainment']:.0f} %)")  # fmt: skip

            def once(start: float, i: int = i, progress: Any = progress) -> RunMeasurement:
                return measure_run(endpoint, plan.spec, plan.slo, index=i, meter=meter,
                                   vocab_size=vocab, rate_min=start,
                                   probe_requests=plan.probe_requests,
                                   max_probes=plan.max_probes, mbu_inputs=mbu_inputs,
                                   on_probe=progress)  # fmt: skip

            run = once(rate_min)
            if run.search.boundary_rate is None and rate_min > spec_rate_min:
                # the warm start (just under the last boundary) missed: search from the spec's
                # own lowest rate rather than report a run without a boundary
                run = once(spec_rate_min)
            out.append(run)
            if run.search.boundary_rate is not None:
                rate_min = run.search.boundary_rate * 0.9  # next run starts near the boundary
        return out

    def _mbu_inputs(self, plan: Plan, model_dir: Path | None, env: Any) -> MbuInputs | None:
        from pytest_moeperf.metrics.hardware import rated_bandwidth
        from pytest_moeperf.metrics.mbu import load_model_shape

        if model_dir is None or not (model_dir / "config.json").exists():
            return None
        override = options.value(self.config, "moeperf_hbm_bandwidth")
        override_bs = float(override) * 1e12 if override else None
        if env.accelerator == "cpu" and override_bs is None:
            return MbuInputs(
                None,
                plan.spec.model.dtype,
                1,
                None,
                "no rated HBM bandwidth for a CPU (set --moeperf-hbm-bandwidth)",
            )
        bw, source = rated_bandwidth(env.accelerator, override_bs)
        shape = load_model_shape(model_dir / "config.json")
        return MbuInputs(shape, plan.spec.model.dtype, max(1, env.gpu_count), bw, source)

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

    def _setup(self, plan: Plan, env: Any, data: dict[str, Any]) -> dict[str, Any]:
        p = plan.spec.parallelism
        energy = [e for r in data["search_runs"] for e in r["energy"]]
        source = energy[0]["method"] if energy else "not_measured"
        return {**env.to_dict(), "model": plan.spec.model.path, "dtype": plan.spec.model.dtype,
                "quantization": None, "tp": p.tensor, "dp": p.data, "ep": p.expert,
                "power_source": source, "command": self.session.payload()["command"],
                "rated_bandwidth_tb_s": None}  # fmt: skip

    def _baseline(self, plan: Plan, env: Any, model_dir: Path | None,
                  metrics: dict[str, list[float]], runs: list[RunMeasurement],
                  accuracy: dict[str, Any] | None, data: dict[str, Any], reasons: list[str],
                  partial: str | None) -> None:  # fmt: skip
        from pytest_moeperf import gates
        from pytest_moeperf.baseline import BaselineKey, BaselineStore
        from pytest_moeperf.moeconfig.folder import config_hash
        from pytest_moeperf.server.embedded import model_fingerprint

        root = options.resolve_path(self.config, "moeperf_baseline_dir")
        assert root is not None
        store = BaselineStore(root)
        folder = self._server.config.tuned_config_folder if hasattr(self, "_server") else None
        model = plan.spec.model.path
        if model_dir is not None:
            model = f"{model}@{model_fingerprint(model_dir)}"
        p = plan.spec.parallelism
        key = BaselineKey(
            backend=env.backend,
            gpu_name=env.accelerator,
            gpu_count=env.gpu_count,
            driver=env.driver,
            cuda=env.cuda,
            vllm_version=env.vllm_version,
            model=model,
            dtype=plan.spec.model.dtype,
            tp=p.tensor,
            dp=p.data,
            spec_hash=plan.spec.hash()[:16],
            moe_config_hash=config_hash(folder) if folder else "declared",
        )
        test_id = self.item.nodeid
        target = self.item.nodeid.split("::")[0]
        outcome = gates.compare(
            store,
            test_id,
            key,
            metrics,
            ci_mode=bool(options.value(self.config, "moeperf_ci")),
            allow_other_hardware=bool(options.value(self.config, "moeperf_allow_other_hardware")),
            target=target,
            accuracy=accuracy,
            accuracy_gate=plan.accuracy,
        )
        self._verdicts = outcome.verdicts
        data["verdicts"] = [v.to_dict() for v in outcome.verdicts]
        data["baseline"] = {"path": outcome.path, "status": outcome.status,
                            "warnings": outcome.warnings}  # fmt: skip
        if outcome.accuracy is not None and data["accuracy"] is not None:
            data["accuracy"]["verdict"] = outcome.accuracy
        for w in outcome.warnings:
            self.session.warn(f"{test_id}: {w}")
        reasons.extend(outcome.failures)
        if options.value(self.config, "moeperf_refresh_baselines"):
            # A failed test never overwrites a baseline, a regression included: to accept a
            # slower result on purpose, remove the old file in the same commit, then refresh.
            why = (
                partial
                or ("quick mode" if plan.quick else None)
                or (("the test failed: " + "; ".join(reasons)) if reasons else None)
                or (
                    None
                    if len(runs) == plan.runs
                    and all(r.metrics.get("slo_goodput_tok_s") is not None for r in runs)
                    else "not every run completed with an SLO boundary"
                )
            )
            status = gates.refresh(
                store, test_id, key, metrics, [r.to_dict() for r in runs], accuracy=accuracy,
                reason=str(options.value(self.config, "moeperf_reason") or ""),
                complete=why is None, why_incomplete=why)  # fmt: skip
            data["baseline"]["status"] = status.split(":")[0]
            data["baseline"]["refresh"] = status
            self.session.warn(f"{test_id}: baseline {status}")

    def _table(self, data: dict[str, Any]) -> str:
        from pytest_moeperf.report.table import format_verdict_table

        lines = [f"{'metric':<20} {'center':>12} {'runs':>5}  unit"]
        for name, e in data["metrics"].items():
            c = e["center"]
            text = "not measured" if c is None else f"{c:.4g}"
            lines.append(f"{name:<20} {text:>12} {len(e['runs']):>5}  {e['unit']}")
        lines.append(f"moe config: {data['moe_config']['check']}")
        if data.get("accuracy"):
            a = data["accuracy"]
            lines.append(f"gsm8k {a['shots']}-shot: strict {a['strict_match']:.3f} flexible "
                         f"{a['flexible_extract']:.3f} (n={a['n']}, {a.get('scope', '')}, "
                         f"{a['errors']} request errors)")  # fmt: skip
            v = a.get("verdict")
            if v:
                lines.append(f"accuracy gate {'passed' if v['passed'] else 'FAILED'} "
                             f"({v['metric']}): {v['reason']}")  # fmt: skip
        verdicts = getattr(self, "_verdicts", [])
        if verdicts:
            lines.append(format_verdict_table(verdicts, title="vs baseline"))
        else:
            lines.append(f"baseline: {data['baseline']['status']} ({data['baseline']['path']})")
        return "\n".join(lines)


def _null() -> Any:
    import contextlib

    return contextlib.nullcontext()


def _metric_entry(name: str, values: list[float], runs: list[RunMeasurement]) -> dict[str, Any]:
    import statistics

    entry: dict[str, Any] = {
        "runs": values,
        "unit": METRIC_UNITS[name],
        "center": statistics.median(values) if values else None,
    }
    if not values:
        notes = sorted({n for r in runs for n in r.notes if name.split("_")[0] in n.lower()
                        or "not measured" in n})  # fmt: skip
        entry["note"] = "; ".join(notes) or "not measured"
    return entry


def _spec_summary(plan: Plan) -> dict[str, Any]:
    s = plan.spec
    w = s.workload
    trace = f"{w.trace} {w.input_tokens}/{w.output_tokens}" if w.trace == "fixed" else w.trace
    return {"name": s.name, "path": s.source, "hash": s.hash()[:16], "trace": trace,
            "arrival": f"{s.arrival.process}, burstiness {s.arrival.burstiness:g}",
            "slo": {"ttft_p99_ms": plan.slo.ttft_p99_ms, "tpot_p99_ms": plan.slo.tpot_p99_ms,
                    "e2el_p99_ms": plan.slo.e2el_p99_ms}, "slo_source": plan.slo_source,
            "runs": plan.runs, "probe_requests": plan.probe_requests}  # fmt: skip


def _vocab_size(model_dir: Path | None) -> int:
    """Token ids in prompts must be valid for both the model and its tokenizer."""
    if model_dir is None:
        return 1000
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    tok = model_dir / "tokenizer.json"
    if tok.exists():
        t = json.loads(tok.read_text())
        size = len(t.get("model", {}).get("vocab", {})) + len(t.get("added_tokens", []))
        vocab = min(vocab, max(size, 1))
    return vocab


def _served_model(base_url: str) -> str:
    import httpx

    try:
        r = httpx.get(f"{base_url}/v1/models", timeout=30)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise MoePerfError(f"external server {base_url}: GET /v1/models failed: {exc}") from None
