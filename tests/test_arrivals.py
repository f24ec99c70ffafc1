"""Arrival schedules: seeded, vLLM's gamma process, rescaled to n/rate, validated inputs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.arrivals import arrival_offsets


def test_same_seed_same_schedule() -> None:
    assert arrival_offsets(50, 4.0, 1.0, seed=7) == arrival_offsets(50, 4.0, 1.0, seed=7)


def test_different_seed_different_schedule() -> None:
    assert arrival_offsets(50, 4.0, 1.0, seed=7) != arrival_offsets(50, 4.0, 1.0, seed=8)


def test_offsets_are_non_decreasing_and_positive() -> None:
    offs = arrival_offsets(500, 10.0, 0.5, seed=1)
    assert len(offs) == 500
    assert offs[0] > 0
    assert all(b >= a for a, b in itertools.pairwise(offs))


def test_last_arrival_lands_at_n_over_rate() -> None:
    # vLLM rescales the cumulated gaps so the realised rate is exactly the asked one.
    offs = arrival_offsets(200, 8.0, 1.0, seed=3)
    assert offs[-1] == pytest.approx(200 / 8.0, rel=1e-12)


def test_one_request_waits_one_mean_gap() -> None:
    assert arrival_offsets(1, 2.0, 1.0, seed=0) == [pytest.approx(0.5)]


def test_poisson_gaps_are_exponential() -> None:
    gaps = np.diff([0.0, *arrival_offsets(20_000, 5.0, 1.0, seed=11)])
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1.0, abs=0.05)  # exponential: std == mean
    assert gaps.mean() == pytest.approx(0.2, rel=1e-9)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_sets_gap_variability(burstiness: float) -> None:
    # Gamma with shape k has coefficient of variation 1/sqrt(k).
    gaps = np.diff([0.0, *arrival_offsets(20_000, 5.0, burstiness, seed=5)])
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_infinite_rate_sends_everything_at_zero() -> None:
    assert arrival_offsets(5, math.inf, 1.0, seed=0) == [0.0] * 5


def test_zero_requests() -> None:
    assert arrival_offsets(0, 1.0, 1.0, seed=0) == []


def _raises(field: str, **kwargs: object) -> UsageError:
    args: dict[str, object] = {"n": 10, "rate": 1.0, "burstiness": 1.0, "seed": 0}
    args.update(kwargs)
    with pytest.raises(UsageError) as info:
        arrival_offsets(**args)  # type: ignore[arg-type]
    err = info.value
    assert err.what == field
    assert err.source == "arrival_offsets()"
    assert repr(kwargs[field]) in str(err)
    assert "Fix:" in str(err)
    return err


def test_negative_n_is_rejected() -> None:
    _raises("n", n=-1)


def test_float_n_is_rejected() -> None:
    _raises("n", n=2.5)


def test_zero_rate_is_rejected() -> None:
    assert "inf" in _raises("rate", rate=0.0).fix


def test_negative_rate_is_rejected() -> None:
    _raises("rate", rate=-3.0)


def test_nan_rate_is_rejected() -> None:
    _raises("rate", rate=float("nan"))


def test_string_rate_is_rejected() -> None:
    _raises("rate", rate="4")


def test_zero_burstiness_is_rejected() -> None:
    _raises("burstiness", burstiness=0.0)


def test_infinite_burstiness_is_rejected() -> None:
    _raises("burstiness", burstiness=math.inf)


def test_negative_seed_is_rejected() -> None:
    _raises("seed", seed=-1)


def test_bool_seed_is_rejected() -> None:
    _raises("seed", seed=True)
