"""The GPU pool on real GPUs: NVML's list, CUDA's view of a lease, energy on the leased GPU.

Skipped without an NVIDIA GPU and torch (this CPU machine, CI); run on a GPU machine with
``pytest tests/test_gpupool_gpu.py``. A process started with a lease's environment (as a vLLM
server is) must see exactly the leased GPUs, named by index or by UUID, and the energy meter
must read those same GPUs through NVML.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_moeperf.gpupool import GpuPool, Universe, discover_universe
from pytest_moeperf.metrics.hardware import visible_gpus

pytest_plugins = ["pytester"]

GPUS = visible_gpus()
pytestmark = pytest.mark.skipif(not GPUS, reason="needs an NVIDIA GPU: NVML sees none here")

#: Runs as the "server": what CUDA shows it, then a few seconds of matmuls on its GPU 0.
CHILD = r"""
import json, sys, time, torch
props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
uuids = ["GPU-" + str(p.uuid) for p in props]
x = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    y = x @ x
torch.cuda.synchronize()
print(json.dumps({"count": len(props), "uuids": uuids}))
"""


def _child(env: dict[str, str], seconds: float) -> dict[str, object]:
    pytest.importorskip("torch", reason="needs torch to stand in for a CUDA server process")
    import os

    out = subprocess.run([sys.executable, "-c", CHILD, str(seconds)], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("by", ["index", "uuid"])
def test_lease_is_what_cuda_sees_and_energy_reads_it(
    tmp_path: Path, by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_moeperf import environment
    from pytest_moeperf.metrics.energy import make_default_meter

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = discover_universe(None, "default")
    assert nvml.source == "NVML" and nvml.devices == tuple(str(g.index) for g in GPUS)
    last = GPUS[-1]
    universe = (str(g.index) for g in GPUS) if by == "index" else (str(g.uuid) for g in GPUS)
    pool = GpuPool(lambda: Universe(tuple(universe), "test"), tmp_path / "locks", 5.0)
    for _ in GPUS[:-1]:  # leave only the last GPU free, so the lease is not just "GPU 0"
        pool.lease(1, "other")
    lease = pool.lease(1, "server")
    setup = environment.collect(engine_version="x", backend_hint="cuda", gpus_needed=1,
                                devices=lease.devices)  # fmt: skip
    assert setup.gpu_indices == (last.index,) and setup.gpu_count == 1
    meter = make_default_meter(list(setup.gpu_indices))
    meter.start()
    seen = _child(lease.env, 4.0)
    reading = meter.stop()
    assert seen["count"] == 1 and seen["uuids"] == [last.uuid]
    assert reading.joules is not None and reading.joules > 0, reading
    assert reading.devices == [last.index]
    print(
        f"{by}: lease {lease.devices} -> NVML {setup.gpu_indices}, {reading.joules:.0f} J "
        f"over {reading.seconds:.1f} s ({reading.avg_power_w:.0f} W, {reading.method})"
    )


def test_xdist_workers_on_real_gpus(pytester: pytest.Pytester) -> None:
    """Two workers, one lease each: with one GPU they take turns; with more, different GPUs."""
    pytester.makepyfile(
        f"""
        import json, os, subprocess, sys, time
        import pytest

        CHILD = {CHILD!r}

        @pytest.mark.parametrize("i", range(2))
        def test_run(moeperf_gpus, i):
            with moeperf_gpus.lease(1) as lease:
                t0 = time.time()
                out = subprocess.run([sys.executable, "-c", CHILD, "2"],
                                     env={{**os.environ, **lease.env}}, capture_output=True,
                                     text=True, check=True)
                seen = json.loads(out.stdout.strip().splitlines()[-1])
                rec = {{"devices": list(lease.devices), "seen": seen, "t0": t0,
                        "t1": time.time()}}
            with open(f"rec-{{i}}.json", "w") as f:
                json.dump(rec, f)
        """
    )
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=2)
    recs = [json.loads((pytester.path / f"rec-{i}.json").read_text()) for i in range(2)]
    by_index = {str(g.index): g.uuid for g in GPUS}
    for r in recs:
        assert r["seen"]["count"] == 1 and r["seen"]["uuids"] == [by_index[r["devices"][0]]]
    a, b = recs
    overlap = a["t0"] < b["t1"] and b["t0"] < a["t1"]
    if len(GPUS) == 1:
        assert not overlap  # one GPU: the second worker waited for the first
    elif overlap:
        assert a["devices"] != b["devices"]
