"""benchmarks/fill_check.py's window figures, on synthetic records (the script's server part is
what docs/results/cpu-fill-check-2026-12-05/ ran)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_moeperf.load.records import RequestRecord

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from fill_check import window_row  # type: ignore[import-not-found]


def stream(rate: float, span: float, latency: float, tokens: int = 11) -> list[RequestRecord]:
    """Even sends; every request streams ``tokens`` tokens evenly over its ``latency``."""
    out = []
    for i in range(round(rate * span)):
        t = i / rate
        times = tuple(t + latency * (k + 1) / tokens for k in range(tokens))
        out.append(RequestRecord(index=i, scheduled_s=t, send_s=t, input_tokens=8,
                                 max_tokens=tokens, first_token_s=times[0], end_s=times[-1],
                                 output_tokens=tokens, token_times_s=times))  # fmt: skip
    return out


def test_a_window_opening_before_the_fill_up_reads_a_lighter_load() -> None:
    """10 req/s of 4 s requests: 40 in the system once full, and 10 x 11 tokens a second."""
    recs = stream(10.0, 60.0, 4.0)
    early, full = window_row(recs, 0.0, 4.0), window_row(recs, 10.0, 20.0)
    assert full["mean_in_system"] == pytest.approx(40.0, abs=1.0)
    assert full["tokens_over_asked"] == pytest.approx(1.0, abs=0.03)
    assert early["mean_in_system"] < 0.6 * full["mean_in_system"]
    assert early["tokens_over_asked"] < 0.6
    assert full["tpot_p99_ms"] == pytest.approx(1e3 * (4.0 - 4.0 / 11) / 10)  # (e2el - TTFT) / 10
    assert full["sends"] == 201
