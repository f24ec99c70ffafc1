"""The ``moeperf_ab`` fixture's driver: one changed MoE config file -> an interleaved A/B verdict.

Flow for one case: check the test's model would read the file at all, start the base and the
head server side by side (each with its own ``VLLM_TUNED_CONFIG_FOLDER``, proven from its log),
measure them in counterbalanced pairs, judge every metric with the baseline statistics
(``verdict.judge``), optionally sweep concurrency and run an A/A control, then record one result
per side and a Markdown summary a reviewer can paste into the PR.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_moeperf import settings
from pytest_moeperf.ab.cases import AbCase, AbSide, describe
from pytest_moeperf.errors import GateFailure, UsageError
from pytest_moeperf.run.measure import PerfTest, Plan
from pytest_moeperf.run.probe import Endpoint, RunMeasurement, ServerDied
from pytest_moeperf.run.record import collect_metrics, metric_entry, result_table, spec_summary
from pytest_moeperf.run.source import Served
from pytest_moeperf.server.process import VllmServer
from pytest_moeperf.session import PerfResult

if TYPE_CHECKING:
    from pytest_moeperf.report.schema import ResultRecord

NO_CASE_REASON = (
    "no A/B requested: pass --moeperf-ab-range BASE...HEAD (a git range) or "
    "--moeperf-ab-folders BASE,HEAD to gate changed MoE config files"
)
NO_CHANGE_REASON = "no MoE config file changed in {origin}"
MIN_PAIRS = 3  # the verdict needs three runs a side to estimate the spread
CONTROL = "control"
_DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


@dataclass
class SideState:
    """One live server of the gate and what it measured."""

    side: AbSide
    server: VllmServer
    check: str
    runs: list[RunMeasurement] = field(default_factory=list)
    sweep: list[dict[str, Any]] = field(default_factory=list)

    @property
    def endpoint(self) -> Endpoint:
        s = self.server
        return Endpoint(s.base_url, s.model_name, s.alive, s.pgid)


@dataclass
class AbOutcome:
    """Everything the summary and the report need about one case."""

    case: AbCase
    plan: Plan
    pairs: int
    order: list[tuple[str, int]]
    sides: dict[str, SideState]
    verdicts: list[Any]  # verdict.Verdict
    control_verdicts: list[Any] | None
    failures: list[str]
    warnings: list[str]
    env: Any
    partial: str | None = None
    hygiene: dict[str, Any] | None = None
    control_base: list[RunMeasurement] = field(default_factory=list)  # base runs of the A/A
    greedy: dict[str, Any] = field(default_factory=dict)  # side -> [Greedy] (equivalence.py)
    equivalence: Any = None  # equivalence.Equivalence, once judged
    perm: Any = None  # perm_gate.PermOutcome on a GPU; None where no GPU is visible


class AbTest:
    """``moeperf_ab.run()``: the A/B gate of the parametrized changed file.

    It uses a ``PerfTest`` for what every perf test shares (the plan from the resolved
    settings, the model folder, the environment, the run driver, the setup record) and adds
    the pairs of sides, the A/A control and the sweep."""

    def __init__(
        self,
        item: pytest.Item,
        session: Any,
        factory: Any,
        workdir: Path,
        case: AbCase | None,
        origin: str | None,
    ) -> None:
        self.perf = PerfTest(item, session, factory, workdir)
        self.item, self.session, self.factory, self.config = item, session, factory, item.config
        self.case = case
        self.origin = origin
        self._server_env: dict[str, str] = {}  # the spec's server environment (Ray address)

    def run(self) -> PerfResult:
        case = self.case
        if case is None:
            pytest.skip(
                NO_CHANGE_REASON.format(origin=self.origin) if self.origin else NO_CASE_REASON
            )
        plan = self.perf.plan()
        if plan.server_url:
            raise UsageError(
                "--moeperf-server-url",
                "A/B gate",
                plan.server_url,
                "the gate must start its own servers to set each side's MoE config",
                "run the A/B tests without --moeperf-server-url",
            )
        outcome = self._gate(case, plan)
        head = self._record(outcome)
        if outcome.failures:
            raise GateFailure("; ".join(outcome.failures))
        return head

    # -- measuring ------------------------------------------------------------------------------
    def _gate(self, case: AbCase, plan: Plan) -> AbOutcome:
        from pytest_moeperf.ab.cases import dtype_selector, mismatch, model_config_of
        from pytest_moeperf.ab.interleave import run_interleaved

        pairs = self._pairs(plan)  # options are resolved (and refused) before any server starts
        stash = settings.of(self.item)
        levels = _levels(stash.sweep.value)
        control = bool(stash.ab_control.value)
        model_dir = self.perf.model_dir(plan.spec)
        p = plan.spec.parallelism
        quant = plan.spec.engine_arg("quantization")
        why = mismatch(
            case,
            model_config_of(model_dir),
            tp=p.tensor,
            dp=p.data,
            ep=p.expert,
            dtype=dtype_selector(plan.spec.model.dtype, quant),
        )
        if why:
            pytest.skip(why)
        self._skip_on_other_gpu(case)
        perm = self._perm(case, plan, model_dir, dtype_selector(plan.spec.model.dtype, quant))
        args = plan.spec.vllm_args()
        self.config.hook.pytest_moeperf_server_command(config=self.config, command=args)
        self._server_env = plan.spec.parallelism.server_env()
        sides = {"base": self._start_side(case, case.base, model_dir, args)}
        self.perf.server = sides["base"].server
        sides["head"] = self._start_side(case, case.head, model_dir, args)
        env = self.perf.environment(
            plan,
            Served(sides["base"].endpoint, model_dir, sides["base"].check, sides["base"].server),
        )
        driver = self.perf.driver(plan, model_dir, env)
        out = AbOutcome(case, plan, pairs, [], sides, [], None, [], [], env, perm=perm)
        out.failures += perm.failures(case.file_name) if perm is not None else []
        out.hygiene = self._hygiene([s.server for s in sides.values()], env)
        for name, state in sides.items():
            driver.warm_up(state.endpoint, f"moeperf {case.id}: {name}")

        def measure(side: str, k: int) -> RunMeasurement:
            run = driver.run(
                sides[side].endpoint, k, f"moeperf {case.id}: {side} run {k + 1}/{pairs}"
            )
            # the base runs of the A/A phase are judged against the control only
            if side == "base" and CONTROL in sides:
                out.control_base.append(run)
            else:
                sides[side].runs.append(run)
            out.order.append((side, k))
            return run

        try:
            run_interleaved(measure, pairs)
            if levels:
                self._sweep(driver, sides, levels, case)
            self._greedy(out, ("base", "head"), driver.vocab_size)
            if control:
                sides["head"].server.stop()
                sides[CONTROL] = self._start_side(case, case.control(), model_dir, args)
                driver.warm_up(sides[CONTROL].endpoint, f"moeperf {case.id}: {CONTROL}")
                run_interleaved(measure, pairs, ("base", CONTROL))
                self._greedy(out, (CONTROL,), driver.vocab_size)
        except ServerDied as died:
            out.partial = str(died)
            out.failures.append(f"{case.file_name}: {died}")
            return out
        judge_outcome(out)
        return out

    def _perm(self, case: AbCase, plan: Plan, model_dir: Path, dtype: str | None) -> Any:
        """The per-M kernel A/B, before any server holds the GPU (``perm_gate.in_gate``)."""
        from pytest_moeperf import options
        from pytest_moeperf.ab.perm_gate import in_gate

        summary = options.resolve_path(self.config, "moeperf_ab_summary")
        root = summary.parent if summary is not None else self.perf.workdir
        return in_gate(case, dtype, model_dir, root / "perm" / case.id,
                       [plan.spec.max_num_seqs], self.perf.say)  # fmt: skip

    def _greedy(self, out: AbOutcome, names: tuple[str, ...], vocab_size: int) -> None:
        """Greedy outputs of the fixed prompt set from each named side (output equivalence);
        a side that cannot answer them fails the gate with the reason."""
        from pytest_moeperf.ab.equivalence import greedy_outputs, prompt_set

        prompts = prompt_set(out.plan.spec, vocab_size)
        for name in names:
            ep = out.sides[name].endpoint
            try:
                out.greedy[name] = greedy_outputs(ep.base_url, ep.model, prompts)
            except Exception as exc:  # any failure is the gate's finding
                out.failures.append(
                    f"{out.case.file_name}: output equivalence not measured: the {name} "
                    f"server's greedy completions failed ({type(exc).__name__}: {exc})"
                )

    def _hygiene(self, servers: list[VllmServer], env: Any) -> dict[str, Any]:
        """Machine checks with both servers up: neither counts as "another server"."""
        from pytest_moeperf.hygiene import check_before_load

        report, noisy = check_before_load(servers, env.gpu_indices, backend=env.backend)
        if noisy:
            self.session.warn(f"{self.item.nodeid}: {noisy}")
        return report

    def _start_side(
        self, case: AbCase, side: AbSide, model_dir: Path, args: list[str]
    ) -> SideState:
        """Start one side's server; every side after the first shares the first one's GPUs.

        The gate compares configs on the same device, so the servers must not get a lease
        each (on one GPU the second would never get one): the spec sizes
        gpu-memory-utilization so that two servers fit.
        """
        files = dict(side.files) or None
        first = self.factory.servers[0].config.env if self.factory.servers else {}
        shared = {k: first[k] for k in _DEVICE_ENV if k in first}
        shared.update(self._server_env)
        server = self.factory(
            model_dir, args, name=f"{case.id}-{side.label}", moe_config_files=files, env=shared
        )
        return SideState(side, server, self.factory.checks[-1].message)

    def _pairs(self, plan: Plan) -> int:
        got = settings.of(self.item).ab_pairs
        pairs = int(got.value) if got.value is not None else max(MIN_PAIRS, plan.runs)
        if plan.quick and got.value is None:
            pairs = MIN_PAIRS
        return pairs

    def _skip_on_other_gpu(self, case: AbCase) -> None:
        from pytest_moeperf.ab.cases import device_mismatch
        from pytest_moeperf.metrics.hardware import visible_gpus

        gpus = visible_gpus()
        if gpus:
            why = device_mismatch(case, gpus[0].name, "cuda")
            if why:
                pytest.skip(why)

    def _sweep(
        self, driver: Any, sides: dict[str, SideState], levels: list[int], case: AbCase
    ) -> None:
        from pytest_moeperf.ab.interleave import sweep_order, sweep_row

        for c, side in sweep_order(levels):
            run = driver.run(sides[side].endpoint, 0, f"moeperf {case.id}: {side} sweep",
                             concurrency=c)  # fmt: skip
            sides[side].sweep.append(sweep_row(c, side, run.metrics))

    # -- recording ------------------------------------------------------------------------------
    def _record(self, out: AbOutcome) -> PerfResult:
        from pytest_moeperf.ab.summary import fleet_of, markdown_summary
        from pytest_moeperf.report.schema import VerdictEntry

        results: list[PerfResult] = []
        base_metrics = collect_metrics(out.sides["base"].runs)
        for name, state in out.sides.items():
            data = self._side_data(out, name, state)
            ab = data.ab if data.ab is not None else {}
            metrics = collect_metrics(state.runs)
            if name != "base":
                verdicts = out.verdicts if name == "head" else (out.control_verdicts or [])
                reference = base_metrics
                if name == CONTROL:  # judged against the base runs interleaved with it
                    reference = collect_metrics(out.control_base)
                    ab["base_runs"] = [r.to_dict() for r in out.control_base]
                data.verdicts = [VerdictEntry.model_validate(v.to_dict()) for v in verdicts]
                data.fleet = fleet_of(
                    reference, metrics, reference="base", gpus=max(1, out.env.gpu_count)
                )
            else:
                verdicts = []
            reasons = [f for f in out.failures if _blames(f, name)]
            outcome = "partial" if out.partial else ("failed" if reasons else "passed")
            table = result_table(data, verdicts)
            result = PerfResult(self.item.nodeid, outcome, data, table=table, reasons=reasons)
            self.session.record(result)
            results.append(result)
        for w in out.warnings:
            self.session.warn(w)
        self.session.ab_summaries.append(markdown_summary(out, self.session.payload()["command"]))
        for v in out.verdicts:
            self.item.user_properties.append((f"moeperf.ab.{v.metric}", v.outcome))
        return results[1] if len(results) > 1 else results[0]

    def _side_data(self, out: AbOutcome, name: str, state: SideState) -> ResultRecord:
        from pytest_moeperf.moeconfig.folder import config_hash
        from pytest_moeperf.report.schema import BaselineEntry, MoeConfigEntry, ResultRecord

        runs = state.runs
        metrics = collect_metrics(runs)
        folder = state.server.config.tuned_config_folder
        search_runs = [r.to_dict() for r in runs]
        data = ResultRecord(
            nodeid=self.item.nodeid,
            quick=out.plan.quick,
            config_label=name,
            spec=spec_summary(out.plan),
            moe_config=MoeConfigEntry(
                name=name,
                check=state.check,
                file=out.case.file_name,
                source=describe(state.side),
                hash=config_hash(folder) if folder else None,
                loaded=list(state.server.moe_observation().loaded),
            ),
            metrics={n: metric_entry(n, v, runs) for n, v in metrics.items()},
            search_runs=search_runs,
            sweep=state.sweep,
            ab={
                **out.case.to_dict(),
                "side": name,
                "pairs": out.pairs,
                "order": [f"{s}{k + 1}" for s, k in out.order],
                "equivalence": out.equivalence.to_dict() if out.equivalence else None,
            },
            baseline=BaselineEntry(
                status="compared" if name != "base" else "reference",
                path=f"A/B base: {describe(out.case.base)}",
            ),
            accuracy=None,
            hygiene=out.hygiene,
        )
        if out.partial:
            data.partial = out.partial
        data.setup = self.perf.setup_data(out.plan, out.env, search_runs)
        return data


def _blames(failure: str, side: str) -> bool:
    """Which side's result a gate failure belongs to: the control's noise, else the head."""
    if "A/A control" in failure:
        return side == CONTROL
    return side == "head"


def judge_outcome(out: AbOutcome) -> None:
    """The A/B verdicts, the A/A control's and output equivalence, into ``out``."""
    from pytest_moeperf.ab import equivalence
    from pytest_moeperf.verdict import judge_all
    from pytest_moeperf.verdict.machine_drift import drifted_verdicts
    from pytest_moeperf.verdict.server_cost import load_confounded

    def dicts(runs: list[RunMeasurement]) -> list[dict[str, Any]]:
        return [r.to_dict() for r in runs]

    g = out.greedy
    if "base" in g and "head" in g:
        aa = equivalence.compare(g["base"], g[CONTROL], CONTROL) if CONTROL in g else None
        out.equivalence = equivalence.judge(equivalence.compare(g["base"], g["head"], "head"), aa)
        out.failures += [f"{out.case.file_name}: output equivalence: {f}"
                         for f in out.equivalence.failures]  # fmt: skip

    base = _measured(out.sides["base"].runs)
    src = f"A/B {out.case.file_name}"
    # interleaved, both sides share the machine's drift; a neighbour busy during one
    # side's runs only does not, and its shares say so (verdict/machine_drift.py)
    head_runs = out.sides["head"].runs
    out.verdicts = load_confounded(drifted_verdicts(
        judge_all(base, _measured(head_runs), source=src),
        dicts(out.sides["base"].runs), dicts(head_runs)))  # fmt: skip
    for v in out.verdicts:
        if v.fails:
            out.failures.append(
                f"{out.case.file_name}: {v.metric} regressed vs base "
                f"({describe(out.case.base)}): {v.reason}"
            )
        elif v.outcome == "inconclusive" and v.gating:
            out.warnings.append(
                f"{out.case.file_name}: {v.metric} inconclusive: {v.reason}; {v.advice}"
            )
    if CONTROL in out.sides:
        ctrl = _measured(out.sides[CONTROL].runs)
        base_aa = _measured(out.control_base)
        out.control_verdicts = drifted_verdicts(
            judge_all(base_aa, ctrl, source=f"A/A control {src}"),
            dicts(out.control_base), dicts(out.sides[CONTROL].runs))  # fmt: skip
        noisy = [
            v for v in out.control_verdicts if v.gating and v.outcome in ("regressed", "improved")
        ]
        if noisy:
            names = ", ".join(f"{v.metric} {v.outcome} ({v.delta_rel * 100:+.1f} %)" for v in noisy)
            out.failures.append(
                f"{out.case.file_name}: the A/A control (base vs a copy of "
                f"base) came out {names}: this machine is too noisy for "
                "the gate, so the A/B verdict is not trusted"
            )


def _measured(runs: list[RunMeasurement]) -> dict[str, list[float]]:
    """Metrics with at least one value (energy on a CPU has none: not judged, not zero)."""
    return {k: v for k, v in collect_metrics(runs).items() if v}


def _levels(raw: object) -> list[int]:
    """``--moeperf-sweep 1,4,16,64`` -> [1, 4, 16, 64]; checked where the option is parsed."""
    if not raw:
        return []
    return [int(x) for x in str(raw).split(",") if x.strip()]
