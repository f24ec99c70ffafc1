"""``moeperf report RUN.json [RUN2.json ...] --title T --out PATH``: HTML + Markdown report.

Exit status: 0 written, 2 bad input (one "error:" line on stderr naming the file), so a CI step
that publishes the report fails loudly instead of uploading an empty page.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_moeperf.errors import UsageError

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``report``; the top-level ``moeperf`` CLI calls this for its sub-command."""
    parser.add_argument(
        "results",
        metavar="RUN.json",
        nargs="+",
        help="session results files (--moeperf-results), one or more",
    )
    parser.add_argument("--title", required=True, help="report title (first line of both files)")
    parser.add_argument(
        "--out",
        default="moeperf-report",
        metavar="PATH",
        help="output path; .html and .md are written with this stem (default: moeperf-report)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the report for parsed arguments; returns the exit status."""
    from pytest_moeperf.report.render import read_results_file, write_report

    try:
        out = _out_path(args.out)
        payloads = [read_results_file(Path(p)) for p in args.results]
        html_path, md_path = write_report(payloads, out, title=args.title,
                                          sources=list(args.results))  # fmt: skip
    except UsageError as e:
        print(f"moeperf report: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # nothing was claimed written: name the path and why
        where = f": {e.filename}" if isinstance(e.filename, str) else ""
        print(f"moeperf report: error: --out = {args.out!r}: report not written "
              f"({e.strerror or type(e).__name__}{where}). Fix: give --out a path in a "
              "writable folder", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    print(f"report written to {html_path} and {md_path}")
    return EXIT_OK


def _out_path(text: str) -> Path:
    """``--out`` as a file stem: a folder-only value ('', '.', '/') has no name to give."""
    path = Path(text)
    if not text.strip() or not path.name or path.name in (".", ".."):
        raise UsageError("command line", "--out", text,
                         "names no file (the report needs a file stem)",
                         "give a path like reports/nightly (writes nightly.html, .md)")  # fmt: skip
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for the arguments after ``report``; never raises SystemExit."""
    from pytest_moeperf.cli import parse_then_run

    return parse_then_run(
        "moeperf report",
        "Render session results files as one self-contained HTML and a Markdown file.",
        add_arguments,
        run,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
