"""build_requests(): exact lengths, seeded reproducibility, chat-mix quantiles, replay files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.requests import build_requests
from pytest_moeperf.spec.model import WorkloadSpec
from pytest_moeperf.spec.traces import (
    Z_090,
    fit_to_context,
    lognormal_params,
    read_replay,
    scaled_length,
)

VOCAB = 32_000


def fixed(**kw: object) -> WorkloadSpec:
    base: dict[str, object] = {"trace": "fixed", "num_requests": 20, "seed": 7,
                               "input_tokens": 128, "output_tokens": 32}  # fmt: skip
    base.update(kw)
    return WorkloadSpec(**base)  # type: ignore[arg-type]


def chat(n: int = 4000, **kw: object) -> WorkloadSpec:
    return WorkloadSpec(trace="chat-mix-v1", num_requests=n, seed=1, **kw)  # type: ignore[arg-type]


def build(w: WorkloadSpec, **kw: object) -> list:  # type: ignore[type-arg]
    args: dict[str, object] = {"vocab_size": VOCAB, "max_model_len": 8192, "rate": 5.0,
                               "burstiness": 1.0}  # fmt: skip
    args.update(kw)
    return build_requests(w, **args)  # type: ignore[arg-type]


def test_fixed_lengths_are_exact() -> None:
    reqs = build(fixed())
    assert len(reqs) == 20
    assert all(r.input_tokens == 128 and r.max_tokens == 32 for r in reqs)
    assert [r.index for r in reqs] == list(range(20))


def test_same_seed_same_requests_and_offset_changes_them() -> None:
    a, b = build(fixed()), build(fixed())
    assert a == b
    c = build(fixed(), seed_offset=1)
    assert c != a and [r.prompt_token_ids for r in c] != [r.prompt_token_ids for r in a]
    assert build(fixed(seed=8)) != a


def test_a_shared_schedule_keeps_arrivals_and_lengths_and_changes_only_prompts() -> None:
    # the SLO search's common random numbers: every probe replays one schedule, faster or
    # slower, with fresh prompts (no prompt served twice, so no prefix-cache hit)
    a = build(chat(n=200), rate=4.0, seed_offset=3, schedule_offset=0)
    b = build(chat(n=300), rate=8.0, seed_offset=4, schedule_offset=0)
    assert [r.max_tokens for r in a] == [r.max_tokens for r in b[:200]]
    assert [r.input_tokens for r in a] == [r.input_tokens for r in b[:200]]
    # the same gaps, played twice as fast (each schedule is rescaled to end at n / rate)
    gaps_a = np.diff([r.arrival_s for r in a])
    gaps_b = np.diff([r.arrival_s for r in b[:200]])
    ratio = gaps_a / gaps_b
    assert np.allclose(ratio, ratio[0]) and 1.5 < ratio[0] < 2.7
    assert not {r.prompt_token_ids for r in a} & {r.prompt_token_ids for r in b}
    # without a shared schedule, two offsets draw two different schedules
    c = build(chat(n=200), rate=4.0, seed_offset=4)
    assert [r.max_tokens for r in c] != [r.max_tokens for r in a]


def test_arrivals_are_sorted_and_match_the_rate() -> None:
    reqs = build(fixed(num_requests=2000), rate=20.0)
    arr = [r.arrival_s for r in reqs]
    assert arr == sorted(arr)
    assert arr[-1] == pytest.approx(2000 / 20.0, rel=1e-6)  # arrivals.py rescales to n / rate


def test_infinite_rate_sends_everything_at_once() -> None:
    assert {r.arrival_s for r in build(fixed(), rate=math.inf)} == {0.0}


def test_token_ids_avoid_low_and_reserved_ids() -> None:
    reqs = build(fixed(num_requests=50), vocab_size=1000, low_token_id=10,
                 reserved_ids=[(100, 900)])  # fmt: skip
    ids = np.concatenate([r.prompt_token_ids for r in reqs])
    assert ids.min() >= 10 and ids.max() < 1000
    assert not ((ids >= 100) & (ids < 900)).any()
    assert ((ids >= 900).any()) and ((ids < 100).any())  # both remaining ranges used


def test_chat_mix_quantiles_match_the_fit() -> None:
    reqs = build(chat(), max_model_len=10**7)
    inp = np.array([r.input_tokens for r in reqs])
    out = np.array([r.max_tokens for r in reqs])
    assert np.median(inp) == pytest.approx(1024, rel=0.08)
    assert np.percentile(inp, 90) == pytest.approx(4096, rel=0.12)
    assert np.median(out) == pytest.approx(256, rel=0.08)
    assert np.percentile(out, 90) == pytest.approx(1024, rel=0.12)


def test_lognormal_params_from_median_and_p90() -> None:
    mu, sigma = lognormal_params(1024, 4096)
    assert math.exp(mu) == pytest.approx(1024)
    assert math.exp(mu + sigma * Z_090) == pytest.approx(4096)


def test_chat_mix_is_clipped_to_the_context() -> None:
    reqs = build(chat(2000), max_model_len=2048)
    assert all(r.input_tokens + r.max_tokens <= 2048 for r in reqs)
    assert all(r.input_tokens >= 1 and r.max_tokens >= 1 for r in reqs)


def test_scale_and_clips_shrink_lengths() -> None:
    reqs = build(chat(500, scale=0.125, max_input_tokens=300, max_output_tokens=64))
    inp = np.array([r.input_tokens for r in reqs])
    assert inp.max() <= 300 and max(r.max_tokens for r in reqs) <= 64
    assert np.median(inp) == pytest.approx(128, rel=0.15)


def test_fit_to_context_shrinks_the_longer_side() -> None:
    assert fit_to_context(10, 100, 200) == (10, 100)
    assert fit_to_context(10, 8192, 8192) == (10, 8182)
    assert fit_to_context(8192, 256, 8192) == (7936, 256)
    assert fit_to_context(9000, 9000, 8192) == (4096, 4096)


def test_scaled_length_never_below_one() -> None:
    assert scaled_length(3, 0.01, None) == 1
    assert scaled_length(1000, 0.5, 100) == 100


def write_trace(tmp_path: Path, rows: list[object]) -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


def replay(path: Path, n: int | None = None) -> WorkloadSpec:
    return WorkloadSpec(trace="replay", num_requests=n, path=path.name, resolved_path=path)


def test_replay_keeps_its_arrivals_and_lengths(tmp_path: Path) -> None:
    p = write_trace(tmp_path, [
        {"timestamp": 1000.0, "input_tokens": 5, "output_tokens": 3},
        {"timestamp": 1000.5, "input_tokens": 7, "output_tokens": 2, "extra": "ignored"},
        "",
        {"timestamp": 1002.0, "input_tokens": 9, "output_tokens": 1},
    ])  # fmt: skip
    reqs = build(replay(p), rate=123.0)
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 2.0]
    assert [(r.input_tokens, r.max_tokens) for r in reqs] == [(5, 3), (7, 2), (9, 1)]
    assert len(build(replay(p, 2))) == 2


def test_replay_asking_for_more_than_the_trace_is_an_error(tmp_path: Path) -> None:
    p = write_trace(tmp_path, [{"arrival_s": 0, "input_tokens": 1, "output_tokens": 1}])
    with pytest.raises(UsageError) as info:
        build(replay(p, 5))
    assert "only 1" in info.value.problem


@pytest.mark.parametrize(
    ("line", "field_name"),
    [
        ("{not json", "line"),
        ("[1, 2]", "line"),
        ('{"input_tokens": 1, "output_tokens": 1}', "timestamp"),
        ('{"arrival_s": "soon", "input_tokens": 1, "output_tokens": 1}', "arrival_s"),
        ('{"arrival_s": 1, "output_tokens": 1}', "input_tokens"),
        ('{"arrival_s": 1, "input_tokens": 0, "output_tokens": 1}', "input_tokens"),
        ('{"arrival_s": 1, "input_tokens": 2, "output_tokens": 1.5}', "output_tokens"),
        ('{"arrival_s": 1, "input_tokens": true, "output_tokens": 1}', "input_tokens"),
        ('{"arrival_s": 0.5, "input_tokens": 2, "output_tokens": 1}', "arrival_s"),
    ],
)
def test_bad_replay_line_names_file_and_line(tmp_path: Path, line: str, field_name: str) -> None:
    good = json.dumps({"arrival_s": 1.0, "input_tokens": 3, "output_tokens": 2})
    p = write_trace(tmp_path, [good, line])
    with pytest.raises(UsageError) as info:
        read_replay(p)
    assert info.value.source == f"{p}:2"
    assert info.value.what == field_name


def test_empty_replay_is_an_error(tmp_path: Path) -> None:
    p = write_trace(tmp_path, [""])
    with pytest.raises(UsageError, match="no requests"):
        read_replay(p)


def test_vocab_at_or_below_low_id_is_an_error() -> None:
    with pytest.raises(UsageError) as info:
        build(fixed(), vocab_size=50)
    assert info.value.what == "vocab_size"


def test_reserved_covering_everything_is_an_error() -> None:
    with pytest.raises(UsageError) as info:
        build(fixed(), vocab_size=1000, reserved_ids=[(0, 1000)])
    assert info.value.what == "reserved_ids"


def test_non_positive_rate_is_an_error() -> None:
    with pytest.raises(UsageError) as info:
        build(fixed(), rate=0.0)
    assert info.value.what == "rate"


def test_zero_n_is_an_error() -> None:
    with pytest.raises(UsageError) as info:
        build(fixed(), n=0)
    assert info.value.what == "n"


def test_tiny_context_is_an_error() -> None:
    with pytest.raises(UsageError) as info:
        build(fixed(), max_model_len=1)
    assert info.value.what == "max_model_len"


def test_n_overrides_the_spec_count() -> None:
    assert len(build(fixed(), n=5)) == 5
