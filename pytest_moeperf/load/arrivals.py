"""Open-loop arrival schedules, drawn the way ``vllm bench serve --burstiness`` draws them.

Inter-arrival gaps are gamma distributed with shape ``burstiness`` and mean ``1/rate``: shape 1
is a Poisson process, smaller shapes are burstier, larger ones more regular. Like vLLM, the
cumulated gaps are rescaled so the last arrival lands at ``n / rate``: without that, the realised
rate of a short probe is off by a few percent depending on the seed, and a rate search would
chase noise. A seeded generator makes each probe's schedule repeatable across runs.
"""

from __future__ import annotations

import math

from pytest_moeperf.errors import UsageError

_SOURCE = "arrival_offsets()"


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check(n: int, rate: float, burstiness: float, seed: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise UsageError(_SOURCE, "n", n, "must be an integer >= 0", "pass the number of requests")
    if not _is_number(rate) or math.isnan(rate) or rate <= 0:
        raise UsageError(
            _SOURCE,
            "rate",
            rate,
            "must be a number > 0",
            "pass requests/s, e.g. 4.0, or float('inf') to send every request at t=0",
        )
    if not _is_number(burstiness) or not math.isfinite(burstiness) or burstiness <= 0:
        raise UsageError(
            _SOURCE,
            "burstiness",
            burstiness,
            "must be a finite number > 0",
            "use 1.0 for Poisson arrivals, < 1 for burstier, > 1 for more regular traffic",
        )
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UsageError(_SOURCE, "seed", seed, "must be an integer >= 0", "pass e.g. seed=0")


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send offsets in seconds from the run start: non-decreasing, the last one at ``n/rate``.

    As in vLLM the first request also waits one gap. ``rate=inf`` sends everything at t=0
    (what ``--request-rate inf`` does).
    """
    _check(n, rate, burstiness, seed)
    if n == 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    import numpy as np

    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=float(burstiness), scale=1.0 / (rate * burstiness), size=n)
    cum = np.cumsum(gaps)
    if cum[-1] > 0:
        cum *= (n / rate) / cum[-1]
    return [float(x) for x in cum]
