"""judge() on constructed samples: each outcome, each edge case, each misuse."""

from __future__ import annotations

import json
import math
import re

import pytest
from scipy import stats

from pytest_moeperf.errors import UsageError
from pytest_moeperf.verdict import (
    DEFAULT_METRICS,
    MetricSpec,
    VerdictConfig,
    generic_metrics,
    get_metric,
    judge,
    judge_all,
    runs_needed,
    search_resolution,
)

GOODPUT = DEFAULT_METRICS["slo_goodput_tok_s"]
TTFT = DEFAULT_METRICS["ttft_p99_ms"]
POWER = DEFAULT_METRICS["power_w"]

BASE = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
DROP5 = [950.0, 960.0, 940.0, 955.0, 945.0]
GAIN5 = [1050.0, 1060.0, 1040.0, 1055.0, 1045.0]


def test_clear_drop_is_regressed() -> None:
    v = judge(GOODPUT, BASE, DROP5)
    assert v.outcome == "regressed"
    assert v.fails
    assert v.delta_rel == pytest.approx(-0.05, abs=0.002)
    assert v.p_value is not None and v.p_value < 0.01
    assert v.candidate_center < v.band[0]
    assert "worse" in v.reason and v.advice == ""


def test_clear_gain_is_improved() -> None:
    v = judge(GOODPUT, BASE, GAIN5)
    assert v.outcome == "improved"
    assert not v.fails
    assert v.candidate_center > v.band[1]
    assert "better" in v.reason


def test_same_distribution_is_unchanged() -> None:
    v = judge(GOODPUT, BASE, [1002.0, 998.0, 1007.0, 993.0, 1001.0])
    assert v.outcome == "unchanged"
    assert not v.fails
    assert abs(v.delta_rel) < 0.01


def test_within_noise_beyond_min_effect_is_unchanged() -> None:
    """A 1.5 % difference on 4 %-noisy runs: neither significant nor outside the band."""
    base = [1000.0, 1040.0, 960.0, 1030.0, 970.0]
    cand = [985.0, 1025.0, 945.0, 1015.0, 955.0]
    v = judge(GOODPUT, base, cand)
    assert abs(v.delta_rel) > GOODPUT.min_effect
    assert v.outcome == "unchanged"
    assert "noise" in v.reason


TPOT = DEFAULT_METRICS["tpot_p99_ms"]


def test_a_band_too_wide_cannot_call_a_big_change_unchanged() -> None:
    """CI, 2026-12-05: a baseline recorded while the VM stalled, p99 TPOT runs 9, 13 and 410 ms;
    a server slowed by 50 ms a step read about +394 %, inside that band: inconclusive, saying
    how wide the band is, not "unchanged"."""
    v = judge(TPOT, [9.0, 13.0, 410.0], [200.0, 190.0, 210.0])
    assert v.outcome == "inconclusive" and not v.fails
    lo, hi = v.band
    assert lo < 200.0 < hi and hi / lo > 2.0
    ratio = re.search(r"that band spans ([\d,.]+)x \(", v.reason)
    assert ratio is not None and float(ratio.group(1).replace(",", "")) == pytest.approx(
        hi / lo, rel=0.05)  # fmt: skip
    assert "the baseline's runs disagree too much" in v.reason
    assert v.advice == "record the baseline again on a quiet machine, with more runs " \
        "(--moeperf-runs)"  # fmt: skip


def test_a_wide_band_still_calls_a_change_below_min_effect_unchanged() -> None:
    v = judge(TPOT, [9.0, 13.0, 410.0], [36.05, 35.9, 36.1])  # ~ the baseline's geometric mean
    assert abs(v.delta_rel) < TPOT.min_effect and v.outcome == "unchanged"


def test_significant_but_below_min_effect_is_unchanged() -> None:
    base = [1000.0, 1000.2, 999.8, 1000.1, 999.9]
    cand = [995.0, 995.2, 994.8, 995.1, 994.9]  # -0.5 %, very significant
    v = judge(GOODPUT, base, cand)
    assert v.p_value is not None and v.p_value < 1e-6
    assert v.outcome == "unchanged"
    assert "minimum effect" in v.reason and "too small" in v.reason


def test_outside_band_but_not_significant_is_inconclusive() -> None:
    base = [1000.0, 1001.0, 999.0, 1000.5, 999.5]  # tight baseline: narrow band
    cand = [990.0, 960.0, 975.0, 985.0, 950.0]  # -2.8 % on average, noisier
    v = judge(GOODPUT, base, cand)
    assert v.candidate_center < v.band[0]
    assert v.p_value is not None and v.p_value >= 0.01
    assert v.outcome == "inconclusive"
    assert not v.fails
    assert "not significant" in v.reason
    assert re.search(r"run \d+ more", v.advice), v.advice


def test_significant_but_inside_band_is_inconclusive() -> None:
    """Noisy baseline, three tight candidate runs 3 % lower: the candidate looks certain, but
    the baseline says single runs wander that far."""
    base = [1000.0, 1020.0, 980.0, 1030.0, 970.0, 1010.0, 990.0, 1025.0, 975.0, 1000.0]
    cand = [970.0, 970.1, 969.9]
    v = judge(GOODPUT, base, cand)
    assert v.p_value is not None and v.p_value < 0.01
    assert v.band[0] < v.candidate_center < v.band[1]
    assert v.outcome == "inconclusive"
    assert "inside" in v.reason
    assert "baseline" in v.advice


def test_too_few_runs_is_inconclusive_even_for_a_big_drop() -> None:
    v = judge(GOODPUT, [1000.0, 1001.0], [900.0, 901.0, 899.0])
    assert v.outcome == "inconclusive"
    assert v.p_value is None
    assert "too few runs" in v.reason
    assert "1 more baseline and 0 more candidate" in v.advice


def test_single_baseline_run_has_no_band() -> None:
    v = judge(GOODPUT, [1000.0], [1000.0, 1001.0, 999.0])
    assert v.outcome == "inconclusive"
    assert all(math.isnan(x) for x in v.band)


def test_min_runs_config_allows_two_runs() -> None:
    v = judge(GOODPUT, [1000.0, 1000.5], [900.0, 900.5], config=VerdictConfig(min_runs=2))
    assert v.p_value is not None
    assert v.outcome != "inconclusive" or "too few" not in v.reason


def test_lower_is_better_metric_flips_direction() -> None:
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    slower = [110.0, 111.0, 109.0, 110.5, 109.5]
    faster = [90.0, 91.0, 89.0, 90.5, 89.5]
    assert judge(TTFT, base, slower).outcome == "regressed"
    assert judge(TTFT, base, faster).outcome == "improved"


def test_informational_metric_regresses_without_failing() -> None:
    v = judge(POWER, [300.0, 301.0, 299.0, 300.5], [330.0, 331.0, 329.0, 330.5])
    assert v.outcome == "regressed"
    assert not v.gating
    assert not v.fails


def test_accuracy_metric_is_refused() -> None:
    with pytest.raises(UsageError, match="accuracy gate"):
        judge(DEFAULT_METRICS["accuracy"], [0.8, 0.81, 0.79], [0.7, 0.71, 0.69])


def test_p_value_is_welch_on_logs() -> None:
    cand = [980.0, 1001.0, 985.0, 990.0, 975.0]
    v = judge(GOODPUT, BASE, cand)
    ref = stats.ttest_ind(
        [math.log(x) for x in cand], [math.log(x) for x in BASE], equal_var=False
    ).pvalue
    assert v.p_value == pytest.approx(float(ref), rel=1e-6)
    assert v.scale == "log"


def test_centers_are_geometric_means_and_band_is_log_symmetric() -> None:
    v = judge(GOODPUT, BASE, DROP5)
    gm = math.exp(sum(math.log(x) for x in BASE) / len(BASE))
    assert v.baseline_center == pytest.approx(gm)
    lo, hi = v.band
    assert lo < v.baseline_center < hi
    assert math.log(hi / v.baseline_center) == pytest.approx(math.log(v.baseline_center / lo))


def test_band_widens_with_coverage() -> None:
    narrow = judge(GOODPUT, BASE, DROP5, config=VerdictConfig(band_coverage=0.9)).band
    wide = judge(GOODPUT, BASE, DROP5, config=VerdictConfig(band_coverage=0.999)).band
    assert wide[0] < narrow[0] and wide[1] > narrow[1]


def test_stricter_alpha_turns_a_borderline_regression_inconclusive() -> None:
    cand = [985.0, 975.0, 990.0, 970.0, 980.0]
    loose = judge(GOODPUT, BASE, cand, config=VerdictConfig(alpha=0.05, band_coverage=0.9))
    strict = judge(GOODPUT, BASE, cand, config=VerdictConfig(alpha=0.0001, band_coverage=0.9))
    assert loose.outcome == "regressed"
    assert strict.outcome == "inconclusive"


def test_zero_spread_equal_runs_are_unchanged() -> None:
    v = judge(GOODPUT, [5.0, 5.0, 5.0], [5.0, 5.0, 5.0])
    assert v.outcome == "unchanged"
    assert v.p_value == 1.0


def test_zero_spread_different_runs_are_certain() -> None:
    v = judge(GOODPUT, [5.0, 5.0, 5.0], [4.0, 4.0, 4.0])
    assert v.outcome == "regressed"
    assert v.p_value == 0.0


def test_zero_values_use_linear_scale() -> None:
    v = judge(GOODPUT, [10.0, 10.5, 9.5], [0.0, 0.0, 0.0])
    assert v.scale == "linear"
    assert v.delta_rel == pytest.approx(-1.0)
    assert v.outcome == "regressed"


def test_all_zero_both_sides_is_unchanged() -> None:
    v = judge(GOODPUT, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    assert v.outcome == "unchanged"
    assert v.delta_rel == 0.0


def test_from_zero_baseline_is_infinite_gain() -> None:
    v = judge(GOODPUT, [0.0, 0.0, 0.0], [1.0, 1.1, 0.9])
    assert math.isinf(v.delta_rel) and v.delta_rel > 0
    assert v.outcome == "improved"


@pytest.mark.parametrize(
    "bad",
    [math.nan, math.inf, -1.0, True, "1000"],
    ids=["nan", "inf", "negative", "bool", "string"],
)
def test_bad_candidate_value_is_a_usage_error(bad: object) -> None:
    with pytest.raises(UsageError) as err:
        judge(GOODPUT, BASE, [1000.0, bad, 1000.0])  # type: ignore[list-item]
    msg = str(err.value)
    assert "candidate runs of metric 'slo_goodput_tok_s'" in msg
    assert "value[1]" in msg
    assert "Fix:" in msg


def test_bad_baseline_value_names_the_baseline_side() -> None:
    with pytest.raises(UsageError, match="baseline runs"):
        judge(GOODPUT, [1000.0, math.nan, 1.0], BASE)


def test_empty_side_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="is empty"):
        judge(GOODPUT, BASE, [])


def test_noisy_runs_advise_reducing_noise() -> None:
    base = [1000.0, 1500.0, 600.0, 1200.0, 800.0]
    cand = [1000.0, 1400.0, 500.0, 600.0, 400.0]
    cfg = VerdictConfig(band_coverage=0.6, alpha=0.01)
    v = judge(GOODPUT, base, cand, config=cfg)
    assert v.outcome == "inconclusive", v
    assert "noise is too high" in v.advice


def test_advice_matches_runs_needed() -> None:
    base = [1000.0, 1001.0, 999.0, 1000.5, 999.5]
    cand = [990.0, 960.0, 975.0, 985.0, 950.0]
    v = judge(GOODPUT, base, cand)
    m = re.search(r"run (\d+) more runs per side", v.advice)
    assert m, v.advice
    logs_b = [math.log(x) for x in base]
    logs_c = [math.log(x) for x in cand]
    sd = math.sqrt((stats.tvar(logs_b) * 4 + stats.tvar(logs_c) * 4) / 8)
    effect = abs(sum(logs_c) / 5 - sum(logs_b) / 5)
    assert int(m.group(1)) == runs_needed(sd, effect, alpha=0.01, power=0.95) - 5


def test_runs_needed_known_value() -> None:
    # normal approximation 2 * (4.22 * 1 / 3)^2 = 3.96 -> 4; t quantiles at df=2n-2 push it to
    # 6 (5.21 * 0.01 * sqrt(2/5) = 3.3 % > 3 %; 4.98 * 0.01 * sqrt(2/6) = 2.88 %), +1 below 10
    assert runs_needed(0.01, 0.03, alpha=0.01, power=0.95) == 7
    assert runs_needed(0.007, 0.03, alpha=0.01, power=0.95) == 5
    assert runs_needed(0.015, 0.03, alpha=0.01, power=0.95) == 11


def test_runs_needed_delivers_the_power_it_promises() -> None:
    """The advice is only useful if following it works: simulate at the advised n."""
    import numpy as np

    rng = np.random.default_rng(5)
    n = runs_needed(0.01, 0.03, alpha=0.01, power=0.95)
    noise = rng.normal(0.0, 0.01, (2, 1000, n))
    hits = sum(
        judge(GOODPUT, list(1000 * np.exp(b)), list(970 * np.exp(c))).outcome == "regressed"
        for b, c in zip(noise[0], noise[1], strict=True)
    )
    assert hits / 1000 >= 0.93


def test_runs_needed_grows_with_noise_and_shrinking_effect() -> None:
    a = runs_needed(0.01, 0.03, alpha=0.01, power=0.95)
    assert runs_needed(0.02, 0.03, alpha=0.01, power=0.95) > a
    assert runs_needed(0.01, 0.01, alpha=0.01, power=0.95) > a
    assert runs_needed(0.0, 0.03, alpha=0.01, power=0.95) == 2
    assert runs_needed(0.01, 0.0, alpha=0.01, power=0.95) > 10**6


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alpha", 0.0),
        ("alpha", 0.7),
        ("band_coverage", 1.0),
        ("band_coverage", 0.3),
        ("min_runs", 1),
        ("advice_power", 1.0),
        ("max_advised_runs", 1),
    ],
)
def test_bad_config_is_a_usage_error(field: str, value: float) -> None:
    with pytest.raises(UsageError, match=f"VerdictConfig: {field}"):
        VerdictConfig(**{field: value})  # type: ignore[arg-type]


def test_bad_direction_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="direction"):
        MetricSpec("x", "u", "up", 0.01)  # type: ignore[arg-type]


def test_bad_min_effect_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="min_effect"):
        MetricSpec("x", "u", "higher", 1.5)


def test_unknown_metric_suggests_the_closest() -> None:
    with pytest.raises(UsageError, match="did you mean 'ttft_p99_ms'"):
        get_metric("ttft_p99", source="--metric")


def test_registry_directions() -> None:
    higher = {"slo_goodput_tok_s", "slo_rate_rps", "output_tok_s", "tok_per_j", "mbu", "accuracy"}
    lower = {"ttft_p99_ms", "tpot_p99_ms", "e2el_p99_ms", "power_w"}
    assert {n for n, s in DEFAULT_METRICS.items() if s.direction == "higher"} == higher
    assert {n for n, s in DEFAULT_METRICS.items() if s.direction == "lower"} == lower
    assert DEFAULT_METRICS["power_w"].role == "informational"
    assert "accuracy" not in {s.name for s in generic_metrics()}


def test_judge_all_takes_common_known_metrics_in_registry_order() -> None:
    base = {"ttft_p99_ms": BASE, "slo_goodput_tok_s": BASE, "accuracy": [0.8] * 3, "zzz": BASE}
    cand = {"ttft_p99_ms": BASE, "slo_goodput_tok_s": DROP5, "accuracy": [0.8] * 3, "zzz": BASE}
    out = judge_all(base, cand)
    assert [v.metric for v in out] == ["slo_goodput_tok_s", "ttft_p99_ms"]
    assert out[0].outcome == "regressed"


def test_judge_all_with_names_requires_both_sides() -> None:
    with pytest.raises(UsageError, match="not recorded on the candidate side"):
        judge_all({"mbu": BASE}, {"ttft_p99_ms": BASE}, names=["mbu"], source="--metric")


def test_judge_all_with_unknown_name() -> None:
    with pytest.raises(UsageError, match="--metric: metric = 'goodput'"):
        judge_all({"mbu": BASE}, {"mbu": BASE}, names=["goodput"], source="--metric")


def test_verdict_to_dict_is_json() -> None:
    d = judge(GOODPUT, BASE, DROP5).to_dict()
    again = json.loads(json.dumps(d))
    assert again["outcome"] == "regressed"
    assert again["band"] == list(d["band"])


def test_runs_on_one_bracket_are_known_only_to_within_it() -> None:
    """Three baseline runs that all certified the same bracket (24.19 req/s each, the committed
    CPU baseline of 2026-12-05) have no spread; a candidate one bracket up or down is not a
    certain change: the search's resolution (log(1 + tolerance)) is their uncertainty."""
    spec = DEFAULT_METRICS["slo_rate_rps"]
    base, below = [24.19] * 3, [21.99] * 3  # one 10 % bracket lower
    certain = judge(spec, base, below)
    assert certain.outcome == "regressed" and certain.p_value == 0.0  # without: a false alarm
    v = judge(spec, base, below, resolution=math.log1p(0.10))
    assert v.outcome != "regressed" and v.p_value is not None and v.p_value > 0.01
    assert v.band[0] < 21.99 < 24.19 < v.band[1]
    halved = judge(spec, base, [12.1] * 3, resolution=math.log1p(0.10))
    assert halved.outcome == "regressed"  # a change far beyond the bracket is still caught
    # metrics that are not search results keep their own spread
    tpot = DEFAULT_METRICS["tpot_p99_ms"]
    assert not tpot.searched
    assert judge(tpot, [10.0] * 3, [12.0] * 3, resolution=1.0).outcome == "regressed"


def test_search_resolution_is_the_widest_tolerance_of_the_runs() -> None:
    runs = [{"tolerance": 0.08, "bracket": [1, 2]}, {"tolerance": 0.1}, {"fixed": {}}]
    assert search_resolution(runs) == pytest.approx(math.log1p(0.1))
    assert search_resolution([{"fixed": {}}]) == 0.0 and search_resolution([]) == 0.0
