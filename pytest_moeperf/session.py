"""Per-session state: results of every perf test, the terminal summary and the results file.

The summary hook must never raise (a bug there would hide every verdict), so everything it prints
was computed and validated while the tests ran; gate failures are test failures, not exceptions
from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_moeperf import __version__, options
from pytest_moeperf.errors import UsageError
from pytest_moeperf.report import RESULTS_SCHEMA_VERSION

if TYPE_CHECKING:
    from pytest_moeperf.report.model import Result
    from pytest_moeperf.report.rows import Metrics, MoeConfigProof, VerdictRow
    from pytest_moeperf.report.schema import ResultRecord


@dataclass
class PerfResult:
    """One perf test's result record, as written to the session's results JSON.

    ``data`` is the record's typed model (``report/schema.py`` ``ResultRecord``): the run fills
    its fields, the file is its dump, and the report reads that file back through the same
    model. ``nodeid``, ``outcome`` and ``reasons`` live here, outside it: a deferred refresh
    (``pending``) still changes them after ``run()`` returned."""

    nodeid: str
    outcome: str  # "passed" | "failed" | "partial" | "error"
    data: ResultRecord
    table: str = ""
    reasons: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, nodeid: str, outcome: str, data: dict[str, Any], table: str = "",
                  reasons: list[str] | None = None) -> PerfResult:  # fmt: skip
        """A record read back as JSON (an xdist worker's, relayed to the controller), checked
        against the schema: a wrong field is one UsageError naming it."""
        from pytest_moeperf.report.schema import validate_record

        record = validate_record({**data, "nodeid": nodeid}, f"the result of {nodeid}")
        return cls(nodeid, outcome, record, table, list(reasons or []))

    def to_dict(self) -> dict[str, Any]:
        """The record as written: the fields the run set, none of the schema's defaults."""
        body = self.data.model_dump(exclude_unset=True, exclude={"nodeid", "outcome", "reasons"})
        return {"nodeid": self.nodeid, "outcome": self.outcome, "reasons": self.reasons, **body}

    @property
    def record(self) -> Result:
        """This result as the typed model the report reads, parsed from what is written (so a
        perf test, the results file and the report cannot disagree). Parsed on each access: a
        deferred refresh (``pending``) still changes the outcome and the baseline block."""
        from pytest_moeperf.report.model import parse_result

        return parse_result(self.to_dict(), f"the result of {self.nodeid}")

    @cached_property
    def _measured(self) -> Result:
        """The record for the parts fixed once ``run()`` returned: metrics, config, verdicts."""
        return self.record

    @property
    def metrics(self) -> Metrics:
        """``result.metrics.slo_goodput_tok_s.center``: runs, center, unit and note."""
        return self._measured.metrics

    @property
    def moe_config(self) -> MoeConfigProof:
        """The MoE config served and its proof (``loaded`` files, ``check`` line)."""
        return self._measured.moe_config

    @property
    def verdicts(self) -> tuple[VerdictRow, ...]:
        return self._measured.verdicts


class MoePerfSession:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[PerfResult] = []
        self.benchmark_linked: list[str] = []  # perf tests that also used pytest-benchmark
        self.benchmark_written: Path | None = None
        self.started = time.time()
        self.warnings: list[str] = []
        self.ab_summaries: list[str] = []  # Markdown blocks of the A/B gate, one per case
        self._relayed = (0, 0)  # results, warnings already sent to the xdist controller
        #: Where each file really went (None: not written); the summary claims nothing else.
        self.results_written: Path | None = None
        self.report_written: Path | None = None
        self.ab_summary_written: Path | None = None
        #: A file that could not be written where asked: pytest's exit status then says so.
        self.write_failed = False

    @property
    def is_xdist_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def record(self, result: PerfResult, *, notify: bool = True) -> None:
        """``notify=False``: the outcome is not final yet (a refresh waits for the test body,
        pytest_moeperf.pending); ``notify`` is called once it is."""
        self.results.append(result)
        if notify:
            self.notify(result)

    def notify(self, result: PerfResult) -> None:
        self.config.hook.pytest_moeperf_result(
            config=self.config, nodeid=result.nodeid, result=result.to_dict()
        )

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def link_benchmark(self, item: pytest.Item) -> None:
        """A perf test that also used pytest-benchmark's fixture: its record gets our centers."""
        if "benchmark" not in getattr(item, "fixturenames", ()):
            return
        mine = [r for r in self.results if r.nodeid == item.nodeid]
        if not mine:
            return
        self.benchmark_linked.append(item.nodeid)
        fixture = getattr(item, "funcargs", {}).get("benchmark")
        extra = getattr(fixture, "extra_info", None)
        if isinstance(extra, dict):
            from pytest_moeperf.report.benchmark_json import fixture_extra_info

            extra.update(fixture_extra_info(mine[-1].to_dict()))

    # -- pytest-xdist: workers measure, the controller summarises and writes the files ----------
    def take_for_controller(self) -> str | None:
        """JSON of the results and warnings recorded since the last call (None: nothing new)."""
        n_res, n_warn = self._relayed
        new_res, new_warn = self.results[n_res:], self.warnings[n_warn:]
        if not new_res and not new_warn:
            return None
        self._relayed = (len(self.results), len(self.warnings))
        items = [{"result": r.to_dict(), "table": r.table} for r in new_res]
        return json.dumps({"results": items, "warnings": new_warn}, default=str)  # inf kept

    def add_from_worker(self, text: str) -> None:
        data = json.loads(text)
        for item in data["results"]:
            d = dict(item["result"])
            nodeid, outcome, reasons = d.pop("nodeid"), d.pop("outcome"), d.pop("reasons")
            self.results.append(PerfResult.from_dict(nodeid, outcome, d, item["table"], reasons))
        self.warnings.extend(data["warnings"])

    # -- end of session ----------------------------------------------------------------------
    def terminal_summary(self, tr: Any) -> None:
        if self.is_xdist_worker or (not self.results and not self.warnings):
            return
        tr.write_sep("=", "moeperf results")
        for r in self.results:
            tr.write_line(f"{r.nodeid}  [{r.outcome}]")
            if r.table:
                for line in r.table.splitlines():
                    tr.write_line("  " + line)
            for reason in r.reasons:
                tr.write_line("  - " + reason)
        for w in self.warnings:
            tr.write_line("warning: " + w)
        if self.benchmark_written is not None:
            tr.write_line(f"pytest-benchmark JSON written to {self.benchmark_written}")
        if self.results_written is not None:
            tr.write_line(f"results written to {self.results_written}")
        if self.report_written is not None:
            tr.write_line(f"report written to {self.report_written.with_suffix('.html')} and .md")
        if self.ab_summary_written is not None:
            tr.write_line(f"A/B summary for the PR written to {self.ab_summary_written}")

    def results_path(self) -> Path | None:
        return options.resolve_path(self.config, "moeperf_results")

    def report_path(self) -> Path | None:
        return options.resolve_path(self.config, "moeperf_report")

    def benchmark_json_path(self) -> Path | None:
        """--moeperf-benchmark-json, else beside the results file once pytest-benchmark is used."""
        path = options.resolve_path(self.config, "moeperf_benchmark_json")
        if path is not None or not self.benchmark_linked:
            return path
        results = self.results_path()
        folder = results.parent if results is not None else Path(self.config.rootpath)
        return folder / "pytest-benchmark.json"

    def payload(self) -> dict[str, Any]:
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "plugin_version": __version__,
            "started": self.started,
            "finished": time.time(),
            "command": command_line(sys.argv),
            "quick": bool(options.value(self.config, "moeperf_quick")),
            "results": [r.to_dict() for r in self.results],
            "warnings": self.warnings,
        }

    def finish(self) -> None:
        if not self.results or self.is_xdist_worker:  # the controller writes the files
            return
        path = self.results_path()
        data = self.payload()
        self._check_schema(data)
        if path is not None:
            self._write_results(path, data)  # first: nothing below may lose the measurements
        summary = options.resolve_path(self.config, "moeperf_ab_summary")
        if self.ab_summaries and summary is not None:
            try:
                summary.parent.mkdir(parents=True, exist_ok=True)
                summary.write_text("\n".join(self.ab_summaries), encoding="utf-8")
                self.ab_summary_written = summary
            except OSError as exc:
                self._write_failure("A/B summary", summary, "moeperf_ab_summary", exc)
        report = self.report_path()
        if report is not None:
            try:
                from pytest_moeperf.report.render import write_report

                write_report(
                    [data],
                    report,
                    title="moeperf nightly",
                    sources=[str(self.results_written or path)] if path is not None else None,
                )
                self.report_written = report
            except OSError as exc:
                self._write_failure("report", report, "moeperf_report", exc)
            except Exception as exc:  # a report bug must not hide the results file
                self.warnings.append(f"report not written: {type(exc).__name__}: {exc}")
        bench = self.benchmark_json_path()
        if bench is not None:
            try:
                from pytest_moeperf.report.benchmark_json import to_benchmark_json

                write_json_atomic(bench, to_benchmark_json(data, source="this session"))
                self.benchmark_written = bench
            except OSError as exc:
                self._write_failure("pytest-benchmark JSON", bench, "moeperf_benchmark_json", exc)
            except Exception as exc:  # like the report: never hide the results file
                where = options.resolve(self.config, "moeperf_benchmark_json").source
                self.warnings.append(f"pytest-benchmark JSON not written to {bench} ({where}): "
                                     f"{type(exc).__name__}: {exc}")  # fmt: skip

    def _check_schema(self, data: dict[str, Any]) -> None:
        """The file as the report and dashboards will read it (``report/schema.py``). A
        mismatch is the plugin's own bug: said in a warning, and the file is written anyway,
        since the measurements matter more than its shape."""
        from pytest_moeperf.report.schema import validate

        written = json.loads(json.dumps(_finite(data), default=str, allow_nan=False))
        try:
            validate(written, "this session's results")
        except UsageError as e:
            self.warnings.append(f"results file written, but it does not match its schema "
                                 f"(docs/results.schema.json): {e}")  # fmt: skip

    def _write_results(self, path: Path, data: dict[str, Any]) -> None:
        """The results file, or, where ``path`` cannot be written, a fallback in the temp dir:
        an unwritable path must not cost the night's measurements."""
        try:
            write_json_atomic(path, data)
            self.results_written = path
            return
        except OSError as exc:
            error = exc
        fallback = None
        with contextlib.suppress(OSError):
            fd, name = tempfile.mkstemp(prefix="moeperf-results-", suffix=".json")
            os.close(fd)
            write_json_atomic(Path(name), data)
            fallback = self.results_written = Path(name)
        saved = f"saved to {fallback} instead" if fallback else "no fallback could be written"
        self._write_failure("results", path, "moeperf_results", error, saved)

    def _write_failure(self, what: str, path: Path, setting: str, exc: OSError,
                       saved: str = "") -> None:  # fmt: skip
        """One warning line: the path, the option it came from, why, and the fix."""
        self.write_failed = True
        s = options.BY_NAME[setting]
        where = options.resolve(self.config, setting).source
        why = exc.strerror or type(exc).__name__
        self.warnings.append(
            f"{where}: {s.name} = {str(path)!r}: {what} not written ({why}"
            f"{': ' + exc.filename if isinstance(exc.filename, str) else ''})"
            f"{'; ' + saved if saved else ''}. Fix: give {s.flag} / {s.env} / {s.ini} a path "
            "in a writable folder"
        )


def command_line(argv: list[str]) -> str:
    """The command as a user would retype it: ``python -m pytest`` runs show up as ``pytest``."""
    name = Path(argv[0]).name if argv else "pytest"
    if name in ("__main__.py", "py.test", "pytest.py") or name.startswith("pytest"):
        name = "pytest"
    return shlex.join([name, *argv[1:]])  # quoted: a -k expression or a reason pastes back


def _finite(value: Any) -> Any:
    from pytest_moeperf.gates import json_safe

    return json_safe(value)


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_finite(data), f, indent=1, sort_keys=True, default=str, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
