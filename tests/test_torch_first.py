"""The trap ``tests/torch_first.py`` guards against, and that its fixtures close it.

Each case is its own pytest process (the unguarded one segfaults): a pytester test whose inner,
in-process run imports torch first, then a test that imports torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

TESTS = """\
def test_inner_run_imports_torch_first(pytester):
    pytester.makepyfile("import torch\\ndef test_x(): pass")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_torch_imported_again():
    import torch
    assert torch.zeros(2).add(1).tolist() == [1.0, 1.0]
"""


def _run(tmp_path: Path, conftest: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_trap.py").write_text(TESTS)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "pytester", "-p", "no:cacheprovider",
         "-p", "no:moeperf", "-p", "no:randomly", "test_trap.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(HERE)},  # torch_first.py
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _needs_torch() -> None:
    pytest.importorskip("torch", reason="the trap is torch's: run `make test` (installs it)")


def test_without_the_guard_the_second_import_segfaults(tmp_path: Path) -> None:
    proc = _run(tmp_path, "")
    assert proc.returncode == -11, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])


def test_with_the_guard_both_pass(tmp_path: Path) -> None:
    proc = _run(tmp_path, "from torch_first import _torch_imported, pytester  # noqa: F401\n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
