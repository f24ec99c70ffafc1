"""Translate a goodput change into GPUs to buy: "cards for equal goodput", and energy per token.

Why: "+7 % goodput" does not tell an operator much; "60 cards instead of 64 for the same SLO-
meeting traffic" does. Goodputs are per server (what one measured server sustains within the
SLO); cards count GPUs, and a fleet grows in whole servers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf.errors import UsageError

# Ratios within this relative distance of an integer are that integer: 64 * 0.3 / 0.1 is
# 191.99999999999997 in floating point and must give 192 cards, not 193.
_REL_TOL = 1e-9


def _check_goodput(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(
            "cards_for_equal_goodput",
            name,
            value,
            "must be a finite number",
            "pass goodput in req/s",
        )
    if value < 0:
        raise UsageError(
            "cards_for_equal_goodput", name, value, "goodput cannot be negative", "pass req/s >= 0"
        )


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(
            "cards_for_equal_goodput", name, value, "must be an integer >= 1", "pass a GPU count"
        )


def _ceil_tolerant(x: float) -> int:
    nearest = round(x)
    if abs(x - nearest) <= _REL_TOL * max(1.0, abs(x)):
        return int(nearest)
    return math.ceil(x)


def cards_for_equal_goodput(
    reference_goodput: float,
    config_goodput: float,
    n_reference: int = 64,
    gpus_per_server: int = 1,
) -> int | None:
    """GPUs the candidate config needs to serve what ``n_reference`` reference GPUs serve.

    ceil(N x ref / cfg) for one GPU per server; with G GPUs per server the fleet is
    ceil(N x ref / (G x cfg)) servers of G cards. None when the config's goodput is 0: no number
    of cards meets the SLO.
    """
    _check_goodput("reference_goodput", reference_goodput)
    _check_goodput("config_goodput", config_goodput)
    _check_count("n_reference", n_reference)
    _check_count("gpus_per_server", gpus_per_server)
    if reference_goodput == 0:
        raise UsageError(
            "cards_for_equal_goodput",
            "reference_goodput",
            reference_goodput,
            "the reference meets the SLO at no request rate, so there is no goodput to match",
            "loosen the SLO or fix the reference config before comparing fleets",
        )
    if n_reference % gpus_per_server:
        raise UsageError(
            "cards_for_equal_goodput",
            "n_reference",
            n_reference,
            f"{n_reference} cards are not a whole number of {gpus_per_server}-GPU servers",
            f"use a multiple of {gpus_per_server}",
        )
    if config_goodput == 0:
        return None
    servers_ref = n_reference // gpus_per_server
    servers = _ceil_tolerant(servers_ref * reference_goodput / config_goodput)
    return servers * gpus_per_server


def energy_per_token_relative(
    ref_tokens_per_joule: float | None, cfg_tokens_per_joule: float | None
) -> float | None:
    """cfg J/token / ref J/token - 1 (negative = the config uses less energy per token).

    None when either side was not measured: an unmeasured side must not read as "no change".
    """
    if ref_tokens_per_joule is None or cfg_tokens_per_joule is None:
        return None
    for name, v in (("ref", ref_tokens_per_joule), ("cfg", cfg_tokens_per_joule)):
        if isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise UsageError(
                "energy_per_token_relative",
                f"{name}_tokens_per_joule",
                v,
                "tokens per joule must be a positive finite number",
                "pass energy.tokens_per_joule(...), which is None when not measured",
            )
    return ref_tokens_per_joule / cfg_tokens_per_joule - 1.0


@dataclass
class FleetRow:
    """One config's line in the fleet table of the report."""

    config: str
    goodput: float
    reference_goodput: float
    n_reference: int
    gpus_per_server: int
    cards: int | None  # None: the config meets the SLO at no request rate
    tokens_per_joule: float | None
    energy_per_token_relative: float | None
    energy_method: str
    mbu: float | None = None

    @property
    def cards_delta(self) -> int | None:
        return None if self.cards is None else self.cards - self.n_reference

    @property
    def goodput_relative(self) -> float:
        return self.goodput / self.reference_goodput - 1.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cards_delta"] = self.cards_delta
        d["goodput_relative"] = self.goodput_relative
        return d


def fleet_row(
    config: str,
    reference_goodput: float,
    config_goodput: float,
    ref_tokens_per_joule: float | None = None,
    cfg_tokens_per_joule: float | None = None,
    energy_method: str = "not_measured",
    n_reference: int = 64,
    gpus_per_server: int = 1,
    mbu: float | None = None,
) -> FleetRow:
    """Build a FleetRow, computing cards and relative energy consistently."""
    return FleetRow(
        config=config,
        goodput=config_goodput,
        reference_goodput=reference_goodput,
        n_reference=n_reference,
        gpus_per_server=gpus_per_server,
        cards=cards_for_equal_goodput(
            reference_goodput, config_goodput, n_reference, gpus_per_server
        ),
        tokens_per_joule=cfg_tokens_per_joule,
        energy_per_token_relative=energy_per_token_relative(
            ref_tokens_per_joule, cfg_tokens_per_joule
        ),
        energy_method=energy_method,
        mbu=mbu,
    )
