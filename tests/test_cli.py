"""The ``moeperf`` console script's dispatch: usage, exit codes, and one line for a typo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_moeperf.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_no_command_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: moeperf COMMAND" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_usage_and_exits_0(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag]) == 0
    out = capsys.readouterr().out
    assert "compare A.json B.json" in out and "report RUN.json" in out and "measure SPEC" in out
    assert "schema [baseline|spec]  " in out


def test_unknown_command_names_it_and_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compre", "a.json", "b.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "moeperf: unknown command 'compre'. Fix: use 'compare', 'report', 'measure' or 'schema'."
    )


@pytest.mark.parametrize("command", ["compare", "report", "measure", "schema"])
def test_sub_command_help_exits_0_with_its_own_prog(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse's SystemExit becomes a return code: callers (and CI steps) get an int."""
    assert main([command, "--help"]) == 0
    assert f"usage: moeperf {command}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "a.json", "b.json", "--no-such-option"], "unrecognized arguments"),
        (["compare", "a.json"], "required: B.json"),
        (["report", "run.json"], "required: --title"),
        (["report", "--title", "T"], "required: RUN.json"),
    ],
)
def test_sub_command_misuse_exits_2_naming_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"moeperf {argv[0]}: error:" in err and message in err


def test_console_script_module_runs() -> None:
    """``python -m pytest_moeperf.cli`` is what the ``moeperf`` entry point runs."""
    done = subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and "usage: moeperf COMMAND" in done.stdout


def test_schema_prints_the_published_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """``moeperf schema`` is docs/results.schema.json, for a dashboard to validate against."""
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert out == (ROOT / "docs" / "results.schema.json").read_text()
    assert main(["schema", "baseline"]) == 0
    out = capsys.readouterr().out
    assert out == (ROOT / "docs" / "baseline.schema.json").read_text()
    assert main(["schema", "spec"]) == 0
    out = capsys.readouterr().out
    assert out == (ROOT / "docs" / "spec.schema.json").read_text()
    assert main(["schema", "extra"]) == 2
    assert "moeperf schema: error: argument file: invalid choice: 'extra'" in (
        capsys.readouterr().err
    )
