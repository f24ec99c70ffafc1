"""The ``moeperf`` console script: ``moeperf compare A.json B.json``, ``moeperf report RUN.json``.

Both work outside pytest, on files written by a pytest run, so a CI step or a reviewer can re-judge
or re-render without re-measuring.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: moeperf COMMAND ...

commands:
  compare A.json B.json   compare two baseline files; exit 1 on a regression
  report RUN.json ...     render an HTML + Markdown report from session results files
"""


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
    print(f"moeperf: unknown command {command!r}. Fix: use 'compare' or 'report'.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
