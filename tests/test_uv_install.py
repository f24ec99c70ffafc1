"""``tools/uv_install.py``: uv is handed what pip is configured with, and pip takes over when
uv cannot do the install."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "uv_install.py"

#: ``pip config list`` on the CI machines (2026-12-07): a user file, the environment, a global file.
LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels-old'
"""


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("uv_install", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


uv_install = _tool()


def test_the_environment_beats_a_file_as_in_pip() -> None:
    settings = uv_install.pip_settings(LISTING)
    assert settings["find-links"] == "/opt/wheels"
    assert settings["constraint"] == "/etc/xdg/pip/constraints.txt"
    assert settings["cert"] == "/etc/ssl/certs/ca-certificates.crt"


def test_install_beats_global_and_unknown_lines_are_ignored() -> None:
    listing = "install.index-url='https://b'\nglobal.index-url='https://a'\nnot a setting\nx=y\n"
    assert uv_install.pip_settings(listing) == {"index-url": "https://b"}


def test_every_mirror_becomes_one_argument_and_uv_picks_as_pip_does() -> None:
    args = uv_install.uv_arguments(uv_install.pip_settings(LISTING))
    assert args == [
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip


def test_without_pip_settings_uv_gets_none() -> None:
    assert uv_install.uv_arguments({}) == []


def test_pips_ca_bundle_reaches_uv_unless_one_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    assert uv_install.uv_environment({"cert": "/c.pem"})["SSL_CERT_FILE"] == "/c.pem"
    monkeypatch.setenv("SSL_CERT_FILE", "/mine.pem")
    assert uv_install.uv_environment({"cert": "/c.pem"})["SSL_CERT_FILE"] == "/mine.pem"


def _fake_run(calls: list[list[str]], fail: set[str]) -> Any:
    """subprocess.run standing in for pip and uv: records each command; a command whose
    program or pip verb is in ``fail`` exits 1."""

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        what = cmd[3] if cmd[1:3] == ["-m", "pip"] else Path(cmd[0]).name
        out = LISTING if cmd[3:5] == ["config", "list"] else ""
        return subprocess.CompletedProcess(cmd, 1 if what in fail else 0, out, "")

    return run


def test_uv_does_the_install_with_pips_settings(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:  # fmt: skip
    calls: list[list[str]] = []
    monkeypatch.setattr(uv_install.subprocess, "run", _fake_run(calls, set()))
    monkeypatch.setattr(uv_install.shutil, "which", lambda *a, **k: str(tmp_path / "uv"))
    assert uv_install.main(["-e", ".[cpu]"]) == 0
    assert calls[-1][:3] == [str(tmp_path / "uv"), "pip", "install"]
    assert calls[-1][-2:] == ["-e", ".[cpu]"] and "/opt/wheels" in calls[-1]
    assert not any(c[3:4] == ["install"] and "-e" in c for c in calls[:-1]), "pip installed too"


def test_when_uv_fails_pip_installs_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:  # fmt: skip
    calls: list[list[str]] = []
    monkeypatch.setattr(uv_install.subprocess, "run", _fake_run(calls, {"uv"}))
    monkeypatch.setattr(uv_install.shutil, "which", lambda *a, **k: str(tmp_path / "uv"))
    assert uv_install.main(["-e", "."]) == 0
    assert calls[-1] == [sys.executable, "-m", "pip", "install", "-q", "-e", "."]
    assert "failed: installing with pip instead" in capsys.readouterr().err


def test_when_uv_cannot_be_installed_pip_installs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    pip_install_uv_fails = {"install"}  # every pip install fails: uv's, then the fallback's
    monkeypatch.setattr(uv_install.subprocess, "run", _fake_run(calls, pip_install_uv_fails))
    assert uv_install.main(["-e", "."]) == 1  # pip's own failure is the exit status
    assert calls[-1] == [sys.executable, "-m", "pip", "install", "-q", "-e", "."]
    assert "uv could not be installed" in capsys.readouterr().err
