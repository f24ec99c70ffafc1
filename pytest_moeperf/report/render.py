"""Entry point of the report: results payloads in, one HTML file and one Markdown file out.

``write_report`` is what the plugin calls at session end (``--moeperf-report PATH``) and what
``moeperf report`` calls for saved results files. matplotlib is imported only when charts are
drawn, so importing this module costs nothing at pytest start-up.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import UsageError
from pytest_moeperf.report import model
from pytest_moeperf.report.amend import apply_amendments
from pytest_moeperf.report.document import Document, build_document
from pytest_moeperf.report.html import render_html
from pytest_moeperf.report.markdown import render_markdown
from pytest_moeperf.report.model import parse_payloads

__all__ = ["build", "read_results_file", "write_report"]


def read_results_file(path: Path) -> dict[str, Any]:
    """Load one session results JSON; UsageError naming the file when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            str(path),
            "results file",
            str(path),
            "does not exist",
            "pass the path of a results JSON (--moeperf-results)",
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(
            str(path),
            "results file",
            str(path),
            f"cannot be read ({e})",
            "pass a readable UTF-8 JSON file",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(
            str(path),
            "content",
            text[:40],
            f"is not JSON ({e.msg} at line {e.lineno} column {e.colno})",
            "pass the results JSON the plugin wrote, not a log or a report",
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            str(path),
            "top level",
            type(data).__name__,
            "must be a JSON object",
            "pass a moeperf session results file",
        ) from None
    return data


def build(
    payloads: Sequence[dict[str, Any]],
    *,
    title: str,
    sources: Sequence[str] | None = None,
    out: str = "report.html",
    latest_per_test: bool = True,
) -> Document:
    """Validate the payloads and compute everything the report shows (charts included).

    With several payloads, a test (nodeid x config) held by more than one keeps only the result
    of the last payload that holds it (a re-run replaces its failed run; the report says so);
    ``latest_per_test=False`` keeps every payload's results side by side ("· run 2").
    Corrections amended into a baseline a result wrote are applied (report/amend.py).
    """
    if not title.strip():
        raise UsageError("write_report", "title", title, "is empty", "pass --title TEXT")
    # The same JSON round trip as the results file (default=str): tuples, Paths and numpy
    # scalars in an in-memory payload read exactly as they will from the file.
    plain = [json.loads(json.dumps(p, default=str)) for p in payloads]
    runs = parse_payloads(plain, sources)
    notes: list[str] = []
    if latest_per_test:
        runs, notes = model.latest_per_test(runs)
    runs, amended = apply_amendments(runs)
    names = list(sources) if sources is not None else ["RESULTS.json"] * (len(payloads) > 0)
    return build_document(runs, title=title, sources=names, out=out, notes=[*notes, *amended])


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` in one step; open() (not mkstemp's 0600) so the umask sets permissions."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_report(
    payloads: Sequence[dict[str, Any]],
    path: Path,
    *,
    title: str,
    sources: Sequence[str] | None = None,
    latest_per_test: bool = True,
) -> tuple[Path, Path]:
    """Write ``path.with_suffix('.html')`` and ``.md`` (+ ``<stem>_files/*.png``); return both.

    ``sources`` names the results file of each payload: error messages and the "Reproduce"
    command use it; ``latest_per_test`` is ``build``'s. Raises UsageError for a payload that is
    not a results file.
    """
    path = Path(path)
    html_path, md_path = path.with_suffix(".html"), path.with_suffix(".md")
    doc = build(
        payloads, title=title, sources=sources, out=str(path), latest_per_test=latest_per_test
    )
    files_dir = path.parent / f"{path.stem}_files"
    path.parent.mkdir(parents=True, exist_ok=True)
    files_dir.mkdir(exist_ok=True)
    for old in files_dir.glob("*.png"):  # charts of an earlier report with other configs
        old.unlink()
    for chart in doc.charts:
        _write_atomic(files_dir / f"{chart.name}.png", chart.png)
    _write_atomic(html_path, render_html(doc).encode("utf-8"))
    _write_atomic(md_path, render_markdown(doc, files_dir.name).encode("utf-8"))
    return html_path, md_path
