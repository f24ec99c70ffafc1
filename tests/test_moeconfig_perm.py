"""Per-M kernel A/B on the CPU: vLLM's key rule, per-M verdicts, best of both, table, numerics."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.ab.perm_report import (
    HEADERS,
    check_numerics,
    numerics_tolerance,
    perm_rows,
    perm_table,
)
from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.perm import (
    MIN_EFFECT,
    MCompare,
    compare_all,
    compare_m,
    m_values,
    serving_key,
)
from pytest_moeperf.moeconfig.perm_merge import best_of_both, predicted_gain

# The key grid of vLLM's E=128,N=768,device_name=NVIDIA_H200.json (and most tuned files).
GRID = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


def tile(
    bm: int, bn: int = 64, bk: int = 128, g: int = 1, w: int = 4, s: int = 3
) -> dict[str, int]:
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": g,
        "num_warps": w,
        "num_stages": s,
    }


def grid_config() -> dict[str, Any]:
    """Base: a different tiling per key, as tuned files have."""
    out: dict[str, Any] = {}
    for i, m in enumerate(GRID):
        bm = 16 if m <= 16 else 32 if m <= 64 else 64 if m <= 512 else 128
        out[str(m)] = tile(bm, bn=64 if i % 2 else 128, s=2 + i % 4)
    return out


def retiled(config: Mapping[str, Any], keys: Sequence[int] | None = None) -> dict[str, Any]:
    """Head: the same keys with another num_warps at ``keys`` (all keys when None)."""
    out = {k: dict(v) for k, v in config.items()}
    for k in out:
        if keys is None or int(k) in keys:
            out[k]["num_warps"] = 8 if out[k]["num_warps"] == 4 else 4
    return out


def vllm_pick(config: Mapping[str, Any], m: int) -> int:
    """vLLM's lines, verbatim: get_moe_configs' int(key) dict, try_get_optimal_moe_config's min."""
    tuned_config = dict(config)
    tuned_config.pop("triton_version", None)
    configs = {int(key): val for key, val in tuned_config.items()}
    return min(configs.keys(), key=lambda x: abs(x - m))


def draws(mean: float, seed: int, n: int = 60, cv: float = 0.004) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(mean, mean * cv) for _ in range(n)]


def base_time(m: int) -> float:
    return 8.0 + 0.02 * m  # µs: flat at small M, bandwidth then compute bound


def timings(ms: Sequence[int], head_factor: Callable[[int], float]) -> dict[int, Any]:
    return {
        m: (draws(base_time(m), 2 * m), draws(base_time(m) * head_factor(m), 2 * m + 1)) for m in ms
    }


# ---- vLLM's selection rule -------------------------------------------------------------------


def test_installed_vllm_still_uses_the_nearest_key_first_on_tie_rule() -> None:
    """Read (not import) vLLM's source: if the expression changes, serving_key must too."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm not installed")
    src = Path(spec.origin).parent / "model_executor/layers/fused_moe/fused_moe.py"
    text = src.read_text()
    assert "configs[min(configs.keys(), key=lambda x: abs(x - M))]" in text
    assert "{int(key): val for key, val in tuned_config.items()}" in text


@pytest.mark.parametrize("m", [1, 3, 5, 7, 12, 20, 28, 40, 56, 80, 100, 112, 200, 700, 5000, 9999])
def test_serving_key_matches_vllm_on_the_usual_grid(m: int) -> None:
    config = grid_config()
    assert int(serving_key(config, m)) == vllm_pick(config, m)


def test_serving_key_nearest_examples_on_the_grid() -> None:
    config = {"triton_version": "3.4.0", **grid_config()}
    assert serving_key(config, 1) == "1"
    assert serving_key(config, 100) == "96"
    assert serving_key(config, 200) == "256"  # 56 away from 256, 72 from 128
    assert serving_key(config, 100_000) == "4096"  # no distance limit


def test_tie_goes_to_the_first_key_in_file_order() -> None:
    a, b = tile(16), tile(32)
    assert serving_key({"2": a, "4": b}, 3) == "2"
    assert serving_key({"4": b, "2": a}, 3) == "4"  # file order, not the smaller key
    assert vllm_pick({"4": b, "2": a}, 3) == 4
    assert serving_key(grid_config(), 20) == "16"  # 16 and 24 are both 4 away


def test_reordered_keys_change_which_tiling_serves_a_tie_m() -> None:
    base = grid_config()
    head = dict(reversed(list(base.items())))  # same keys, same tilings, reversed order
    assert head == base  # equal as dicts ...
    ms = m_values(base, head, workload_ms=[20, 100])
    cmp = compare_all(base, head, timings(ms, lambda m: 1.0))
    assert all(cmp[m].same_tiling for m in GRID)
    assert cmp[100].same_tiling  # not a tie: 96 is nearest in both
    assert not cmp[20].same_tiling  # ... but M=20 runs key 16 in base and key 24 in head
    row = {r.m: r for r in perm_rows(base, head, cmp)}[20]
    assert (row.base_key, row.head_key) == ("16", "24")
    assert "file order picks key 16 in base and 24 in head" in row.tie
    text = perm_table(perm_rows(base, head, cmp))
    assert "key order decides: M=20" in text
    assert "no change" not in text


def test_serving_key_rejects_bad_input() -> None:
    with pytest.raises(UsageError, match="positive integer batch size"):
        serving_key({"1": tile(16)}, 0)
    with pytest.raises(UsageError, match="appears twice"):
        serving_key({"8": tile(16), "08": tile(32)}, 8)
    with pytest.raises(UsageError, match="no M entries"):
        serving_key({"triton_version": "3.4.0"}, 8)


def test_m_values_is_both_key_sets_and_the_workload_sorted_unique() -> None:
    base = {"triton_version": "3.4", "1": tile(16), "64": tile(32), "8": tile(16)}
    head = {"1": tile(16), "96": tile(64)}
    assert m_values(base, head) == [1, 8, 64, 96]
    assert m_values(base, head, workload_ms=[3, 64, 3, 5000]) == [1, 3, 8, 64, 96, 5000]
    with pytest.raises(UsageError, match="workload M"):
        m_values(base, head, workload_ms=[-1])


# ---- per-M comparison ------------------------------------------------------------------------


def test_compare_m_clearly_faster() -> None:
    c = compare_m(draws(100.0, 1), draws(90.0, 2))
    assert c.verdict == "faster"
    assert c.delta == pytest.approx(-0.10, abs=0.005)
    assert c.ci[0] < c.delta < c.ci[1] < 0
    assert c.p_value is not None and c.p_value < 1e-10
    assert c.base_median == pytest.approx(100.0, rel=0.01)


def test_compare_m_clearly_slower() -> None:
    c = compare_m(draws(100.0, 3), draws(110.0, 4))
    assert c.verdict == "slower"
    assert 0 < c.ci[0] < c.delta < c.ci[1]
    assert "slower by" in c.reason


def test_compare_m_tie_is_same_and_not_significant() -> None:
    c = compare_m(draws(100.0, 5), draws(100.0, 6))
    assert c.verdict == "same"
    assert not c.significant
    assert c.ci[0] < 0 < c.ci[1]
    assert "no significant difference" in c.reason


def test_compare_m_tiny_but_significant_is_below_the_minimum_effect() -> None:
    b, h = draws(100.0, 7, n=400, cv=0.001), draws(100.3, 8, n=400, cv=0.001)
    c = compare_m(b, h)
    assert c.significant and c.p_value is not None and c.p_value < 1e-6
    assert c.verdict == "same"
    assert abs(c.delta) < MIN_EFFECT
    assert "below the 1 % minimum effect" in c.reason
    assert compare_m(b, h, min_effect=0.001).verdict == "slower"  # the floor is what decides


def test_compare_m_identical_tiling_is_same_without_a_test() -> None:
    c = compare_m(draws(100.0, 9), draws(103.0, 10), same_tiling=True)  # 3 %: GPU drift
    assert (c.verdict, c.delta, c.p_value, c.same_tiling) == ("same", 0.0, None, True)
    assert c.reason.startswith("same tiling")
    assert c.base_mean == c.head_mean == pytest.approx(101.5, rel=0.01)


def test_compare_m_without_spread_and_bad_samples() -> None:
    assert compare_m([10.0, 10.0], [10.0, 10.0]).verdict == "same"
    assert compare_m([10.0, 10.0], [12.0, 12.0]).verdict == "slower"
    with pytest.raises(UsageError, match="at least 2 timings"):
        compare_m([10.0], [10.0, 11.0])
    with pytest.raises(UsageError, match="finite number of microseconds"):
        compare_m([10.0, math.nan], [10.0, 11.0])


# ---- best of both ----------------------------------------------------------------------------


def test_only_large_m_keys_worse_in_head() -> None:
    """Head re-tiles every key: 5 % faster below M=64, 5 % slower from 64 up."""
    base = grid_config()
    head = retiled(base)
    ms = m_values(base, head, workload_ms=[20, 80])  # ties, 16/24 and 64/96: the first key wins
    cmp = compare_all(base, head, timings(ms, lambda m: 0.95 if m < 64 else 1.05))
    assert {m for m, c in cmp.items() if c.verdict == "faster"} == {m for m in ms if m < 64}
    assert {m for m, c in cmp.items() if c.verdict == "slower"} == {m for m in ms if m >= 64}
    merged = best_of_both(base, head, cmp)
    assert merged.not_realisable == ()
    for k in GRID:
        assert merged.config[str(k)] == (head if k < 64 else base)[str(k)]
    assert list(merged.config) == list(base)
    assert not merged.same_as_base
    for m in ms:
        chosen = head if m < 64 else base
        assert merged.config[serving_key(merged.config, m)] == chosen[serving_key(chosen, m)]
    rows = perm_rows(base, head, cmp)
    text = perm_table(rows, merged=merged, gain=predicted_gain(merged, cmp))
    assert "- regressed keys (head slower): 64 (M=64, 80); 96 (M=96);" in text
    assert "head's tiling at M=1, 2, 4, 8, 16, 20, 24, 32, 48, base's elsewhere" in text
    assert "key order decides" not in text  # both sides break the ties 20 and 80 alike
    assert json.loads(merged.to_json()) == merged.config


def test_predicted_gain_with_and_without_weights() -> None:
    base = grid_config()
    head = retiled(base)
    ms = m_values(base, head)
    cmp = compare_all(base, head, timings(ms, lambda m: 0.95 if m < 64 else 1.05))
    merged = best_of_both(base, head, cmp)

    def side_mean(m: int) -> float:
        return cmp[m].head_mean if m < 64 else cmp[m].base_mean

    equal = sum(side_mean(m) for m in ms) / sum(cmp[m].base_mean for m in ms) - 1
    assert predicted_gain(merged, cmp) == pytest.approx(equal, rel=1e-12)
    assert -0.01 < equal < 0  # the small-M wins are small kernels next to M=4096
    decode = {1: 10.0, 8: 30.0, 32: 60.0, 4096: 0.0}
    want = sum(w * side_mean(m) for m, w in decode.items())
    want /= sum(w * cmp[m].base_mean for m, w in decode.items())
    assert predicted_gain(merged, cmp, decode) == pytest.approx(want - 1, rel=1e-12)
    assert predicted_gain(merged, cmp, decode) == pytest.approx(-0.05, abs=0.003)
    assert predicted_gain(merged, cmp, {4096: 1.0}) == 0.0  # base's tiling kept there
    with pytest.raises(UsageError, match="was not timed"):
        predicted_gain(merged, cmp, {3: 1.0})
    with pytest.raises(UsageError, match="all zero"):
        predicted_gain(merged, cmp, {1: 0.0})


def test_a_single_middle_key_worse_keeps_base() -> None:
    base = grid_config()
    head = retiled(base, keys=[64])
    ms = m_values(base, head, workload_ms=[72])  # served by key 64 on both sides
    cmp = compare_all(base, head, timings(ms, lambda m: 1.08 if m in (64, 72) else 1.0))
    assert [m for m, c in cmp.items() if not c.same_tiling] == [64, 72]
    assert cmp[64].verdict == cmp[72].verdict == "slower"
    merged = best_of_both(base, head, cmp)
    assert merged.config == base and merged.same_as_base
    assert predicted_gain(merged, cmp) == 0.0
    text = perm_table(perm_rows(base, head, cmp), merged=merged)
    assert "- regressed keys (head slower): 64 (M=64, 72)" in text
    assert "- faster keys (head): none" in text
    assert "keys that changed nothing: 1, 2, 4, 8, 16, 24, 32, 48, 96, 128," in text
    assert "best of both: base unchanged" in text


def test_key_order_and_formatting_only_is_no_change() -> None:
    base = grid_config()
    text = json.dumps(dict(reversed(list(base.items()))), indent=1, sort_keys=False)
    head = json.loads(text.replace("\n", "\n  "))
    ms = m_values(base, head)  # the keys only: no tie M is reached
    cmp = compare_all(base, head, timings(ms, lambda m: 1.004))  # drift, and the same kernel
    assert all(c.same_tiling and c.verdict == "same" for c in cmp.values())
    merged = best_of_both(base, head, cmp)
    assert merged.config == base and list(merged.config) == list(base)
    assert merged.to_json() == json.dumps(base, indent=4) + "\n"
    assert merged.same_as_base and merged.not_realisable == ()
    assert predicted_gain(merged, cmp) == 0.0
    table = perm_table(perm_rows(base, head, cmp), merged=merged)
    assert "- no change: head serves every timed M with base's tiling" in table
    assert "- regressed keys (head slower): none" in table


@pytest.mark.parametrize("factor", [0.9, 1.1, 0.995])
def test_a_new_head_key_stays_only_where_head_wins(factor: float) -> None:
    """Head adds key 48 (M=48 ran key 32's tiling in base). 0.5 % faster is below the minimum
    effect: base kept, and the copy of base's tiling at key 48 is dropped as noise."""
    base = {"32": tile(32), "64": tile(64)}
    head = {"32": tile(32), "48": tile(64, w=8), "64": tile(64)}
    ms = m_values(base, head)
    cmp = compare_all(base, head, timings(ms, lambda m: factor if m == 48 else 1.0))
    merged = best_of_both(base, head, cmp)
    assert merged.not_realisable == ()
    if factor == 0.9:
        assert merged.config == head and list(merged.config) == ["32", "48", "64"]
        assert merged.chosen[48] == "head"
    else:
        assert merged.config == base and merged.same_as_base
        assert merged.chosen[48] == "base"
    assert (predicted_gain(merged, cmp) < 0) == (factor == 0.9)


def test_an_m_between_keys_can_be_not_realisable() -> None:
    """M=40 runs key 32's tiling on both sides; head wins at 32 but loses at 40."""
    base = {"32": tile(32), "64": tile(64)}
    head = {"32": tile(32, w=8), "64": tile(64)}
    ms = m_values(base, head, workload_ms=[40])
    cmp = compare_all(base, head, timings(ms, lambda m: {32: 0.9, 40: 1.1}.get(m, 1.0)))
    merged = best_of_both(base, head, cmp)
    assert merged.chosen == {32: "head", 40: "base", 64: "base"}
    (nr,) = merged.not_realisable
    assert (nr.m, nr.wanted, nr.key, nr.served) == (40, "base", "32", "head")
    assert "M=40 wants base's tiling" in nr.why and "adding key 40" in nr.why
    gain = predicted_gain(merged, cmp)  # M=40 really runs head's tiling: counted as such
    want = (cmp[32].head_mean + cmp[40].head_mean + cmp[64].base_mean) / sum(
        cmp[m].base_mean for m in ms
    )
    assert gain == pytest.approx(want - 1, rel=1e-12)
    assert "- not realisable: M=40" in perm_table(perm_rows(base, head, cmp), merged=merged)


def test_not_realisable_with_neither_sides_tiling_blocks_the_prediction() -> None:
    """Head lists its new key 48 first, so its tie M=40 runs key 48; the merged file puts 48
    in ascending position, so M=40 goes to key 32, which holds head's M=32 tiling."""
    base = {"32": tile(32), "64": tile(64)}
    head = {"48": tile(64, w=8), "32": tile(32, w=8), "64": tile(64)}
    ms = m_values(base, head, workload_ms=[40])
    cmp = compare_all(base, head, timings(ms, lambda m: 0.9 if m in (32, 40) else 1.0))
    merged = best_of_both(base, head, cmp)
    bad = {nr.m: nr for nr in merged.not_realisable}
    assert bad[40].served is None and "neither side's tiling" in bad[40].why
    with pytest.raises(UsageError, match="neither side timed"):
        predicted_gain(merged, cmp)
    assert predicted_gain(merged, cmp, {32: 1.0, 40: 0.0}) == pytest.approx(
        cmp[32].head_mean / cmp[32].base_mean - 1
    )


def test_best_of_both_needs_every_key_timed() -> None:
    base, head = {"32": tile(32), "64": tile(64)}, {"32": tile(32, w=8), "64": tile(64)}
    cmp = compare_all(base, head, timings([32], lambda m: 0.9))
    with pytest.raises(UsageError, match="untimed keys = \\[64\\]"):
        best_of_both(base, head, cmp)


# ---- table -----------------------------------------------------------------------------------


def test_table_columns_and_cells() -> None:
    base = {"32": tile(32), "64": tile(64)}
    head = {"32": tile(32, w=8), "64": tile(64)}
    cmp: dict[int, MCompare] = {
        32: compare_m([10.0, 10.1, 9.9], [9.0, 9.1, 8.9]),
        64: compare_m([20.0, 20.2], [20.1, 20.3], same_tiling=True),
    }
    lines = perm_table(perm_rows(base, head, cmp)).splitlines()
    assert lines[0] == "| " + " | ".join(HEADERS) + " |"
    assert lines[0] == "| M | base key | head key | base µs | head µs | Δ (CI) | p | verdict |"
    assert lines[1] == "|---|---|---|---|---|---|---|---|"
    row32 = [c.strip() for c in lines[2].strip("|").split("|")]
    assert row32[:5] == ["32", "32", "32", "10.00", "9.000"]
    assert row32[5].startswith("-10.00 % (-1") and row32[7] == "▲ faster"
    row64 = [c.strip() for c in lines[3].strip("|").split("|")]
    assert row64[5:] == ["same tiling", "n/a", "✓ same (same tiling)"]
    assert "- faster keys (head): 32 (M=32)" in lines
    assert "- keys that changed nothing: 64" in lines


# ---- numerics --------------------------------------------------------------------------------


def test_numerics_tolerance_values() -> None:
    assert numerics_tolerance("bf16", 4096) == 4 * 2**-8 + 2 * 64 * 2**-24
    assert numerics_tolerance("bfloat16", 4096) == numerics_tolerance("bf16", 4096)
    assert numerics_tolerance("bf16", 16384) > numerics_tolerance("bf16", 4096)  # sqrt(k)
    assert 0.015 < numerics_tolerance("bf16", 7168) < 0.0160
    assert numerics_tolerance("fp8_w8a8", 7168) == pytest.approx(
        4 * 2**-4 + 2 * math.sqrt(7168) * 2**-14
    )
    with pytest.raises(UsageError, match="no error bound"):
        numerics_tolerance("int4_w4a16", 4096)
    with pytest.raises(UsageError, match="positive integer"):
        numerics_tolerance("bf16", 0)


def test_check_numerics_pass_and_fail() -> None:
    ok = check_numerics({1: 0.004, 64: 0.005}, {1: 0.004, 64: 0.006}, "bf16", 4096)
    assert ok.passed and ok.failures == () and ok.message.startswith("numerics ok")
    bad = check_numerics({1: 0.004, 64: 0.005}, {1: 0.004, 64: 0.05, 128: math.nan}, "bf16", 4096)
    assert not bad.passed
    assert [(f.m, f.side) for f in bad.failures] == [(64, "head"), (128, "head")]
    assert "head tiling at M=64: relative error 0.05 > tolerance 0.0156" in bad.message
    fp8 = check_numerics({64: 0.05}, {64: 0.05}, "fp8_w8a8", 4096)  # e4m3 rounding is coarse
    assert fp8.passed
    old = check_numerics({64: 0.2}, {64: 0.005}, "bf16", 4096)
    assert old.passed and "base already fails" in old.message  # not this change's bug
    with pytest.raises(UsageError, match="must be a number >= 0"):
        check_numerics({}, {1: -1.0}, "bf16", 4096)
