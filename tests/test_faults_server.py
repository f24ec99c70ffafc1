"""Server faults on the real vLLM CPU server: killed mid-probe, port taken, never healthy, and
pytest itself interrupted (SIGINT, SIGTERM) while a probe runs.

Each of these is about one server's life or death, so each starts its own (eager mode, a small
spec); the pytester runs go through the real plugin in a subprocess. The server's process group
id comes from the ``pytest_moeperf_probe_start`` hook (a conftest writes it to a file).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_needed import skip_without_vllm

from pytest_moeperf.report.schema import validate
from pytest_moeperf.server import process
from pytest_moeperf.server.fixture import ServerFactory
from pytest_moeperf.server.process import group_alive

skip_without_vllm()
pytest_plugins = ["pytester"]

ARGS = ["--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8", "--enforce-eager"]

SPEC = """\
name: faults
model: {path: embedded, dtype: bfloat16, max_model_len: 512}
engine_args: {max-num-seqs: 8, enforce-eager: true}
workload: {trace: fixed, num_requests: 16, seed: 0, input_tokens: 32, output_tokens: 16}
arrival: {process: poisson}
slo: {ttft_p99_ms: 60000, tpot_p99_ms: 10000}  # never missed: the kill ends probe 2
search: {rate_min: 4.0, rate_max: 4000.0, tolerance: 0.1, max_probes: 3, probe_requests: 16,
         probe_duration_s: 3}  # probe 2 is x4 above a first met probe, wherever it starts
runs: 1
"""

TEST = """\
import pytest


@pytest.mark.moeperf_spec("spec.yaml")
def test_perf(moeperf):
    moeperf.run()
"""

# Records each probe start ("run probe rate pid") and, when asked, kills the server's process
# group a second into that probe: the server dies with requests in flight.
CONFTEST = """\
import os
import signal
import threading


def pytest_moeperf_probe_start(config, nodeid, run_number, probe_number, rate, server_pid):
    with open(os.environ["FAULTS_PROBES"], "a") as f:
        f.write(f"{run_number} {probe_number} {rate} {server_pid}\\n")
    if str(probe_number) == os.environ.get("FAULTS_KILL_AT_PROBE"):
        threading.Timer(1.0, os.killpg, (server_pid, signal.SIGKILL)).start()
"""


def _wait_gone(pgid: int, deadline_s: float) -> float:
    """Seconds until no process of the group is left (fails the test at the deadline)."""
    t0 = time.monotonic()
    while group_alive(pgid):
        assert time.monotonic() - t0 < deadline_s, f"vLLM process group {pgid} still alive"
        time.sleep(0.2)
    return time.monotonic() - t0


def _use_model_cache(monkeypatch: pytest.MonkeyPatch, embedded_model: Path) -> None:
    """pytester moves HOME; point the inner runs at the session's generated model."""
    monkeypatch.setenv("MOEPERF_CACHE_DIR", str(embedded_model.parent.parent))


def _setup(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, model: Path) -> Path:
    _use_model_cache(monkeypatch, model)
    pytester.makeconftest(CONFTEST)
    pytester.path.joinpath("spec.yaml").write_text(SPEC)
    pytester.makepyfile(test_perf=TEST)
    probes = pytester.path / "probes.txt"
    monkeypatch.setenv("FAULTS_PROBES", str(probes))
    return probes


def _probes(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_server_killed_mid_probe_is_partial_and_never_a_baseline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, embedded_model: Path
) -> None:
    probes = _setup(pytester, monkeypatch, embedded_model)
    monkeypatch.setenv("FAULTS_KILL_AT_PROBE", "2")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--moeperf-refresh-baselines", "--moeperf-reason", "faults",
        "--moeperf-results", "out/results.json", "--moeperf-baseline-dir", "baselines",
    )  # fmt: skip
    out = result.stdout.str()
    result.assert_outcomes(failed=1)
    seen = _probes(probes)  # one line per load attempt: a too-short probe 1 is rerun longer
    assert list(dict.fromkeys(p[1] for p in seen)) == ["1", "2"], seen
    assert seen[-1][1] == "2", seen
    rate = float(seen[-1][2])
    pgid = int(seen[-1][3])
    assert f"server died during probe 2 at rate {rate:g} req/s (run 1 of 1)" in out, out
    assert "server exit code -9" in out and "--- server log (last lines) ---" in out
    assert "baseline not-written: server died during probe 2" in out
    assert not list((pytester.path / "baselines").rglob("*.json")), "a partial run was written"
    validate(
        json.loads((pytester.path / "out" / "results.json").read_text()), "results.json"
    )  # the schema
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    (res,) = data["results"]
    assert res["outcome"] == "partial" and res["partial"] is True
    assert res["reasons"][0].startswith(f"server died during probe 2 at rate {rate:g}")
    first, died = res["partial_probes"]
    assert first["rate"] == float(seen[0][2]) and first["summary"]["n_requests"] >= 16
    assert died["rate"] == rate and died["aborted"] and died["partial"]
    assert (
        died["planned_requests"] >= 16
        and 1 <= died["recorded_requests"] <= died["planned_requests"]
    )
    assert res["baseline"]["status"] == "not-written"
    _wait_gone(pgid, 10)


def test_port_taken_between_choosing_and_binding_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedded_model: Path
) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    chosen: list[int] = []
    real_free_port = process.free_port

    def racy_free_port(host: str = "127.0.0.1") -> int:
        """The first choice is taken by someone else before vLLM binds it."""
        port = taken if not chosen else real_free_port(host)
        chosen.append(port)
        return port

    monkeypatch.setattr(process, "free_port", racy_free_port)
    factory = ServerFactory(tmp_path, startup_timeout_s=600)
    try:
        server = factory(embedded_model, ARGS, name="port")
        assert chosen[0] == taken and server.port == chosen[1] != taken
        assert server.alive() and server._healthy()
        log = server.log_text()
        assert "Address already in use" in log or "Errno 98" in log
        assert log.count("# moeperf: ") == 2 and f"--port {taken}" in log
    finally:
        factory.stop_all()
        holder.close()
    assert server.pgid is not None
    _wait_gone(server.pgid, 10)


HEALTH_TEST = """\
from pathlib import Path


def test_never_ready(moeperf_server_factory, moeperf_embedded_model):
    try:
        moeperf_server_factory(moeperf_embedded_model, ["--enforce-eager"], name="slow")
    finally:
        Path("pgid.txt").write_text(str(moeperf_server_factory.servers[0].pgid))
"""


def test_health_never_ready_is_a_clear_timeout_with_the_log_tail(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, embedded_model: Path
) -> None:
    """vLLM cannot be healthy 3 s after launch: the option's deadline must fail it cleanly."""
    _use_model_cache(monkeypatch, embedded_model)
    pytester.makepyfile(test_slow=HEALTH_TEST)
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--moeperf-startup-timeout", "3")  # fmt: skip
    elapsed = time.monotonic() - t0
    out = result.stdout.str()
    result.assert_outcomes(failed=1)
    assert "vLLM server not healthy after 3 s (GET http://127.0.0.1:" in out, out
    assert "Raise the startup timeout with --moeperf-startup-timeout" in out
    assert "command: " in out and "vllm.entrypoints.openai.api_server" in out
    assert "--- server log (last lines) ---" in out and "# moeperf: " in out
    assert "Traceback" not in out and "raise ServerError" not in out, "plugin internals shown"
    assert elapsed < 60, f"a 3 s startup deadline took {elapsed:.0f} s to report"
    _wait_gone(int((pytester.path / "pgid.txt").read_text()), 10)


def _sigint_default() -> None:
    """A job started in the background by a non-interactive shell (``cmd &``) inherits SIGINT
    *ignored*, and Python then never raises KeyboardInterrupt: give the pytest under test the
    default disposition a terminal's Ctrl-C meets."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupting_pytest_mid_probe_leaves_no_vllm_process(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, embedded_model: Path,
    sig: signal.Signals,
) -> None:  # fmt: skip
    """Ctrl-C (SIGINT) or a CI runner's cancel (SIGTERM) of pytest while load is running."""
    perf_run = _setup(pytester, monkeypatch, embedded_model)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--moeperf-baseline-dir",
           "baselines", "--moeperf-results", "out/results.json"]  # fmt: skip
    log = pytester.path / "pytest.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=pytester.path, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ), preexec_fn=_sigint_default)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not _probes(perf_run):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no probe started"
            time.sleep(0.2)
        pgid = int(_probes(perf_run)[0][3])
        time.sleep(1.0)  # requests in flight
        assert group_alive(pgid)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code != 0, text
    assert "KeyboardInterrupt" in text or "Interrupted" in text, text
    # The plugin stops the server before pytest exits (PR_SET_PDEATHSIG would only be a late
    # last resort): the group is gone by the time pytest's exit status is known.
    gone_s = _wait_gone(pgid, 2)
    print(f"{sig.name}: pytest exit {code}, process group gone {gone_s:.1f} s after exit")
    # nothing measured is lost: the interrupted test is in results.json as partial
    validate(
        json.loads((pytester.path / "out" / "results.json").read_text()), "results.json"
    )  # the schema
    (res,) = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    assert res["outcome"] == "partial" and res["partial"] is True, res["reasons"]
    assert (
        res["reasons"][0].startswith("interrupted (") and "during run 1 of 1" in res["reasons"][0]
    )
    assert res["baseline"]["status"] in ("missing", "not-written")
