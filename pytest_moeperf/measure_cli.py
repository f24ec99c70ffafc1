"""``moeperf measure SPEC.yaml``: the SLO boundary of a spec, measured without pytest.

For a look before writing a perf test (what does this config serve, where is its boundary?), and
to show that the run (``run/``: server, warm-up, SLO search, figures) needs no ``pytest.Item``:
the perf tests' ``moeperf`` fixture, the A/B gate and this command drive the same ``RunDriver``.
It judges nothing against a baseline and writes none: that is the perf test's job (a baseline
carries its setup key, hygiene and provenance, which only the plugin collects).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import MoePerfError, UsageError

#: 1: the measurement failed (the server did not start or died, or no run found a boundary)
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="workload spec (YAML), e.g. perf_tests/specs/cpu-smoke.yaml")
    p.add_argument("--runs", type=int, default=None, help="SLO searches (default: the spec's)")
    p.add_argument("--moe-config", type=Path, default=None, metavar="DIR",
                   help="folder of fused-MoE config files (VLLM_TUNED_CONFIG_FOLDER); "
                        "default: vLLM's in-tree configs")  # fmt: skip
    p.add_argument("--server-url", default=None,
                   help="measure a running server instead of starting one")  # fmt: skip
    p.add_argument(
        "--models",
        type=Path,
        default=Path("perf_tests/models"),
        metavar="DIR",
        help="folder holding the spec's model.path (default: perf_tests/models)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the runs (probes, figures) as JSON here",
    )


def _model_dir(spec: Any, models: Path) -> Path | None:
    from pytest_moeperf.server.embedded import EMBEDDED_NAME, ensure_embedded_model

    loc = spec.model_location()
    if loc == EMBEDDED_NAME:
        return ensure_embedded_model()
    folder = Path(loc) if Path(loc).is_absolute() else models / loc
    return folder if folder.is_dir() else None


def run(args: argparse.Namespace) -> int:
    """Measure for parsed arguments; returns the exit status."""
    from pytest_moeperf.metrics.energy import NotMeasuredMeter, make_default_meter
    from pytest_moeperf.metrics.hardware import visible_gpus
    from pytest_moeperf.run.driver import RunDriver, probe_budget, warm_levels
    from pytest_moeperf.run.probe import Endpoint
    from pytest_moeperf.run.record import vocab_size
    from pytest_moeperf.server.fixture import ServerFactory
    from pytest_moeperf.spec.loader import load_spec

    factory: ServerFactory | None = None
    try:
        if args.runs is not None and args.runs < 1:
            raise UsageError("--runs", "--runs", args.runs, "must be at least 1", "pass 1 or more")
        if args.moe_config is not None and not args.moe_config.is_dir():
            raise UsageError("--moe-config", "--moe-config", str(args.moe_config),
                             "is not a folder", "pass the folder that holds the "
                             "E=...,N=...,device_name=....json files")  # fmt: skip
        spec = load_spec(Path(args.spec))
        model_dir = _model_dir(spec, args.models)
        gpus = [g.index for g in visible_gpus()] if args.server_url is None else []
        if args.server_url is not None:
            from pytest_moeperf.external import served_model_at

            url = args.server_url.rstrip("/")
            endpoint = Endpoint(url, served_model_at(url, "--server-url"))
            meter: Any = NotMeasuredMeter("a server this command did not start")
            print(f"moeperf measure: {endpoint.base_url} (MoE config: as that server has it)")
        else:
            if model_dir is None:
                raise UsageError(args.spec, "model.path", spec.model.path,
                                 f"is not a folder under {args.models}",
                                 "pass --models DIR, or put the model there")  # fmt: skip
            factory = ServerFactory(Path(tempfile.mkdtemp(prefix="moeperf-measure-")))
            server = factory(model_dir, spec.vllm_args(), name="moeperf measure",
                             moe_config_folder=args.moe_config,
                             served_model_name=spec.model.served_name)  # fmt: skip
            endpoint = Endpoint(server.base_url, server.model_name, server.alive,
                                server.pgid)  # fmt: skip
            meter = make_default_meter(gpus)
            print(f"moeperf measure: vLLM ready in {server.startup_s or 0:.0f} s; MoE config: "
                  f"{server.moe_observation().summary}; log {server.config.log_path}")  # fmt: skip
        driver = RunDriver(spec, spec.slo, meter, vocab_size(model_dir), None,
                           *probe_budget(spec), say=print,
                           warm=warm_levels(spec, gpu=bool(gpus)))  # fmt: skip
        driver.warm_up(endpoint, "moeperf measure")
        n = args.runs or spec.runs
        runs = [driver.run(endpoint, i, f"moeperf measure: run {i + 1}/{n}") for i in range(n)]
    except (UsageError, MoePerfError) as e:
        print(f"moeperf measure: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(e, UsageError) else EXIT_FAILED
    finally:
        if factory is not None:
            factory.stop_all()
    if args.json is not None:
        doc = {"spec": spec.name, "source": str(args.spec), "runs": [r.to_dict() for r in runs]}
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return _summary(spec, runs)


def _summary(spec: Any, runs: Sequence[Any]) -> int:
    key = "slo_goodput_tok_s" if spec.search is not None else "output_tok_s"
    got = [float(v) for r in runs if r.complete and (v := r.metrics.get(key)) is not None]
    slo = f"p99 TTFT <= {spec.slo.ttft_p99_ms:g} ms, p99 TPOT <= {spec.slo.tpot_p99_ms:g} ms"
    if not got:
        print(f"moeperf measure: no run found an SLO boundary ({slo}): "
              + "; ".join(r.incomplete_reason or "?" for r in runs))  # fmt: skip
        return EXIT_FAILED
    each = " / ".join(f"{g:,.0f}" for g in got)
    print(f"moeperf measure: {spec.name}: {key} median {statistics.median(got):,.0f} tok/s "
          f"({each} over {len(got)} of {len(runs)} runs; SLO {slo})")  # fmt: skip
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for the arguments after ``measure``; never raises SystemExit."""
    from pytest_moeperf.cli import parse_then_run

    return parse_then_run("moeperf measure", __doc__.split("\n")[0], add_arguments, run, argv)
