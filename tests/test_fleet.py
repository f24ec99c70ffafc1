"""Fleet sizing: cards for equal goodput and relative energy per token."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.metrics.fleet import (
    FleetRow,
    cards_for_equal_goodput,
    energy_per_token_relative,
    fleet_row,
)


def test_equal_goodput_needs_the_same_cards() -> None:
    assert cards_for_equal_goodput(12.0, 12.0) == 64


def test_exact_multiples_do_not_round_up() -> None:
    assert cards_for_equal_goodput(10.0, 20.0) == 32
    assert cards_for_equal_goodput(10.0, 5.0) == 128
    assert cards_for_equal_goodput(10.0, 12.5) == 52  # 64 * 0.8 = 51.2 -> 52 by ceil
    assert cards_for_equal_goodput(10.0, 16.0) == 40


def test_float_noise_does_not_add_a_card() -> None:
    # 64 * 0.3 / 0.1 is 191.99999999999997 in binary floating point
    assert cards_for_equal_goodput(0.3, 0.1) == 192
    assert cards_for_equal_goodput(0.7, 0.1, n_reference=10) == 70


def test_a_fraction_of_a_card_rounds_up() -> None:
    # 64 * 10 / 10.7 = 59.81 -> 60 cards
    assert cards_for_equal_goodput(10.0, 10.7) == 60
    # slightly worse than the reference: 64 * 10 / 9.99 = 64.06 -> 65
    assert cards_for_equal_goodput(10.0, 9.99) == 65


def test_n_reference_is_configurable() -> None:
    assert cards_for_equal_goodput(10.0, 10.7, n_reference=8) == 8  # 7.48 -> 8
    assert cards_for_equal_goodput(10.0, 10.7, n_reference=1000) == 935  # 934.6 -> 935
    assert cards_for_equal_goodput(3.0, 2.0, n_reference=1) == 2


def test_cards_count_gpus_in_whole_servers() -> None:
    # 8 servers of 8 GPUs; a config 10 % better needs 64/8/1.1 = 7.27 -> 8 servers = 64 cards
    assert cards_for_equal_goodput(10.0, 11.0, gpus_per_server=8) == 64
    # 25 % better: 8 / 1.25 = 6.4 -> 7 servers = 56 cards (not ceil(51.2) = 52)
    assert cards_for_equal_goodput(10.0, 12.5, gpus_per_server=8) == 56
    # twice as good: exactly 4 servers
    assert cards_for_equal_goodput(10.0, 20.0, gpus_per_server=8) == 32
    assert cards_for_equal_goodput(10.0, 12.5, n_reference=64, gpus_per_server=2) == 52


def test_zero_config_goodput_has_no_answer() -> None:
    assert cards_for_equal_goodput(10.0, 0.0) is None


def test_zero_reference_goodput_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="reference_goodput"):
        cards_for_equal_goodput(0.0, 5.0)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "10", True])
def test_bad_reference_goodput_is_a_usage_error(bad: Any) -> None:
    with pytest.raises(UsageError, match="reference_goodput"):
        cards_for_equal_goodput(bad, 5.0)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), None])
def test_bad_config_goodput_is_a_usage_error(bad: Any) -> None:
    with pytest.raises(UsageError, match="config_goodput"):
        cards_for_equal_goodput(5.0, bad)


@pytest.mark.parametrize("bad", [0, -64, 6.4, True])
def test_bad_n_reference_is_a_usage_error(bad: Any) -> None:
    with pytest.raises(UsageError, match="n_reference"):
        cards_for_equal_goodput(5.0, 5.0, n_reference=bad)


def test_bad_gpus_per_server_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="gpus_per_server"):
        cards_for_equal_goodput(5.0, 5.0, gpus_per_server=0)


def test_reference_not_whole_servers_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="multiple of 3"):
        cards_for_equal_goodput(5.0, 5.0, n_reference=64, gpus_per_server=3)


def test_energy_per_token_relative() -> None:
    # ref 2 tok/J = 0.5 J/tok; cfg 2.5 tok/J = 0.4 J/tok -> 20 % less energy per token
    assert energy_per_token_relative(2.0, 2.5) == pytest.approx(-0.2)
    assert energy_per_token_relative(2.0, 1.0) == pytest.approx(1.0)
    assert energy_per_token_relative(3.0, 3.0) == 0.0


def test_energy_not_measured_is_none_not_zero() -> None:
    assert energy_per_token_relative(None, 2.0) is None
    assert energy_per_token_relative(2.0, None) is None
    assert energy_per_token_relative(None, None) is None


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_tokens_per_joule_is_a_usage_error(bad: float) -> None:
    with pytest.raises(UsageError, match="cfg_tokens_per_joule"):
        energy_per_token_relative(2.0, bad)
    with pytest.raises(UsageError, match="ref_tokens_per_joule"):
        energy_per_token_relative(bad, 2.0)


def test_fleet_row_combines_the_pieces() -> None:
    row = fleet_row(
        "E=128,N=768,fp8.json",
        reference_goodput=10.0,
        config_goodput=12.5,
        ref_tokens_per_joule=2.0,
        cfg_tokens_per_joule=2.5,
        energy_method="nvml_total_energy_counter",
        mbu=0.61,
    )
    assert row.cards == 52 and row.cards_delta == -12
    assert row.goodput_relative == pytest.approx(0.25)
    assert row.energy_per_token_relative == pytest.approx(-0.2)
    d = json.loads(json.dumps(row.to_dict()))
    assert d["cards"] == 52 and d["cards_delta"] == -12 and d["mbu"] == 0.61
    assert (
        FleetRow(**{k: v for k, v in d.items() if k not in ("cards_delta", "goodput_relative")})
        == row
    )


def test_fleet_row_without_energy_or_goodput() -> None:
    row = fleet_row("broken.json", reference_goodput=10.0, config_goodput=0.0)
    assert row.cards is None and row.cards_delta is None
    assert row.energy_per_token_relative is None and row.energy_method == "not_measured"


def _random_cases(n: int) -> list[tuple[float, float, int, int]]:
    import random

    rng = random.Random(11)
    cases = []
    for _ in range(n):
        g = rng.choice([1, 2, 4, 8])
        cases.append((rng.uniform(0.1, 50.0), rng.uniform(0.1, 50.0), g * rng.randint(1, 32), g))
    return cases


def test_cards_are_enough_and_minimal() -> None:
    for ref, cfg, n, g in _random_cases(500):
        cards = cards_for_equal_goodput(ref, cfg, n_reference=n, gpus_per_server=g)
        assert cards is not None and cards % g == 0
        need = n / g * ref  # goodput of the reference fleet
        assert cards / g * cfg >= need * (1 - 1e-9), (ref, cfg, n, g, cards)
        assert (cards / g - 1) * cfg < need, (ref, cfg, n, g, cards)


def test_better_goodput_never_needs_more_cards() -> None:
    found = [cards_for_equal_goodput(10.0, 5.0 + 0.1 * i) for i in range(200)]
    cards = [c for c in found if c is not None]
    assert len(cards) == 200
    assert all(a >= b for a, b in itertools.pairwise(cards))
    assert cards[0] == 128 and cards[-1] == math.ceil(64 * 10.0 / 24.9)


def test_worse_config_shows_positive_delta() -> None:
    row = fleet_row("slow.json", reference_goodput=10.0, config_goodput=8.0)
    assert row.cards == 80 and row.cards_delta == 16
    assert row.goodput_relative == pytest.approx(-0.2)
