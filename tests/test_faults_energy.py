"""NVML absent or failing mid-run, through one measured run: energy says "not measured" and why,
and the other metrics (goodput, rate, latencies) are kept.

``measure_run`` drives real load at the synthetic SSE server; the meter is the plugin's own
``NvmlEnergyMeter`` over the fake ``pynvml`` of test_energy.py (NVML alone is faked), or
``make_default_meter`` with pynvml not importable at all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sse_helpers import sse
from test_energy import FakeNvml

from pytest_moeperf.metrics.energy import (
    METHOD_NOT_MEASURED,
    EnergyMeter,
    EnergyReading,
    NvmlEnergyMeter,
    make_default_meter,
)
from pytest_moeperf.run.probe import Endpoint, RunMeasurement, measure_run
from pytest_moeperf.run.record import metric_entry
from pytest_moeperf.spec.loader import load_spec

#: Runs in ``make test``'s quiet pass (tests/conftest.py): in CI the first of these searches,
#: beside a vLLM server starting on the other xdist worker, found no steady rate even at 8 req/s
#: (twice at 60, once at 20, once at 8), and these tests are about energy, not the machine.
QUIET_CORES = True

SPEC = """\
name: energy-faults
model: {path: embedded, dtype: bfloat16, max_model_len: 1024}
workload: {trace: fixed, num_requests: 20, seed: 0, input_tokens: 8, output_tokens: 8}
arrival: {process: poisson}
slo: {ttft_p99_ms: 2000, tpot_p99_ms: 200}
search: {rate_min: 8, rate_max: 16, tolerance: 0.2, max_probes: 2, probe_requests: 40,
         probe_duration_s: 0.3}
runs: 1
"""


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    srv = sse.SSEServer(sse.ServerConfig(delay_s=0.002))
    port = srv.run_in_thread()
    yield Endpoint(f"http://127.0.0.1:{port}", "m")
    srv.stop_thread()


class FailsMidRun:
    """Starts fine, then the GPU is lost before the probe ends (every probe)."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake
        self.inner = NvmlEnergyMeter([0])

    def start(self) -> None:
        self.fake.counter_fail = False
        self.inner.start()
        self.fake.counter_fail = True

    def stop(self) -> EnergyReading:
        return self.inner.stop()


def _measure(tmp_path: Path, endpoint: Endpoint, meter: EnergyMeter) -> RunMeasurement:
    """One search at 8-16 req/s, 40 requests a probe. Was 60-120 req/s, then 20-40: under the
    full suite's load on 2 cores the client (and the in-process SSE server) fell behind there
    (89 % of due at 20 req/s) and found no boundary, which is not what these tests are about."""
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    spec = load_spec(path)
    return measure_run(endpoint, spec, spec.slo, index=0, meter=meter, vocab_size=500,
                       rate_min=8.0, probe_requests=40, max_probes=2,
                       mbu_inputs=None)  # fmt: skip


def _assert_goodput_kept(run: RunMeasurement) -> None:
    m = run.metrics
    assert run.search.boundary_rate is not None, run.search.note
    assert m["slo_goodput_tok_s"] is not None and m["slo_goodput_tok_s"] > 0
    assert m["slo_rate_rps"] == run.search.boundary_rate
    assert m["ttft_p99_ms"] is not None and m["tpot_p99_ms"] is not None


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[[], FakeNvml]:
    def install() -> FakeNvml:
        fake = FakeNvml(1)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def test_nvml_failing_mid_run_keeps_goodput_and_says_why(
    tmp_path: Path, endpoint: Endpoint, fake_nvml: Callable[[], FakeNvml]
) -> None:
    run = _measure(tmp_path, endpoint, FailsMidRun(fake_nvml()))
    _assert_goodput_kept(run)
    assert run.metrics["tok_per_j"] is None and run.metrics["power_w"] is None
    assert len(run.energy) == len(run.search.probes) >= 1
    for reading in run.energy:
        assert reading["method"] == METHOD_NOT_MEASURED and reading["joules"] is None
        assert "GPU is lost" in reading["reason"]
    notes = [n for n in run.notes if n.startswith("energy not measured: ")]
    assert len(notes) == 1 and "GPU is lost" in notes[0]
    entry = metric_entry("tok_per_j", [], [run])
    assert entry.center is None and entry.note is not None and "GPU is lost" in entry.note


def test_nvml_absent_keeps_goodput_and_says_why(
    tmp_path: Path, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    run = _measure(tmp_path, endpoint, make_default_meter([0]))
    _assert_goodput_kept(run)
    assert run.metrics["tok_per_j"] is None
    notes = [n for n in run.notes if n.startswith("energy not measured: ")]
    assert len(notes) == 1 and "pynvml (package nvidia-ml-py) is not importable" in notes[0]


def test_working_nvml_measures_energy(
    tmp_path: Path, endpoint: Endpoint, fake_nvml: Callable[[], FakeNvml]
) -> None:
    """The control: the same flow with a working meter reports tok/J, so the above can fail."""
    fake_nvml()
    run = _measure(tmp_path, endpoint, NvmlEnergyMeter([0]))
    _assert_goodput_kept(run)
    assert run.metrics["tok_per_j"] is not None and run.metrics["tok_per_j"] > 0
    assert not [n for n in run.notes if "energy" in n]


def test_a_missing_metric_gives_its_own_reason_not_another_metrics() -> None:
    """Was: every "not measured" note went on every missing metric, so a TPOT missing because
    every output was one token long read "not measured (energy not measured: ...)"."""
    from types import SimpleNamespace

    runs: Any = [SimpleNamespace(notes=["energy not measured: no NVML here",
                                        "MBU not measured: no model shape"])]  # fmt: skip
    assert metric_entry("tok_per_j", [], runs).note == "energy not measured: no NVML here"
    assert metric_entry("power_w", [], runs).note == "energy not measured: no NVML here"
    assert metric_entry("mbu", [], runs).note == "MBU not measured: no model shape"
    tpot = metric_entry("tpot_p99_ms", [], runs).note
    assert tpot.startswith("not measured: no request streamed two tokens or more"), tpot
    assert metric_entry("ttft_p99_ms", [], runs).note == "not measured"
