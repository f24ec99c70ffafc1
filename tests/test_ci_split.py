"""`make test` (every change, `.ci/run`) and `make test-e2e` (nightly, `.ci/nightly`) between them
run every test once, and the end-to-end verdicts run alone on quiet cores, never beside xdist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from _pytest.mark.expression import Expression
from tutorial_helpers import clean_env

ROOT = Path(__file__).resolve().parent.parent

MARKS_PLUGIN = """
import json, os

def pytest_collection_finish(session):
    out = {item.nodeid: sorted({m.name for m in item.iter_markers()}) for item in session.items}
    with open(os.environ["MOEPERF_TEST_MARKS_OUT"], "w") as f:
        json.dump(out, f)
"""


def _make_target(name: str) -> list[str]:
    """The `-m` expression of each pytest line of one Makefile target, in order."""
    text = (ROOT / "Makefile").read_text()
    body = re.search(rf"^{re.escape(name)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert body, f"no target {name!r} in the Makefile"
    return re.findall(r'pytest tests -m "?([^"$]+?)"? (?:-n auto )?\$\(TEST_ARGS\)', body.group(1))


def test_the_ci_scripts_call_the_targets() -> None:
    assert "make test " in (ROOT / ".ci" / "run").read_text()
    assert "make test-e2e " in (ROOT / ".ci" / "nightly").read_text()
    assert _make_target("test") == ["not measures", "measures and not e2e"]
    assert _make_target("test-e2e") == ["e2e"]


def test_every_test_runs_once_and_the_e2e_ones_alone(tmp_path: Path) -> None:
    (tmp_path / "marks_plugin.py").write_text(MARKS_PLUGIN)
    out = tmp_path / "marks.json"
    env = clean_env(PYTHONPATH=str(tmp_path), MOEPERF_TEST_MARKS_OUT=str(out))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-p", "marks_plugin",
         "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    marks: dict[str, list[str]] = json.loads(out.read_text())
    passes = [*_make_target("test"), *_make_target("test-e2e")]
    for nodeid, names in marks.items():
        hits = [e for e in passes if Expression.compile(e).evaluate(set(names).__contains__)]
        assert len(hits) == 1, f"{nodeid} ({names}) runs in {hits}, not exactly one pass"
    e2e = {n for n, names in marks.items() if "e2e" in names}
    assert e2e == {
        "tests/test_tutorial.py::test_tutorial_runs_as_written",
        "tests/test_e2e_baseline.py::test_a_slowed_server_is_regressed_and_never_a_baseline",
    }
    assert all("measures" in marks[n] for n in e2e)  # never in the xdist pass
