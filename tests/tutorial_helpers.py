"""docs/tutorial.md's runnable blocks, and a fresh copy of the repository to run them in.

Shared by ``tests/test_tutorial.py`` (the tutorial as written) and ``tests/test_e2e_baseline.py``
(a slowed server against the baseline the tutorial's first block recorded): recording a
baseline is three measured runs on a real server, paid once per session (``tutorial_checkout``
in ``conftest.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"<!-- tutorial: run -->\s*```sh\n(.*?)```", re.S)


def tutorial_blocks(text: str) -> list[str]:
    return [b.strip() for b in BLOCK.findall(text)]


def copy_checkout(dest: Path) -> Path:
    """The tracked files of this repository, without baselines, .venv -> this environment."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    shutil.rmtree(dest / "baselines", ignore_errors=True)  # the tutorial starts with none
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the plugin's and pytest's own variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOEPERF_", "PYTEST_"))}
    return {**env, **extra}


def run_block(block: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", block], cwd=cwd, env=clean_env(**extra),
                          text=True, capture_output=True, timeout=1200)  # fmt: skip


def tail(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout[-4000:] + proc.stderr[-2000:]
