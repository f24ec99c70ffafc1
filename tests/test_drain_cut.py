"""``search.drain_s``: a probe stops waiting for its requests that long after its last send.

Chat-mix's longest outputs kept every H100 probe waiting ~30-60 s after its sends for requests
that the window had already judged on their first token; the cut ones are neither finished nor
failed: TTFT as measured, TPOT over the tokens received, E2EL projected from that TPOT.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.records import RequestRecord, RunRecord
from pytest_moeperf.metrics.summary import request_meets_slo, summarize
from pytest_moeperf.run.window import DRAIN_CUT, mark_cut
from pytest_moeperf.spec.loader import load_spec
from pytest_moeperf.spec.model import Slo


def streamed(i: int, send: float, tokens: int, asked: int, status: str = "ok") -> RequestRecord:
    """Tokens every 20 ms from send + 0.1 s; ``ok`` ends at the last token."""
    times = [send + 0.1 + 0.02 * k for k in range(tokens)]
    return RequestRecord(index=i, scheduled_s=send, send_s=send, input_tokens=8, max_tokens=asked,
                         status=status,  # type: ignore[arg-type]
                         first_token_s=times[0] if times else None,
                         end_s=times[-1] if status == "ok" and times else send + 5.0,
                         output_tokens=tokens, token_times_s=times)  # fmt: skip


def test_a_cut_request_reads_tpot_on_what_it_received_and_projects_its_latency() -> None:
    r = mark_cut(RunRecord("poisson", 1.0, 1.0, 0, 9.0, [streamed(0, 1.0, 11, 101, "cancelled")],
                           0.0, True, DRAIN_CUT)).requests[0]  # fmt: skip
    assert r.cut and not r.ok and r.end_s is None and r.e2el_s is None
    assert r.ttft_s == pytest.approx(0.1)
    assert r.tpot_s == pytest.approx(0.02)
    assert r.projected_e2el_s == pytest.approx(0.1 + 100 * 0.02)
    assert request_meets_slo(r, Slo(ttft_p99_ms=200, tpot_p99_ms=30))
    assert not request_meets_slo(r, Slo(ttft_p99_ms=200, tpot_p99_ms=30, e2el_p99_ms=1000))
    one = mark_cut(RunRecord("poisson", 1.0, 1.0, 0, 9.0, [streamed(0, 1.0, 1, 50, "cancelled")],
                             0.0, True, DRAIN_CUT)).requests[0]  # fmt: skip
    assert one.cut and one.tpot_s is None and one.projected_e2el_s is None


def test_mark_cut_ends_only_a_drain_and_keeps_what_never_started_cancelled() -> None:
    recs = [streamed(0, 0.0, 5, 5), streamed(1, 0.5, 3, 40, "cancelled"),
            streamed(2, 0.9, 0, 40, "cancelled")]  # fmt: skip
    drained = mark_cut(RunRecord("poisson", 2.0, 1.0, 0, 3.0, recs, 0.0, True, DRAIN_CUT))
    assert not drained.aborted_early and drained.abort_reason is None
    assert [r.status for r in drained.requests] == ["ok", "cut", "cancelled"]
    overload = RunRecord("poisson", 2.0, 1.0, 0, 3.0, recs, 0.0, True, "overload: TTFT rising")
    assert mark_cut(overload) is overload  # a real abort stays one


def test_the_window_counts_cut_requests_as_streamed_not_failed() -> None:
    """Ten requests 1 s apart, the last three cut: none failed, p99 TPOT includes theirs,
    mean output tokens counts what they asked for, and the summary says so."""
    recs = [streamed(i, float(i), 20, 20) for i in range(7)]
    recs += [streamed(i, float(i), 6, 200, "cancelled") for i in range(7, 10)]
    recs[8].token_times_s[1:] = [t + 0.2 * k for k, t in enumerate(recs[8].token_times_s[1:], 1)]
    run = mark_cut(RunRecord("poisson", 1.0, 1.0, 0, 12.0, recs, 0.0, True, DRAIN_CUT))
    s = summarize(run, Slo(ttft_p99_ms=500, tpot_p99_ms=100), warmup_s=0.0, cooldown_s=0.0)
    assert s.failed_by_status == {} and s.n_ok == 10
    assert s.window.n_ok == 10 and s.window.n_failed == 0
    assert s.mean_output_tokens == pytest.approx((7 * 20 + 3 * 200) / 10)
    assert s.tpot.n == 10 and s.tpot.p99_ms > 100  # the slow cut request's own TPOT
    assert not s.slo_met and "p99 tpot" in s.slo_violations[0]
    assert any("3 requests of the window were still streaming" in n for n in s.notes)
    assert math.isfinite(s.e2el.p99_ms)


SPEC = """\
name: drain
model: {{path: embedded, dtype: bfloat16, max_model_len: 1024}}
workload: {{trace: fixed, num_requests: 20, seed: 0, input_tokens: 8, output_tokens: 400}}
arrival: {{process: poisson}}
slo: {{ttft_p99_ms: 1000, tpot_p99_ms: 200}}
search: {{rate_min: 5, rate_max: 5.5, tolerance: 0.2, max_probes: 2, probe_requests: 20,
         probe_duration_s: 20{drain}}}
window: {{cooldown_fraction: 0}}
runs: 1
"""


def test_drain_s_below_the_ttft_slo_is_refused_and_unset_keeps_the_hash(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.format(drain=", drain_s: 0.5"))
    with pytest.raises(UsageError) as e:
        load_spec(bad)
    msg = str(e.value)
    assert "bad.yaml:" in msg and "search.drain_s" in msg and "0.5" in msg
    assert "below the TTFT SLO (1 s)" in msg and "drain_s >= 1" in msg
    plain, cut = tmp_path / "plain.yaml", tmp_path / "cut.yaml"
    plain.write_text(SPEC.format(drain=""))
    cut.write_text(SPEC.format(drain=", drain_s: 2"))
    assert "drain_s" not in load_spec(plain).to_dict()["search"]
    assert load_spec(plain).hash() != load_spec(cut).hash()
    assert load_spec(cut).search.drain_s == 2.0  # type: ignore[union-attr]


def test_a_probe_with_a_drain_ends_that_long_after_its_last_send(
    tmp_path: Path, serve: Any
) -> None:
    """400-token outputs at 10 ms a step take ~4 s; with drain_s 1 each probe stops 1 s after
    its last send: the requests still streaming are cut, none failed or was cancelled.

    No cooldown: the cut requests are those sent in the last ~3 s, and the default cooldown
    (10 % of a ~20 s span) kept most of them out of the window the note is written for; in one
    of five runs on a fast VM none was left in it (fresh-clone CI, 2026-12-07)."""
    from pytest_moeperf.metrics.energy import NotMeasuredMeter
    from pytest_moeperf.run.probe import Endpoint, measure_run

    url, _ = serve(delay_s=0.01)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(drain=", drain_s: 1"))
    spec = load_spec(path)
    run = measure_run(Endpoint(url, "m"), spec, spec.slo, index=0,
                      meter=NotMeasuredMeter("test"), vocab_size=500, rate_min=5.0,
                      probe_requests=20, max_probes=2, mbu_inputs=None)  # fmt: skip
    assert run.search is not None
    for probe in run.search.probes:
        s = probe.summary
        assert not probe.aborted and s["failed_by_status"] == {}, probe.reason
        assert any("were still streaming at the drain's end" in n for n in s["notes"])
        assert s["mean_output_tokens"] == 400
