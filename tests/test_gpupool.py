"""The GPU pool: disjoint leases across xdist workers, sized by vLLM's parallel flags.

No GPU is needed: the pool hands out CUDA_VISIBLE_DEVICES entries, and ``--moeperf-gpus``
stands in for the GPUs NVML would list. The xdist tests run real workers (pytester subprocesses
with ``-n``) whose tests lease through ``moeperf_gpus`` / ``moeperf_server_factory.prepare`` and
write what they got, and when, into files; the assertions are on those files.
"""

from __future__ import annotations

import json
import threading
import time
from itertools import combinations
from pathlib import Path

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.gpupool import (
    GpuLeaseTimeout,
    GpuPool,
    Universe,
    discover_universe,
    gpus_from_args,
    nvml_indices,
    parse_devices,
)

pytest_plugins = ["pytester"]


def make_pool(tmp_path: Path, devices: str = "0,1,2,3", wait_s: float = 5.0) -> GpuPool:
    universe = Universe(parse_devices(devices, "test"), "test") if devices else Universe((), "t")
    return GpuPool(lambda: universe, tmp_path / "locks", wait_s, "test")


# -- in one process ------------------------------------------------------------------------------
def test_leases_are_disjoint_and_released(tmp_path: Path) -> None:
    pool = make_pool(tmp_path)
    a = pool.lease(2, "a")
    b = pool.lease(1, "b")
    assert a.devices == ("0", "1") and b.devices == ("2",)
    assert a.env == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    a.release()
    c = pool.lease(3, "c")
    assert c.devices == ("0", "1", "3")
    b.release()
    c.release()
    assert pool.lease(4, "d").devices == ("0", "1", "2", "3")


def test_other_process_waits_until_release(tmp_path: Path) -> None:
    """Two pools on one lock folder stand for two workers; flock is per open file, so it works."""
    one, two = make_pool(tmp_path), make_pool(tmp_path, wait_s=10)
    held = one.lease(3, "one")
    threading.Timer(0.6, held.release).start()
    t0 = time.monotonic()
    got = two.lease(2, "two")
    assert time.monotonic() - t0 >= 0.5 and got.waited_s >= 0.5
    assert len(got.devices) == 2


def test_wait_times_out_naming_the_holder(tmp_path: Path) -> None:
    one, two = make_pool(tmp_path, "0,1"), make_pool(tmp_path, "0,1", wait_s=0.3)
    one.lease(2, "tests/test_a.py::test_holder")
    with pytest.raises(GpuLeaseTimeout) as exc:
        two.lease(1, "tests/test_b.py::test_waiter")
    text = str(exc.value)
    assert "after waiting 0.3 s" in text and "test_holder" in text and "GPU 0: pid" in text
    assert "--moeperf-gpu-wait" in text


def test_more_gpus_than_the_pool_fails_at_once(tmp_path: Path) -> None:
    """A lease that can never be granted fails before the pool's wait: with a 60 s wait, an
    answer within 30 s can only be the immediate refusal (no timing goal: a behaviour)."""
    pool = make_pool(tmp_path, "0,1", wait_s=60)
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=r"needs 4 GPUs \(tensor 4.*pool has 2: \[0,1\]"):
        pool.lease(4, "t", "tensor 4 x pipeline 1 x data 1")
    assert time.monotonic() - t0 < 30
    pool.lease(1, "t")
    with pytest.raises(UsageError, match="already holds 1 for another server"):
        pool.lease(2, "t")


def test_exclusive_takes_everything_and_servers_carve_from_it(tmp_path: Path) -> None:
    pool, other = make_pool(tmp_path), make_pool(tmp_path, wait_s=0.2)
    ex = pool.exclusive("x")
    assert ex.devices == ("0", "1", "2", "3") and ex.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    with pytest.raises(GpuLeaseTimeout, match="a moeperf_exclusive test holds the node"):
        other.lease(0, "cpu server elsewhere")  # the node lock also keeps CPU servers out
    a, b = pool.lease(2, "x"), pool.lease(2, "x")
    assert set(a.devices).isdisjoint(b.devices)
    with pytest.raises(UsageError, match="only 0 of the exclusive lease"):
        pool.lease(1, "x")
    a.release()
    assert pool.lease(2, "x").devices == a.devices
    ex.release()
    assert other.lease(4, "y").devices == ("0", "1", "2", "3")


def test_second_server_of_a_test_does_not_queue_behind_a_waiting_exclusive(tmp_path: Path) -> None:
    """A/B test on one worker, exclusive test waiting on another: no deadlock."""
    ab, ex = make_pool(tmp_path), make_pool(tmp_path, wait_s=10)
    first = ab.lease(1, "ab")
    got: list[tuple[str, ...]] = []
    waiter = threading.Thread(target=lambda: got.append(ex.exclusive("ex").devices))
    waiter.start()
    time.sleep(0.3)  # the exclusive lease now holds acquire.lock and waits for the node
    assert not got
    second = ab.lease(1, "ab")  # would wait for acquire.lock (and time out) if it queued
    assert second.waited_s < 0.2 and set(second.devices).isdisjoint(first.devices)
    first.release()
    second.release()
    waiter.join(5)
    assert got == [("0", "1", "2", "3")]
    with pytest.raises(UsageError, match="already holds a lease"):
        ex.exclusive("again")  # ex holds the exclusive lease now


def test_no_gpus_means_no_leases(tmp_path: Path) -> None:
    pool = make_pool(tmp_path, "")
    lease = pool.lease(2, "cpu")  # a CPU server with --tensor-parallel-size 2
    assert lease.devices == () and lease.env == {}


# -- pieces ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, 1),
        (["--tensor-parallel-size", "2"], {}, 2),
        (["-tp", "2", "--pipeline-parallel-size=2", "--data-parallel-size", "2"], {}, 8),
        (["--tensor_parallel_size", "4", "--tensor-parallel-size", "2"], {}, 2),  # last wins
        (["-tp", "2", "-dp", "4", "--data-parallel-size-local", "2"], {}, 4),
        (["-tp", "2", "--distributed-executor-backend", "ray"], {}, 2),  # local Ray
        (["-tp", "8", "--distributed-executor-backend", "ray"], {"RAY_ADDRESS": "ray://h:1"}, 0),
    ],
)
def test_gpus_from_vllm_flags(args: list[str], env: dict[str, str], expected: int,
                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert gpus_from_args(args, env)[0] == expected


def test_universe_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert discover_universe(None, "default") == Universe(
        ("2", "3"), "environment variable CUDA_VISIBLE_DEVICES"
    )
    assert discover_universe("0,1,5", "command line --moeperf-gpus").devices == ("0", "1", "5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert discover_universe(None, "default").devices == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,gpu0")
    with pytest.raises(UsageError, match=r"CUDA_VISIBLE_DEVICES: GPU list = '0,gpu0'.*'gpu0'"):
        discover_universe(None, "default")
    with pytest.raises(UsageError, match="1 listed twice"):
        parse_devices("1,1", "command line --moeperf-gpus")


def test_visible_devices_map_to_nvml_indices() -> None:
    uuids = {0: "GPU-aaaa-1111", 1: "GPU-bbbb-2222", 2: None}
    assert nvml_indices(("1", "0"), uuids) == (1, 0)
    assert nvml_indices(("GPU-bbbb-2222", "GPU-aaaa"), uuids) == (1, 0)  # prefixes, as CUDA
    assert nvml_indices(("MIG-1234-5678",), uuids) == ()  # board energy is shared: not measured


# -- real xdist workers -------------------------------------------------------------------------
WORKER_TESTS = """
import json, os, time
import pytest

def record(name, devices, t0, **extra):
    rec = {"devices": list(devices), "t0": t0, "t1": time.time(), **extra}
    with open(os.path.join(os.environ["POOL_OUT"], name + ".json"), "w") as f:
        json.dump(rec, f)

@pytest.mark.parametrize("i", range(4))
def test_tp1(moeperf_server_factory, i):
    server = moeperf_server_factory.prepare("model", ["--max-num-seqs", "4"], name=f"s{i}")
    t0 = time.time()
    time.sleep(1.0)
    record(f"tp1-{i}", server.gpu_devices, t0, want=1)

@pytest.mark.parametrize("i", range(3))
def test_tp2(moeperf_server_factory, i):
    server = moeperf_server_factory.prepare("model", ["--tensor-parallel-size", "2"])
    t0 = time.time()
    time.sleep(1.0)
    env = server.launch_env()
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(server.gpu_devices)
    record(f"tp2-{i}", server.gpu_devices, t0, want=2)

@pytest.mark.moeperf_exclusive
def test_exclusive(moeperf_gpus, moeperf_server_factory):
    t0 = time.time()
    server = moeperf_server_factory.prepare("model", ["-tp", "2"])
    time.sleep(1.0)
    record("exclusive", moeperf_gpus.exclusive_lease.devices, t0, want=4,
           server=list(server.gpu_devices))
"""


def _records(out: Path) -> dict[str, dict[str, object]]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def _overlap(a: dict[str, object], b: dict[str, object]) -> bool:
    return float(a["t0"]) < float(b["t1"]) and float(b["t0"]) < float(a["t1"])  # type: ignore[arg-type]


def test_xdist_workers_get_disjoint_gpus_sized_by_parallelism(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = pytester.mkdir("out")
    monkeypatch.setenv("POOL_OUT", str(out))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile(test_pool=WORKER_TESTS)
    result = pytester.runpytest_subprocess("-n", "3", "-p", "no:cacheprovider",
                                           "--moeperf-gpus", "0,1,2,3", timeout=300)  # fmt: skip
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["*test_exclusive is marked moeperf_exclusive: it holds all 4 GPUs*"
                                 "serialised*"])  # fmt: skip
    recs = _records(out)
    assert len(recs) == 8
    for name, r in recs.items():
        assert len(r["devices"]) == r["want"], (name, r)  # type: ignore[arg-type]
        assert set(r["devices"]) <= {"0", "1", "2", "3"}  # type: ignore[arg-type]
    assert recs["exclusive"]["devices"] == ["0", "1", "2", "3"]
    assert len(recs["exclusive"]["server"]) == 2  # type: ignore[arg-type]
    overlapping = 0
    for (na, a), (nb, b) in combinations(sorted(recs.items()), 2):
        if _overlap(a, b):
            overlapping += 1
            assert "exclusive" not in (na, nb), f"{na} and {nb} ran at the same time"
            assert set(a["devices"]).isdisjoint(b["devices"]), (na, a, nb, b)  # type: ignore[arg-type]
    assert overlapping >= 2, "the workers never held GPUs at the same time: nothing was tested"


WAIT_TESTS = """
import json, os, time
import pytest

@pytest.mark.parametrize("i", range(2))
def test_hold(moeperf_gpus, i):
    out = os.environ["POOL_OUT"]
    open(os.path.join(out, f"ready-{i}"), "w").close()
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(out, f"ready-{1 - i}")):  # both workers lease at once
        assert time.time() < deadline, "the other worker never started"
        time.sleep(0.05)
    with moeperf_gpus.lease(1) as lease:
        t0 = time.time()
        time.sleep(float(os.environ["HOLD_S"]))
        rec = {"devices": list(lease.devices), "t0": t0, "t1": time.time(),
               "waited_s": lease.waited_s}
    with open(os.path.join(os.environ["POOL_OUT"], f"hold-{i}.json"), "w") as f:
            json.dump(rec, f)
"""


def test_xdist_worker_waits_for_a_busy_gpu(pytester: pytest.Pytester,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    out = pytester.mkdir("out")
    monkeypatch.setenv("POOL_OUT", str(out))
    monkeypatch.setenv("HOLD_S", "1.5")
    pytester.makepyfile(test_wait=WAIT_TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider",
                                           "--moeperf-gpus", "3", timeout=300)  # fmt: skip
    result.assert_outcomes(passed=2)
    a, b = _records(out).values()
    assert a["devices"] == b["devices"] == ["3"]
    assert not _overlap(a, b)
    # they asked at the same moment (a barrier), so one waited for the other's lease
    assert max(float(a["waited_s"]), float(b["waited_s"])) > 1.0  # type: ignore[arg-type]


def test_xdist_wait_timeout_is_one_clear_failure(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POOL_OUT", str(pytester.mkdir("out")))
    monkeypatch.setenv("HOLD_S", "3")
    pytester.makepyfile(test_wait=WAIT_TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider",
                                           "--moeperf-gpus", "0", "--moeperf-gpu-wait", "1",
                                           timeout=300)  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*no lease of 1 GPUs from [[]0[]] (command line --moeperf-gpus) after waiting 1 s "
        "(1 more GPUs are busy); held by: GPU 0: pid * worker gw* test *test_hold*"
        "Fix: raise --moeperf-gpu-wait (now 1 s from command line --moeperf-gpu-wait)*",
    ])  # fmt: skip


def test_more_gpus_than_exist_is_one_clear_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_tp4(moeperf_server_factory):
            moeperf_server_factory.prepare("model", ["--tensor-parallel-size", "4"])
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-gpus", "0,1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*test_tp4*GPUs needed = 4: the server needs 4 GPUs (tensor 4 x pipeline 1 x data 1) "
        "but the pool has 2: [[]0,1[]] from command line --moeperf-gpus. Fix: *--moeperf-gpus*"
    ])  # fmt: skip
    result.stdout.no_fnmatch_line("*gpupool.py*")  # no traceback into the plugin


def test_bad_gpu_list_names_the_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(moeperf_gpus):\n    moeperf_gpus.lease(1)\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-gpus", "0,x")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*command line --moeperf-gpus: GPU list = '0,x': entry 'x' is "
                                 "not a GPU index or UUID. Fix: *"])  # fmt: skip


def test_exclusive_marker_takes_no_arguments(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.moeperf_exclusive(2)
        def test_x():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*marker @pytest.mark.moeperf_exclusive on test_*.py:3 (test_x): "
                                 "arguments = '(2)': too many positional arguments*"])  # fmt: skip


def test_setup_counts_exactly_the_leased_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment (energy meter devices, MBU GPU count, baseline key) is the lease's."""
    from pytest_moeperf import environment
    from pytest_moeperf.metrics import hardware

    def gpu(i: int) -> hardware.GpuInfo:
        return hardware.GpuInfo(i, "NVIDIA H200", f"GPU-{i}{i}{i}{i}-uuid", "580.1", "13.0",
                                None, 700.0, None, None, None, None)  # fmt: skip

    monkeypatch.setattr(hardware, "visible_gpus", lambda: [gpu(i) for i in range(8)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # pytest's: not the server's
    env = environment.collect(engine_version="0.32.0", backend_hint="cuda", gpus_needed=2,
                              devices=("6", "GPU-7777"))  # fmt: skip
    assert env.gpu_indices == (6, 7) and env.gpu_count == 2 and env.backend == "cuda"
    ext = environment.collect(engine_version="0.32.0", backend_hint="external", gpus_needed=1,
                              devices=("GPU-3333",))  # fmt: skip
    assert ext.backend == "external" and ext.gpu_indices == (3,)
    unnamed = environment.collect(engine_version=None, backend_hint="external", gpus_needed=1,
                                  devices=())  # fmt: skip
    assert unnamed.gpu_count == 0 and unnamed.accelerator == "unknown"


RELAY_TESTS = """
import pytest
from pytest_moeperf.plugin import SESSION_KEY
from pytest_moeperf.session import PerfResult

@pytest.mark.parametrize("i", range(3))
def test_measured(request, i):
    session = request.config.stash[SESSION_KEY]
    session.record(PerfResult.from_dict(request.node.nodeid, "passed",
                                        {"metrics": {"x": {"center": i}}},
                                        table=f"table of config {i}"))
    session.warn(f"note from config {i}")
"""


def test_xdist_worker_results_reach_the_controller(pytester: pytest.Pytester) -> None:
    """Workers measure; the controller prints every result and writes one results file."""
    pytester.makepyfile(test_relay=RELAY_TESTS)
    results = pytester.path / "results.json"
    result = pytester.runpytest_subprocess("-n", "3", "-p", "no:cacheprovider",
                                           "--moeperf-results", str(results))  # fmt: skip
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*moeperf results*"])
    for i in range(3):
        result.stdout.fnmatch_lines([f"*test_measured[[]{i}[]]*[[]passed[]]*",
                                     f"*table of config {i}*"])  # fmt: skip
        result.stdout.fnmatch_lines([f"warning: note from config {i}"])
    data = json.loads(results.read_text())
    got = sorted(r["metrics"]["x"]["center"] for r in data["results"])
    assert got == [0, 1, 2] and len(data["warnings"]) == 3
