"""A refresh never replaces a compared baseline with a result that may be a regression
(``run/refresh.py`` ``suspect_replacement``), even where the verdict could only say
*inconclusive*.

Nightly CPU job, 2026-12-07: the tutorial's baseline was recorded while the machine stalled the
client, so the server slowed 50 ms a step read SLO goodput -82 % and p99 TPOT +215 %
*inconclusive* against it, passed, and its refresh replaced the baseline.
"""

from __future__ import annotations

from typing import Any

from pytest_moeperf.run.refresh import suspect_replacement, why_not_written
from pytest_moeperf.verdict.stats import Verdict

PATH = "baselines/t/cpu.json"


def verdict(metric: str = "slo_goodput_tok_s", outcome: str = "inconclusive",
            candidate: float = 140.0, band: tuple[float, float] = (662.0, 905.0),
            direction: str = "higher", gating: bool = True) -> Verdict:  # fmt: skip
    base = (band[0] + band[1]) / 2
    return Verdict(metric=metric, unit="tok/s", direction=direction,  # type: ignore[arg-type]
                   outcome=outcome, baseline_center=base, band=band,  # type: ignore[arg-type]
                   candidate_center=candidate, delta_rel=candidate / base - 1, p_value=0.02,
                   n_baseline=3, n_candidate=3, reason="...", gating=gating)  # fmt: skip


def test_a_slowdown_read_inconclusive_beyond_the_band_is_refused_with_its_figures() -> None:
    why = suspect_replacement("compared", PATH, [
        verdict(), verdict("tpot_p99_ms", candidate=60.0, band=(14.0, 22.0), direction="lower"),
    ], had_runs=3)  # fmt: skip
    assert why is not None
    assert why.startswith("slo_goodput_tok_s -82.1 % (140 tok/s, beyond the band 662 to 905); "
                          "tpot_p99_ms +233.3 % (60 tok/s, beyond the band 14 to 22) read "
                          "inconclusive, worse than the baseline's runs")  # fmt: skip
    assert f"does not replace the baseline it was compared with ({PATH})" in why
    assert why.endswith("to accept it, remove that file and refresh again")


def test_inside_the_band_for_the_better_or_not_gating_it_is_written() -> None:
    wide = verdict(candidate=700.0, band=(400.0, 1_000.0))  # a 2.5x band: H100 nights
    better = verdict(candidate=1_465.0)  # +89 %, `make perf` on a faster VM
    faster_tpot = verdict("tpot_p99_ms", candidate=5.0, band=(14.0, 22.0), direction="lower")
    power = verdict("power_w", candidate=10.0, gating=False)  # information only
    regressed = verdict(outcome="regressed")  # refused already: the test failed
    for v in (wide, better, faster_tpot, power, regressed):
        assert suspect_replacement("compared", PATH, [v], had_runs=3) is None, v


def test_a_first_baseline_or_a_weak_one_is_not_held_by_it() -> None:
    assert suspect_replacement("missing", None, [verdict()], had_runs=0) is None
    assert suspect_replacement("compared", PATH, [verdict()], had_runs=2) is None  # few_runs


def test_the_refresh_rule_applies_it_after_a_failed_test() -> None:
    class Run:
        complete = True

        def to_dict(self) -> dict[str, Any]:
            return {"probes": []}

    common: dict[str, Any] = dict(runs=[Run()] * 3, planned_runs=3, quick=False, partial=None,
                                  status="compared", path=PATH, had_runs=3)  # fmt: skip
    refused = why_not_written(reasons=[], verdicts=[verdict()], **common)
    assert refused.why is not None and "may be a regression" in refused.why
    failed = why_not_written(reasons=["goodput regressed"], verdicts=[verdict()], **common)
    assert failed.why == "the test failed: goodput regressed"
    assert why_not_written(reasons=[], verdicts=[], **common).why is None
