"""The per-M kernel A/B harness (ab/kernel_bench.py) and its CLI (ab/perm_cli.py).

Everything that needs no GPU runs here: why the flow skips, the torch reference MoE on the CPU,
the replay order and time plan, the test-case maker, the CLI's skip path and the report built
from recorded samples. One test times real kernels; it skips with skip_reason() off a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_moeperf.ab import kernel_bench as kb
from pytest_moeperf.ab.perm_report import numerics_tolerance, tie_note
from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.perm import m_values, tiling

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "h200" / "perm_kernels.py"  # the wrapper of ab/perm_cli.py
GRID = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


@pytest.fixture(scope="module")
def cli() -> ModuleType:
    return importlib.import_module("pytest_moeperf.ab.perm_cli")


def tile(
    bm: int, bn: int = 64, bk: int = 128, g: int = 1, w: int = 4, s: int = 3
) -> dict[str, Any]:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
            "num_warps": w, "num_stages": s}  # fmt: skip


def grid_config() -> dict[str, Any]:
    """Like vLLM's H200 file: a different tiling per key, plus the metadata key vLLM pops."""
    out: dict[str, Any] = {"triton_version": "3.6.0"}
    for i, m in enumerate(GRID):
        bm = 16 if m <= 16 else 32 if m <= 64 else 128
        out[str(m)] = tile(bm, 64 + 64 * (i % 2), s=2 + i % 3)
    return out


# ---- why it skips, and the vLLM API check -------------------------------------------------------


def test_skip_reason_says_there_is_no_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = kb.skip_reason()
    assert reason is not None and reason.startswith("no CUDA device")
    assert torch.__version__ in reason


def test_skip_reason_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert kb.skip_reason() == (
        "torch is not installed, so there is no GPU to time fused-MoE kernels on"
    )


def test_this_machine_skips_with_a_sentence_or_has_a_gpu() -> None:
    reason = kb.skip_reason()
    assert reason is None or (reason.endswith(("GPU", "kernels")) or "vLLM" in reason)


@pytest.mark.parametrize(
    ("symbol", "named"),
    [
        (("json", "no_such_function", ()), "'json.no_such_function'"),
        (("no_such_module_kb", "f", ()), "'no_such_module_kb.f'"),
        (("json", "dumps", ("no_such_kw",)), "'json.dumps(no_such_kw=)'"),
    ],
)
def test_an_api_difference_is_one_error_naming_the_symbol(
    symbol: tuple[str, str, tuple[str, ...]], named: str
) -> None:
    with pytest.raises(UsageError) as exc:
        kb.resolve([("json", "loads", ("s",)), symbol])
    assert named in str(exc.value) and f"vllm=={kb.VLLM_API}" in str(exc.value)


def test_the_symbols_are_vllm_024s_fused_moe_api() -> None:
    names = {(mod, name) for mod, name, _ in kb.SYMBOLS}
    fm = "vllm.model_executor.layers.fused_moe"
    assert {(fm, "override_config"), (fm, "fused_experts"), (fm, "fused_topk")} <= names
    assert (fm + ".config", "fp8_w8a8_moe_quant_config") in names


# ---- shape ---------------------------------------------------------------------------------------


def test_shape_from_the_qwen3_30b_a3b_config(cli: ModuleType) -> None:
    shape = kb.MoeShape(128, 768, 2048, 8, "bf16")
    assert cli.read_shape(ROOT / cli.DEFAULT_SHAPE, "bf16") == shape
    assert cli.read_shape(ROOT / cli.DEFAULT_SHAPE, "fp8_w8a8", tp=2).n == 384


MOE = {"moe_intermediate_size": 6, "hidden_size": 8, "num_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize(
    ("cfg", "tp", "dtype", "what"),
    [
        ({"hidden_size": 8, "num_experts": 4, "num_experts_per_tok": 2}, 1, "bf16", "intermediate"),
        (MOE, 4, "bf16", "tp"),
        (MOE, 1, "int4", "dtype"),
        (MOE | {"num_experts_per_tok": 5}, 1, "bf16", "topk"),
    ],
)
def test_shape_errors_name_the_field(
    cli: ModuleType, cfg: dict[str, Any], tp: int, dtype: str, what: str
) -> None:
    with pytest.raises(UsageError, match=what):
        cli.shape_from_config(cfg, dtype, tp)


# ---- reference MoE, fp8 weights, relative error (torch on the CPU) -----------------------------


def test_reference_by_hand_gate_is_the_first_half() -> None:
    """E=2, K=2, N=1, top-1 on expert 1 with weight 0.5: [g; u] = x, y = 0.5 * silu(1) * 2 * w2."""
    x = torch.tensor([[1.0, 2.0]])
    w1 = torch.eye(2).expand(2, 2, 2).clone()  # [E, 2N, K]
    w2 = torch.tensor([[1.0], [3.0]]).expand(2, 2, 1).clone()  # [E, K, N]
    y = kb.reference_moe(x, w1, w2, torch.tensor([[0.5]]), torch.tensor([[1]], dtype=torch.int32))
    a = 2.0 / (1.0 + math.exp(-1.0))  # silu(g=1) * u=2; a swapped gate would give silu(2) * 1
    assert y.dtype == torch.float64
    assert y[0].tolist() == pytest.approx([0.5 * a, 1.5 * a], rel=1e-12)


def naive_moe(x: Any, w1: Any, w2: Any, tw: Any, ti: Any) -> list[list[float]]:
    """Token by token, expert by expert, in Python floats: the definition written out."""
    n, out = w2.shape[2], []
    for t in range(x.shape[0]):
        y = [0.0] * w2.shape[1]
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            h = [sum(float(w1[e, r, c]) * float(x[t, c]) for c in range(x.shape[1]))
                 for r in range(2 * n)]  # fmt: skip
            act = [h[i] / (1 + math.exp(-h[i])) * h[n + i] for i in range(n)]
            for r in range(w2.shape[1]):
                y[r] += float(tw[t, j]) * sum(float(w2[e, r, i]) * act[i] for i in range(n))
        out.append(y)
    return out


def test_reference_matches_the_definition_on_a_tiny_moe() -> None:
    g = torch.Generator().manual_seed(1)
    e, k, n, topk, m = 4, 8, 6, 2, 5
    x = torch.randn(m, k, generator=g)
    w1, w2 = torch.randn(e, 2 * n, k, generator=g), torch.randn(e, k, n, generator=g)
    tw, ti = torch.softmax(torch.randn(m, e, generator=g), -1).topk(topk)
    tw = tw / tw.sum(-1, keepdim=True)
    got = kb.reference_moe(x, w1, w2, tw, ti.to(torch.int32), dtype=torch.float32)
    assert got.dtype == torch.float32
    assert got.tolist() == [
        pytest.approx(r, rel=1e-4, abs=1e-4) for r in naive_moe(x, w1, w2, tw, ti)
    ]


def test_fp8_weights_per_expert_and_the_reference_dequantises_them() -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(3, 12, 8, generator=g) * torch.tensor([1.0, 10.0, 0.01])[:, None, None]
    q, s = kb.quantize_fp8(w.to(torch.bfloat16), torch.float8_e4m3fn)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3,)
    deq = q.float() * s[:, None, None]
    assert (deq.abs().amax(dim=(1, 2)) / w.abs().amax(dim=(1, 2))).tolist() == pytest.approx(
        [1.0] * 3, rel=2**-7
    )  # each expert's largest weight maps to e4m3's 448
    assert torch.allclose(deq, w, rtol=2**-4, atol=float(s.max()) * 2**-9)
    x, ti = torch.randn(4, 8, generator=g), torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2]])
    tw = torch.full((4, 2), 0.5)
    w2 = torch.randn(3, 8, 6, generator=g)
    q2, s2 = kb.quantize_fp8(w2, torch.float8_e4m3fn)
    got = kb.reference_moe(x, q, q2, tw, ti, s, s2)
    want = kb.reference_moe(x, deq, q2.float() * s2[:, None, None], tw, ti)
    assert kb.rel_error(got, want) < 1e-6  # deq was rounded to fp32 here, not in the reference


def test_relative_error() -> None:
    ref = torch.tensor([[3.0, 4.0]])
    assert kb.rel_error(torch.tensor([[3.0, 4.5]]), ref) == pytest.approx(0.1)
    assert kb.rel_error(ref, ref) == 0.0
    assert kb.rel_error(torch.tensor([[math.nan, 4.0]]), ref) == math.inf
    assert kb.rel_error(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2)) == math.inf


# ---- replay order and time plan ------------------------------------------------------------------


def test_abba_balances_order_and_gating_draws() -> None:
    order = kb.abba(4)
    assert [s[0][0] for s in order[:8]] == ["b", "h", "h", "b", "h", "b", "b", "h"]
    for side in ("base", "head"):
        mine = [(i, idx) for i, (s, idx) in enumerate(order) if s == side]
        assert len(mine) == 8
        assert sorted(idx for _, idx in mine) == list(range(8))  # every draw feeds both sides
    pos = {s: sum(i for i, (x, _) in enumerate(order) if x == s) for s in ("base", "head")}
    assert pos["base"] == pos["head"]  # linear drift cancels


@pytest.mark.parametrize(
    ("replay_s", "budget_s", "rounds"),
    [(0.001, 1.0, 50), (0.05, 2.0, 10), (0.5, 1.0, 8), (0.0, 1.0, 50)],
)
def test_plan_rounds(replay_s: float, budget_s: float, rounds: int) -> None:
    assert kb.plan_rounds(replay_s, budget_s, 8, 50) == rounds


# ---- test cases ---------------------------------------------------------------------------------


def test_large_m_worse_retiles_exactly_the_keys_from_64(cli: ModuleType) -> None:
    base = grid_config()
    case = json.loads(cli.make_cases(base)["large-M-worse"])
    assert list(case) == list(base) and case["triton_version"] == "3.6.0"
    for m in GRID:
        assert case[str(m)] == (cli.POOR if m >= 64 else base[str(m)]), m


def test_one_middle_key_worse(cli: ModuleType) -> None:
    base = grid_config()
    case = json.loads(cli.make_cases(base)["one-middle-key-worse"])
    assert [k for k in base if case[k] != base[k]] == ["48"] and case["48"] == cli.POOR
    assert cli.middle_key({"1": tile(16), "40": tile(32), "60": tile(32), "128": tile(64)}) == "40"
    assert cli.middle_key({"1": tile(16), "8": tile(16), "256": tile(64)}) == "8"


def test_reordered_keeps_content_and_every_keys_tiling(cli: ModuleType) -> None:
    base = grid_config()
    text = cli.make_cases(base)["reordered"]
    case = json.loads(text)
    assert case == base and list(case) == list(reversed(base))
    assert text != json.dumps(base, indent=4) + "\n" and " : " in text
    assert all(tiling(case, m) == tiling(base, m) for m in m_values(base, case))
    # Between keys the reversed file breaks ties the other way: a workload M there is a real
    # change, and the per-M table says why.
    assert tiling(case, 3) == base["4"] and tiling(base, 3) == base["2"]
    assert "file order picks key 2 in base and 4 in head" in tie_note(base, case, 3)


def test_make_cases_cli_writes_three_files(cli: ModuleType, tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps(grid_config(), indent=4))
    assert cli.main(["--make-cases", str(tmp_path / "cases"), "--base", str(base)]) == 0
    assert sorted(p.name for p in (tmp_path / "cases").iterdir()) == [
        f"{c}.json" for c in sorted(cli.CASES)
    ]


# ---- CLI skip path -------------------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path: Path, cli: ModuleType) -> Iterator[list[str]]:
    base = tmp_path / "base.json"
    base.write_text(json.dumps(grid_config(), indent=4))
    head = tmp_path / "head.json"
    head.write_text(cli.make_cases(grid_config())["large-M-worse"])
    yield ["--base", str(base), "--head", str(head), "--out", str(tmp_path / "out")]


@pytest.mark.parametrize(("allow", "rc"), [(True, 0), (False, 2)])
def test_cli_skips_without_a_gpu(
    cli: ModuleType, pair: list[str], allow: bool, rc: int, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:  # fmt: skip
    monkeypatch.setattr(cli, "skip_reason", lambda: "no CUDA device: test")
    assert cli.main(pair + (["--allow-skip"] if allow else [])) == rc
    assert capsys.readouterr().out == "skipped: no CUDA device: test\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the A/B would run")
def test_cli_skip_as_a_process(pair: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *pair, "--allow-skip"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("skipped: no CUDA device")


def test_cli_usage_errors_exit_2(cli: ModuleType, tmp_path: Path, capsys: Any) -> None:
    assert cli.main(["--base", str(tmp_path / "missing.json"), "--head", "x", "--out", "o"]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert cli.main(["--pairs", "nocolon", "--out", str(tmp_path)]) == 2


# ---- the report from recorded samples ----------------------------------------------------------


def synthetic(
    base: dict[str, Any], head: dict[str, Any], slower: dict[int, float]
) -> kb.BenchResult:
    """Samples as the GPU would give them: head's mean scaled by ``slower[m]`` where re-tiled."""
    rng, rows = random.Random(3), []
    for m in m_values(base, head):
        same = tiling(base, m) == tiling(head, m)
        mean = 20.0 + m / 10
        b = tuple(rng.gauss(mean, mean * 0.005) for _ in range(40))
        f = 1.0 if same else slower.get(m, 1.0)
        h = tuple(rng.gauss(mean * f, mean * 0.005) for _ in range(40))
        rows.append(kb.MResult(m, b, h, same, 2e-3, 2.1e-3))
    shape = kb.MoeShape(128, 768, 2048, 8, "bf16")
    versions = {"torch": "2.11.0", "vllm": "0.24.0", "triton": "3.6.0"}
    return kb.BenchResult(shape, tuple(rows), "NVIDIA H200", versions, 55.0, 30.0)


def test_report_large_m_worse_keeps_base(cli: ModuleType, tmp_path: Path) -> None:
    base = grid_config()
    head = json.loads(cli.make_cases(base)["large-M-worse"])
    res = synthetic(base, head, dict.fromkeys((64, 96, 128, 256, 512, 1024), 1.4) | {4096: 3.0})
    paths = cli.write_report(tmp_path, "large-M-worse-bf16", base, head, res)
    assert [p.name for p in paths] == [
        "large-M-worse-bf16.json", "large-M-worse-bf16.md", "large-M-worse-bf16-best-of-both.json"
    ]  # fmt: skip
    md = paths[1].read_text()
    assert "| M | base key | head key |" in md and "NVIDIA H200; vLLM 0.24.0" in md
    assert "- regressed keys (head slower): 64 (M=64); 96 (M=96)" in md
    assert "- best of both: base unchanged" in md and "numerics ok" in md
    assert "- predicted change of fused-MoE time vs base: +0.00 %" in md
    assert json.loads(paths[2].read_text()) == base
    doc = json.loads(paths[0].read_text())
    assert doc["comparisons"]["4096"]["verdict"] == "slower"
    assert doc["comparisons"]["1"]["same_tiling"] is True
    assert kb.BenchResult.from_dict(doc["result"]) == res
    assert list(doc["head_config"]) == list(head)


def test_report_takes_heads_faster_key_and_flags_numerics(cli: ModuleType, tmp_path: Path) -> None:
    base = grid_config()
    head = json.loads(cli.make_cases(base)["one-middle-key-worse"])
    res = synthetic(base, head, {48: 0.8, 56: 0.8})
    bad = res.per_m[0]
    rows = (kb.MResult(bad.m, bad.base_us, bad.head_us, bad.same_tiling, 2e-3, 0.5),
            *res.per_m[1:])  # fmt: skip
    res = kb.BenchResult(res.shape, rows, res.device, res.versions, res.wall_s, res.timing_s)
    md, doc, merged = cli.summarize(base, head, res)
    assert merged.config["48"] == cli.POOR and merged.chosen[48] == "head"
    assert "- faster keys (head): 48 (M=48)" in md
    assert "numerics FAIL: head tiling at M=1: relative error 0.5" in md
    assert doc["numerics"]["passed"] is False
    assert doc["best_of_both"]["predicted_gain"] < 0


def test_from_result_rebuilds_the_same_report(cli: ModuleType, tmp_path: Path) -> None:
    base = grid_config()
    head = json.loads(cli.make_cases(base)["reordered"])
    res = synthetic(base, head, {})
    paths = cli.write_report(tmp_path / "a", "reordered-bf16", base, head, res)
    assert "- no change: head serves every timed M with base's tiling" in paths[1].read_text()
    assert cli.main(["--from-result", str(paths[0]), "--out", str(tmp_path / "b")]) == 0
    again = tmp_path / "b" / "reordered-bf16.md"
    assert again.read_text() == paths[1].read_text()


# ---- on a GPU ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "fp8_w8a8"])
def test_gpu_times_and_checks_each_tiling(dtype: str) -> None:
    reason = kb.skip_reason()
    if reason:
        pytest.skip(reason)
    base = {"1": tile(16, 32, 64), "16": tile(16, 64, 128), "64": tile(32, 64, 64)}
    head = {"1": tile(16, 32, 64), "16": tile(16, 64, 128), "64": tile(64, 128, 64, w=8)}
    shape = kb.MoeShape(8, 128, 256, 2, dtype)
    res = kb.run_ab(base, head, shape, workload_ms=[50], budget_s=2, min_rounds=4, max_rounds=8)
    assert [r.m for r in res.per_m] == [1, 16, 50, 64]
    assert [r.same_tiling for r in res.per_m] == [True, True, False, False]
    tol = numerics_tolerance(dtype, shape.k)
    for r in res.per_m:
        assert 8 <= len(r.base_us) == len(r.head_us) <= 16
        assert all(0 < t < 10_000 for t in r.base_us + r.head_us)
        assert 0 < r.base_error <= tol and 0 < r.head_error <= tol, r
    assert res.versions["vllm"] and "triton" in res.versions and res.timing_s < res.wall_s


RECORDED = ROOT / "docs" / "results" / "h100-kernels-2026-12-05"


def test_recorded_h100_reordered_run_names_the_tie_ms_and_why_base_stays(
    cli: ModuleType, tmp_path: Path
) -> None:
    """The reordered head on the H100: no key re-tiled, yet the ties at M=3 and 12 flip (file
    order) and came out faster and slower. Base stays in the merge, and the summary says that
    head's gain at M=3 cannot be realised, instead of "head is faster at no timed M"."""
    code = cli.main(
        ["--from-result", str(RECORDED / "reordered-bf16.json"), "--out", str(tmp_path)]
    )
    assert code == 0
    md = (tmp_path / "reordered-bf16.md").read_text()
    assert "- regressed keys (head slower): 16 (M=12)" in md
    assert "- faster keys (head): 4 (M=3)" in md
    assert "base unchanged (head is faster only at M=3, which no merged key" in md
    assert "faster at no timed M" not in md
    assert "not realisable: M=3" in md


def test_recorded_h100_large_m_worse_names_every_key_from_64(
    cli: ModuleType, tmp_path: Path
) -> None:
    assert cli.main(["--from-result", str(RECORDED / "large-M-worse-bf16.json"),
                     "--out", str(tmp_path)]) == 0  # fmt: skip
    md = (tmp_path / "large-M-worse-bf16.md").read_text()
    regressed = md.split("- regressed keys (head slower): ")[1].split("\n")[0]
    keys = [int(part.split(" ")[0]) for part in regressed.split("; ")]
    assert keys == [64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
    assert "- keys that changed nothing: 1, 2, 4, 8, 16, 24, 32, 48" in md
    assert "numerics ok" in md
