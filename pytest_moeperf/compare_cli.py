"""``moeperf compare A.json B.json``: the verdict table for two baseline files.

A is the baseline side, B the candidate. Exit status: 0 no gating regression, 1 at least one,
2 bad input (one "error:" line on stderr), so CI scripts can tell "slower" from "broken".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_moeperf.baseline.storage import Baseline, read_baseline_file
from pytest_moeperf.errors import UsageError
from pytest_moeperf.report.table import format_verdict_table
from pytest_moeperf.verdict.metrics import DEFAULT_METRICS
from pytest_moeperf.verdict.server_cost import confounded
from pytest_moeperf.verdict.stats import judge_all, search_resolution

EXIT_OK, EXIT_REGRESSED, EXIT_BAD_INPUT = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``compare``; the top-level ``moeperf`` CLI calls this for its sub-command."""
    parser.add_argument("baseline", metavar="A.json", help="baseline file (the reference side)")
    parser.add_argument("candidate", metavar="B.json", help="baseline file to judge against A")
    parser.add_argument(
        "--metric",
        action="append",
        metavar="NAME",
        help="compare only this metric (repeatable); default: every metric in both files",
    )
    parser.add_argument(
        "--allow-other-hardware",
        action="store_true",
        help="compare even when A and B come from different hardware (GPU, count, driver, CUDA)",
    )


def _notes(a: Baseline, b: Baseline, names: Sequence[str] | None,
           speed: tuple[float, str] | None) -> list[str]:  # fmt: skip
    notes = []
    if a.test_id != b.test_id:
        notes.append(f"note: different tests: {a.test_id!r} vs {b.test_id!r}")
    sw = a.key.software_mismatches(b.key)
    if sw:
        diffs = ", ".join(f"{n} {getattr(a.key, n)!r} -> {getattr(b.key, n)!r}" for n in sw)
        notes.append(f"note: software differs: {diffs}")
    if names is None:
        common = sorted(set(a.metrics) & set(b.metrics))
        unknown = [m for m in common if m not in DEFAULT_METRICS]
        if unknown:
            notes.append(f"note: skipped unknown metrics: {', '.join(unknown)}")
        if "accuracy" in common:
            notes.append("note: accuracy is judged by the accuracy gate, not compared here")
    from pytest_moeperf.baseline.calibration import DRIFT_SPAN
    from pytest_moeperf.verdict.machine_drift import drift_note, speed_note
    from pytest_moeperf.verdict.server_cost import server_cost_notes

    notes += [f"note: {n}" for n in server_cost_notes(a.runs, b.runs)]
    if (drift := drift_note(a.runs, b.runs)) is not None:
        notes.append(f"note: {drift}")
    if (moved := speed_note(speed, DRIFT_SPAN)) is not None:
        notes.append(f"note: {moved}")
    return notes


def run(args: argparse.Namespace) -> int:
    """Run the comparison for parsed arguments; returns the exit status."""
    try:
        a = read_baseline_file(Path(args.baseline))
        b = read_baseline_file(Path(args.candidate))
        hardware = a.key.hardware_mismatches(b.key)
        if hardware and not args.allow_other_hardware:
            raise UsageError(
                args.candidate,
                "key",
                {n: getattr(b.key, n) for n in hardware},
                f"was measured on other hardware than {args.baseline} "
                f"({a.key.describe_mismatches(b.key)})",
                "compare files from the same hardware, or pass --allow-other-hardware",
            )
        resolution = max(search_resolution(a.runs), search_resolution(b.runs))
        verdicts = judge_all(a.metrics, b.metrics, names=args.metric, source="--metric",
                             resolution=resolution)  # fmt: skip
        from pytest_moeperf.gates import calibration_speed

        speed = calibration_speed(b.key, a.key)  # the candidate's machine vs the baseline's
        verdicts = confounded(verdicts, a.runs, b.runs, speed)
        if not verdicts:
            raise UsageError(
                args.candidate,
                "metrics",
                sorted(b.metrics),
                f"share no known metric with {args.baseline} ({sorted(a.metrics)})",
                "compare files recorded by the same test",
            )
    except UsageError as e:
        print(f"moeperf compare: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if hardware:
        print(f"warning: different hardware ({a.key.describe_mismatches(b.key)}); compared anyway")
    for note in _notes(a, b, args.metric, speed):
        print(note)
    title = f"moeperf compare: {args.baseline} (baseline) vs {args.candidate} (candidate)"
    print(format_verdict_table(verdicts, title=title))
    return EXIT_REGRESSED if any(v.fails for v in verdicts) else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for the arguments after ``compare``; never raises SystemExit."""
    from pytest_moeperf.cli import parse_then_run

    return parse_then_run(
        "moeperf compare",
        "Judge every metric of B against A with the plugin's verdict rule.",
        add_arguments,
        run,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
