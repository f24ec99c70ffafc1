"""The example GitHub Actions workflows in examples/ci lint clean and only use real options.

actionlint (with shellcheck for the ``run:`` scripts) is the real workflow linter; a broken copy
proves it runs and would fail. The pytest command lines in the workflows are read back and
checked against the options this plugin registers *now*, then parsed by pytest's own parser with
the plugin loaded, so a renamed or removed option breaks this test instead of the nightly job.
"""

from __future__ import annotations

import itertools
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_moeperf import options

pytest_plugins = ["pytester"]

CI = Path(__file__).resolve().parent.parent / "examples" / "ci"
CONFIG = CI / "actionlint.yaml"
WORKFLOWS = sorted(p for p in CI.glob("*.yml"))
#: options whose value is a file or folder the job writes (and must upload as an artifact)
OUTPUT_OPTIONS = ("--moeperf-report", "--moeperf-results", "--junitxml", "--moeperf-ab-summary",
                  "--moeperf-benchmark-json")  # fmt: skip


def _tool(name: str) -> str:
    """A linter installed by the dev extra (next to this Python, or on PATH)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:  # an optional tool: without it the lint is not run, and says so
        pytest.skip(f"{name} is not installed: run `pip install -e '.[dev]'` (the dev extra ships "
                    "actionlint and shellcheck as wheels)")  # fmt: skip
    return found


def _actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    cmd = [_tool("actionlint"), "-no-color", "-config-file", str(CONFIG),
           "-shellcheck", _tool("shellcheck"), *map(str, files)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _load(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name}: not a YAML mapping"
    return data


def _steps(workflow: Mapping[Any, Any]) -> Iterator[Mapping[str, Any]]:
    for job in workflow["jobs"].values():
        yield from job.get("steps", [])


def _pytest_commands(workflow: Mapping[Any, Any]) -> list[list[str]]:
    """The argv of every ``pytest ...`` command in the run scripts; ${{ }} and $VARS -> X."""
    commands = []
    for step in _steps(workflow):
        script = re.sub(r"\$\{\{[^}]*\}\}", "X", step.get("run", "")).replace("\\\n", " ")
        for line in script.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["pytest"]:  # a word that is only "${array[@]}" adds no option
                argv = [w for w in words[1:] if not re.fullmatch(r"\$\{\w+\[@\]\}", w)]
                commands.append([re.sub(r"\$\{?\w+\}?", "X", w) for w in argv])
    return commands


def _flags(argv: list[str]) -> set[str]:
    return {w.split("=", 1)[0] for w in argv if w.startswith("--")}


def test_there_are_three_workflows() -> None:
    assert [p.name for p in WORKFLOWS] == [
        "nightly.yml", "pr-moe-config-gate.yml", "refresh-baselines.yml",
    ]  # fmt: skip


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_is_clean(workflow: Path) -> None:
    proc = _actionlint(workflow)
    assert proc.returncode == 0, f"actionlint {workflow.name}:\n{proc.stdout}{proc.stderr}"


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    """The linter really runs: an injected title, a missing input and an unknown label fail."""
    text = (CI / "nightly.yml").read_text()
    text = text.replace("[self-hosted, linux, gpu, h200]", "[self-hosted, linux, gpu, a100]")
    text = text.replace("if-no-files-found: warn", "if-no-file-found: warn")
    text = text.replace('echo "$PWD/.venv/bin"', 'echo "${{ github.event.head_commit.message }}"')
    broken = tmp_path / "broken.yml"
    broken.write_text(text)
    out = _actionlint(broken).stdout
    assert 'label "a100" is unknown' in out
    assert 'input "if-no-file-found" is not defined' in out
    assert '"github.event.head_commit.message" is potentially untrusted' in out


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_pytest_command_lines_use_registered_options(
    workflow: Path, pytester: pytest.Pytester
) -> None:
    commands = _pytest_commands(_load(workflow))
    assert commands, f"{workflow.name}: no pytest command found"
    registered = {s.flag for s in options.SETTINGS}  # read now: options added later count
    for argv in commands:
        ours = {f for f in _flags(argv) if f.startswith("--moeperf-") or f == "--gpu"}
        unknown = sorted(ours - registered)
        assert not unknown, (f"{workflow.name} uses options the plugin does not register: "
                             f"{unknown}; registered: {sorted(registered)}")  # fmt: skip
        # and pytest's own parser, with this plugin loaded, accepts the whole command line
        pytester.mkdir("perf_tests")
        config = pytester.parseconfig(*argv)
        assert config.getoption("moeperf_gpu") is True


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_what_pytest_writes_is_uploaded(workflow: Path) -> None:
    data = _load(workflow)
    uploads = [s for s in _steps(data) if str(s.get("uses", "")).startswith("actions/upload-art")]
    assert uploads, f"{workflow.name}: no artifact upload"
    for step in uploads:
        assert step.get("if") == "always()", f"{workflow.name}: upload must run on failure too"
    uploaded = [Path(p.strip()) for s in uploads for p in str(s["with"]["path"]).splitlines()]
    for argv in _pytest_commands(data):
        for flag, value in itertools.pairwise(argv):
            if flag in OUTPUT_OPTIONS:
                assert any(Path(value).is_relative_to(u) for u in uploaded), (
                    f"{workflow.name}: {flag} {value} is not under an uploaded path {uploaded}"
                )


def test_pr_gate_comments_the_summary_it_asked_for() -> None:
    data = _load(CI / "pr-moe-config-gate.yml")
    on = data.get("on", data.get(True))  # YAML 1.1 reads the key `on` as True
    assert on["pull_request"]["paths"] == ["**/E=*,N=*,device_name=*.json"]
    (argv,) = _pytest_commands(data)
    summary = argv[argv.index("--moeperf-ab-summary") + 1]
    assert argv[argv.index("-k") + 1] == "moe_config_ab" and "--moeperf-ab-control" in argv
    (post,) = [s for s in _steps(data) if str(s.get("uses", "")).startswith("actions/github-scr")]
    assert post["env"]["SUMMARY"] == summary and summary in post["if"]
    assert data["permissions"]["pull-requests"] == "write"
    checkout = next(s for s in _steps(data) if str(s.get("uses", "")).startswith("actions/check"))
    assert checkout["with"]["fetch-depth"] == 0


def test_refresh_opens_a_pr_only_after_a_passing_run() -> None:
    data = _load(CI / "refresh-baselines.yml")
    steps = list(_steps(data))
    measure = next(s for s in steps if "--moeperf-refresh-baselines" in s.get("run", ""))
    assert "${{" not in measure["run"], "inputs go through env, not into the script"
    assert measure["env"]["REASON"] == "${{ inputs.reason }}"
    assert not measure.get("continue-on-error")
    pr = next(s for s in steps if str(s.get("uses", "")).startswith("peter-evans/create-pull"))
    assert re.fullmatch(r"peter-evans/create-pull-request@v\d+", pr["uses"])  # pinned version
    assert pr.get("if", "success()") == "success()"
    assert steps.index(pr) > steps.index(measure)
    assert pr["with"]["add-paths"] == "baselines"
    on = data.get("on", data.get(True))
    assert on["workflow_dispatch"]["inputs"]["reason"]["required"] is True
