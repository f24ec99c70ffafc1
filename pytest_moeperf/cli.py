"""The ``moeperf`` console script: ``moeperf compare A.json B.json``, ``moeperf report RUN.json``,
``moeperf measure SPEC.yaml``, ``moeperf schema``.

Both work outside pytest, on files written by a pytest run, so a CI step or a reviewer can re-judge
or re-render without re-measuring.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

USAGE = """usage: moeperf COMMAND ...

commands:
  compare A.json B.json   compare two baseline files; exit 1 on a regression
  report RUN.json ...     render an HTML + Markdown report from session results files
  measure SPEC.yaml       find a spec's SLO boundary without pytest (no baseline, no verdict)
  schema [baseline|spec]  print the JSON Schema of a results file (docs/results.schema.json),
                          a baseline file (docs/baseline.schema.json) or a spec file
                          (docs/spec.schema.json)
"""


def parse_then_run(
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
) -> int:
    """One sub-command's entry point: argparse's exits become return codes (0 after --help,
    2 on a bad option), so callers and tests get an int, never SystemExit."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "compare":
        from pytest_moeperf import compare_cli

        return compare_cli.main(rest)
    if command == "report":
        from pytest_moeperf import report_cli

        return report_cli.main(rest)
    if command == "measure":
        from pytest_moeperf import measure_cli

        return measure_cli.main(rest)
    if command == "schema":
        return parse_then_run("moeperf schema", "Print the JSON Schema of a session results "
                              "file (--moeperf-results; docs/results.schema.json), of a "
                              "baseline file (docs/baseline.schema.json) or of a spec file "
                              "(docs/spec.schema.json).",
                              _schema_arguments, _print_schema, rest)  # fmt: skip
    print(f"moeperf: unknown command {command!r}. Fix: use 'compare', 'report', 'measure' or "
          "'schema'.", file=sys.stderr)  # fmt: skip
    return 2


def _schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", choices=("results", "baseline", "spec"),
                        default="results", help="which file's schema")  # fmt: skip


def _print_schema(args: argparse.Namespace) -> int:
    if args.file == "baseline":
        from pytest_moeperf.baseline.schema import json_schema
    elif args.file == "spec":
        from pytest_moeperf.spec.schema import json_schema
    else:
        from pytest_moeperf.report.schema import json_schema

    print(json_schema(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
