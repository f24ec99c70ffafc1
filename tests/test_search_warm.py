"""The search's warm start (an earlier run's bracket), its step down, and steady-state misses.

The probe is a deterministic stand-in: below ``boundary`` every probe meets the SLO with p99s far
inside it; above, either the p99s fail (a curve miss) or they still meet while the probe is not a
steady state (what the H200 showed: completions at 81-88 % of the offered rate, p99s inside).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from pytest_moeperf.run.abort import AbortCheck
from pytest_moeperf.run.search import (
    HINTED_EXPAND_FACTOR,
    ProbeResult,
    SearchResult,
    curve_miss,
    search_slo_boundary,
)
from pytest_moeperf.spec.model import Slo

SLO = Slo(ttft_p99_ms=2000.0, tpot_p99_ms=50.0)


def summary(rate: float, ttft: float, tpot: float, n_ok: int = 60) -> dict[str, Any]:
    return {"ttft": {"p99_ms": ttft}, "tpot": {"p99_ms": tpot}, "output_tok_s": rate * 128,
            "request_throughput": rate, "n_ok": n_ok, "n_requests": 60}  # fmt: skip


class Server:
    """met below ``boundary``; above it a steady-state miss (p99s fine) or a p99 miss."""

    def __init__(self, boundary: float, miss: str = "steady") -> None:
        self.boundary, self.miss, self.rates = boundary, miss, []  # type: list[float]

    def __call__(self, rate: float, abort: AbortCheck) -> ProbeResult:
        self.rates.append(rate)
        if rate <= self.boundary:
            return ProbeResult(rate, True, summary(rate, 300.0, 30.0))
        if self.miss == "steady":
            return ProbeResult(rate, False, summary(rate, 400.0, 35.0),
                               reason="not a steady state: falling behind")  # fmt: skip
        if self.miss == "dead":
            s = summary(rate, math.inf, math.inf, n_ok=0)
            s.update(failed_by_status={"http_500": 60}, first_error="HTTP 500: boom")
            return ProbeResult(rate, False, s, reason="every request failed")
        return ProbeResult(rate, False, summary(rate, 2500.0, 60.0), reason="ttft p99")


def run(server: Server, **kw: Any) -> SearchResult:
    args: dict[str, Any] = {"slo": SLO, "rate_min": 2.0, "tolerance": 0.05, "max_probes": 10}
    args.update(kw)
    return search_slo_boundary(server, **args)


def test_curve_miss_tells_a_steady_state_miss_from_a_p99_miss() -> None:
    assert not curve_miss(Server(5.0)(6.0, lambda r, t: None), SLO)
    assert curve_miss(Server(5.0, "p99")(6.0, lambda r, t: None), SLO)
    assert not curve_miss(Server(5.0)(4.0, lambda r, t: None), SLO)  # met: no miss at all
    aborted = ProbeResult(6.0, False, summary(6.0, math.inf, math.inf), aborted=True)
    assert curve_miss(aborted, SLO)  # overload stop: its throughput estimates the capacity


@pytest.mark.parametrize("boundary", [3.3, 9.64, 11.0, 17.7, 41.0])
def test_steady_state_misses_are_bisected_to_the_tolerance(boundary: float) -> None:
    """p99s say nothing above the boundary here: log bisection must still close the bracket."""
    server = Server(boundary)
    res = run(server)
    assert res.converged, (res.note, server.rates)
    lo, hi = res.bracket
    assert lo is not None and hi is not None
    assert lo <= boundary < hi and hi / lo <= 1.05 * (1 + 1e-9), server.rates
    assert len(server.rates) <= 10


def test_a_bracketing_hint_certifies_in_two_probes() -> None:
    """Run 2 starts at run 1's met rate and probes run 1's failing rate next."""
    server = Server(10.0)
    res = run(server, start_rate=9.8, hint_hi=10.2)
    assert server.rates == [9.8, 10.2]
    assert res.converged and res.bracket == (9.8, 10.2)


def test_a_met_hint_steps_up_gently_not_x4() -> None:
    """Was: run 2's hint met, and the next probe leapt to 38.6 req/s (x4)."""
    server = Server(12.0)
    res = run(server, start_rate=9.64, hint_hi=10.6)
    assert server.rates[:2] == [9.64, 10.6]
    assert server.rates[2] <= 10.6 * HINTED_EXPAND_FACTOR * (1 + 1e-9), server.rates
    assert res.converged and res.bracket[0] is not None and res.bracket[0] <= 12.0


def test_a_miss_at_the_start_steps_down_and_never_below_rate_min() -> None:
    server = Server(6.0)
    res = run(server, start_rate=9.0, rate_min=2.0)
    assert server.rates[0] == 9.0
    assert server.rates[1] == pytest.approx(9.0 / 1.05**2)  # a small step first: noise
    assert all(r >= 2.0 for r in server.rates)
    assert res.converged and res.boundary_rate is not None and res.boundary_rate <= 6.0


def test_a_miss_at_rate_min_says_there_is_no_boundary() -> None:
    server = Server(1.0, "p99")
    res = run(server, start_rate=4.0, rate_min=2.0)
    assert server.rates[-1] == 2.0 and res.boundary_rate is None and not res.converged
    assert res.note == "SLO not met at the lowest rate 2 req/s"


def test_when_every_request_failed_the_note_says_so_with_the_first_error() -> None:
    res = run(Server(0.5, "dead"))
    assert res.note == ("SLO not met at the lowest rate 2 req/s: every request failed "
                        "(http_500 60); first error: HTTP 500: boom")  # fmt: skip


def test_an_unconverged_search_says_so_with_its_bracket() -> None:
    server = Server(10.0)
    res = run(server, max_probes=3)
    assert not res.converged and res.note == "not converged within 3 probes"
    assert len(server.rates) == 3


class NearMiss(Server):
    """TPOT p99 just under the SLO at every met rate: the curves aim just above each one."""

    def __call__(self, rate: float, abort: AbortCheck) -> ProbeResult:
        self.rates.append(rate)
        if rate <= self.boundary:
            return ProbeResult(rate, True, summary(rate, 300.0, 46.0))
        return ProbeResult(rate, False, summary(rate, 2500.0, 60.0), reason="tpot p99")


def test_three_mets_in_a_row_inside_the_bracket_switch_to_bisection() -> None:
    """Was (H200, 2026-12-03): 8 % steps 9.3, 10.4, 11.2, 12.1, 14.1 under a miss at 32."""
    server = NearMiss(14.1)
    res = run(server, rate_min=8.0, tolerance=0.08)
    assert res.converged, (res.note, server.rates)
    lo, hi = res.bracket
    assert lo is not None and hi is not None and lo <= 14.1 < hi
    assert hi / lo <= 1.08 + 1e-9
    # 8, 32, 15.4 (miss), 10.5, 12.2, 13.6 (three mets), then the bisection 14.5 closes it
    assert len(server.rates) <= 7, server.rates


def _rec(i: int, send: float, ttft: float, e2el: float) -> Any:
    from pytest_moeperf.load.records import RequestRecord

    return RequestRecord(index=i, scheduled_s=send, send_s=send, input_tokens=8,
                         max_tokens=10, first_token_s=send + ttft, end_s=send + e2el,
                         output_tokens=10)  # fmt: skip


def test_the_fill_up_of_an_empty_server_is_no_overload() -> None:
    """TTFT 100 ms for the first 1.5 s (empty server), then a steady 500 ms: not a rising queue.
    Was: the line through the fill-up projected past the SLO and stopped 10-12 req/s probes."""
    from pytest_moeperf.run.abort import AbortPolicy

    slo = Slo(ttft_p99_ms=1000.0, tpot_p99_ms=1000.0)
    recs = [_rec(i, i * 0.1, 0.1 if i * 0.1 < 1.5 else 0.5 + 0.01 * (i % 3), 1.5)
            for i in range(80)]  # fmt: skip
    check = AbortPolicy(planned_requests=168).make(slo, 10.0)
    assert check(recs, 8.0) is None
    rising = [_rec(i, i * 0.1, 0.1 + 0.01 * i, 1.5 + 0.01 * i) for i in range(80)]
    why = check(rising, 8.0)
    assert why is not None and why.startswith("overload: TTFT rising")
