"""The ``moeperf`` console script's dispatch: usage, exit codes, and one line for a typo."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_moeperf.cli import main


def test_no_command_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: moeperf COMMAND" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_usage_and_exits_0(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag]) == 0
    out = capsys.readouterr().out
    assert "compare A.json B.json" in out and "report RUN.json" in out and "measure SPEC" in out


def test_unknown_command_names_it_and_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compre", "a.json", "b.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "moeperf: unknown command 'compre'. Fix: use 'compare', 'report' or 'measure'."


@pytest.mark.parametrize("command", ["compare", "report", "measure"])
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
