"""Tests for the paired accuracy gate (McNemar + paired bootstrap) on constructed outcomes."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pytest_moeperf.accuracy.paired import (
    AccuracyResult,
    AccuracyVerdict,
    QuestionOutcome,
    compare_paired,
    compare_results,
)
from pytest_moeperf.errors import UsageError


def pairs(n: int, both: int, lost: int, gained: int) -> tuple[list[bool], list[bool]]:
    """n questions: ``both`` right on both sides, ``lost`` only in baseline, ``gained`` only in
    candidate, the rest wrong on both."""
    assert both + lost + gained <= n
    base = [True] * both + [True] * lost + [False] * gained
    cand = [True] * both + [False] * lost + [True] * gained
    rest = n - len(base)
    return base + [False] * rest, cand + [False] * rest


# --- decisions ----------------------------------------------------------------------------------


def test_identical_outcomes_pass_with_zero_delta() -> None:
    base, cand = pairs(1319, 1050, 0, 0)
    v = compare_paired(base, cand, max_drop_points=1.0)
    assert v.passed
    assert v.delta_points == 0.0
    assert v.p_value == 1.0
    assert v.discordant == (0, 0)
    assert v.ci == (0.0, 0.0)
    assert v.n == 1319
    assert "within tolerance" in v.reason


def test_big_real_drop_fails() -> None:
    base, cand = pairs(1319, 900, 150, 20)
    v = compare_paired(base, cand, max_drop_points=2.0)
    assert not v.passed
    assert v.discordant == (150, 20)
    assert v.delta_points == pytest.approx(-100 * 130 / 1319)
    assert v.p_value < 1e-20
    assert v.ci[1] < -2.0
    assert "dropped 9.9 points" in v.reason
    assert "significant" in v.reason


def test_drop_just_over_tolerance_and_significant_fails() -> None:
    base, cand = pairs(1319, 1000, 60, 25)
    v = compare_paired(base, cand, max_drop_points=2.0)
    assert -v.delta_points == pytest.approx(100 * 35 / 1319)
    assert v.p_value < 0.05
    assert not v.passed


def test_small_noisy_drop_passes() -> None:
    base, cand = pairs(1319, 1030, 25, 15)
    v = compare_paired(base, cand, max_drop_points=2.0)
    assert v.passed
    assert v.delta_points < 0
    assert "within tolerance" in v.reason


def test_large_but_insignificant_drop_on_few_questions_passes() -> None:
    # 4 points on 50 questions is 3 lost vs 1 gained: p = 0.625, not evidence of a regression.
    base, cand = pairs(50, 35, 3, 1)
    v = compare_paired(base, cand, max_drop_points=2.0)
    assert -v.delta_points == pytest.approx(4.0)
    assert v.p_value == pytest.approx(0.625)
    assert v.passed
    assert "not significant" in v.reason


def test_same_drop_on_more_questions_fails() -> None:
    # The same 4-point drop, with 30x the questions, is significant: the gate gains power with n.
    base, cand = pairs(1500, 1050, 90, 30)
    v = compare_paired(base, cand, max_drop_points=2.0)
    assert -v.delta_points == pytest.approx(4.0)
    assert not v.passed


def test_improvement_passes() -> None:
    base, cand = pairs(200, 100, 5, 40)
    v = compare_paired(base, cand, max_drop_points=0.0)
    assert v.passed
    assert v.delta_points == pytest.approx(17.5)


def test_both_near_zero_pass_as_not_informative() -> None:
    base, cand = pairs(1319, 0, 12, 1)
    v = compare_paired(base, cand, max_drop_points=0.5)
    assert v.passed
    assert not v.informative
    assert v.reason.startswith(
        "not informative: accuracy near zero on both sides (0.9% and "
        "0.1%, both < 5%), so a drop cannot be seen"
    )
    assert "passed" not in v.reason  # the gate decides (allow_uninformative), not the text


def test_near_zero_threshold_is_configurable() -> None:
    base, cand = pairs(1000, 0, 80, 0)  # 8 % -> 0 %
    assert compare_paired(base, cand, max_drop_points=1.0, near_zero=0.1).passed
    assert not compare_paired(base, cand, max_drop_points=1.0).passed


def test_exact_mcnemar_p_value_matches_hand_computation() -> None:
    # b=10, c=2: two-sided exact binomial p = 2 * (C(12,0)+C(12,1)+C(12,2)) / 2**12 = 158/4096.
    base, cand = pairs(100, 50, 10, 2)
    v = compare_paired(base, cand, max_drop_points=50.0)
    assert v.p_value == pytest.approx(158 / 4096)


def test_bootstrap_ci_is_seeded_and_brackets_the_delta() -> None:
    base, cand = pairs(500, 300, 30, 10)
    v1 = compare_paired(base, cand, max_drop_points=2.0, seed=7)
    v2 = compare_paired(base, cand, max_drop_points=2.0, seed=7)
    v3 = compare_paired(base, cand, max_drop_points=2.0, seed=8)
    assert v1.ci == v2.ci
    assert v1.ci != v3.ci
    lo, hi = v1.ci
    assert lo < v1.delta_points < hi
    # Normal approximation of the paired SE: sqrt((b + c)/n - delta^2) / sqrt(n), in points.
    d = (10 - 30) / 500
    se = 100 * math.sqrt((40 / 500 - d * d) / 500)
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.1)


def test_ci_level_follows_alpha() -> None:
    base, cand = pairs(500, 300, 30, 10)
    wide = compare_paired(base, cand, max_drop_points=2.0, alpha=0.01).ci
    narrow = compare_paired(base, cand, max_drop_points=2.0, alpha=0.2).ci
    assert wide[1] - wide[0] > narrow[1] - narrow[0]


def test_accepts_zero_one_ints() -> None:
    ints: list[Any] = [1, 0, 1, 1]
    v = compare_paired(ints, [1, 0, 1, 0], max_drop_points=50.0)  # type: ignore[list-item]
    assert v.discordant == (1, 0)


def test_verdict_to_dict_is_json() -> None:
    base, cand = pairs(100, 50, 10, 2)
    data = compare_paired(base, cand, max_drop_points=2.0).to_dict()
    again = json.loads(json.dumps(data))
    assert again["discordant"] == [10, 2]
    assert again["passed"] is False
    assert len(again["ci"]) == 2


# --- misuse --------------------------------------------------------------------------------------


def test_length_mismatch_names_both_sides() -> None:
    with pytest.raises(UsageError) as err:
        compare_paired(
            [True] * 5,
            [True] * 4,
            max_drop_points=1.0,
            baseline_source="baselines/a.json",
            candidate_source="this run",
        )
    msg = str(err.value)
    assert "baselines/a.json" in msg and "this run" in msg
    assert "(5)" in msg and "= 4" in msg


def test_question_id_mismatch_names_position_and_both_ids() -> None:
    with pytest.raises(UsageError) as err:
        compare_paired(
            [True, False, True],
            [True, False, True],
            max_drop_points=1.0,
            baseline_ids=[0, 1, 2],
            candidate_ids=[0, 1, 7],
            baseline_source="base.json",
        )
    msg = str(err.value)
    assert "position 2" in msg and "7" in msg and "base.json" in msg and "2)" in msg


def test_ids_given_on_one_side_only_fail() -> None:
    with pytest.raises(UsageError, match="question ids"):
        compare_paired([True, True], [True, True], max_drop_points=1.0, baseline_ids=[0, 1])


def test_ids_count_must_match_outcomes() -> None:
    with pytest.raises(UsageError, match="count differs"):
        compare_paired(
            [True, True], [True, True], max_drop_points=1.0, baseline_ids=[0], candidate_ids=[0]
        )


def test_empty_outcomes_fail() -> None:
    with pytest.raises(UsageError, match="nothing to compare"):
        compare_paired([], [], max_drop_points=1.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_max_drop_fails(bad: float) -> None:
    with pytest.raises(UsageError, match="max_drop_points"):
        compare_paired([True], [True], max_drop_points=bad)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1])
def test_bad_alpha_fails(bad: float) -> None:
    with pytest.raises(UsageError, match="alpha"):
        compare_paired([True], [True], max_drop_points=1.0, alpha=bad)


def test_bad_near_zero_fails() -> None:
    with pytest.raises(UsageError, match="near_zero"):
        compare_paired([True], [True], max_drop_points=1.0, near_zero=1.5)


def test_too_few_bootstrap_resamples_fail() -> None:
    with pytest.raises(UsageError, match="n_boot"):
        compare_paired([True], [True], max_drop_points=1.0, n_boot=10)


def test_non_boolean_outcome_fails_with_position() -> None:
    with pytest.raises(UsageError, match=r"outcome\[1\]"):
        compare_paired([True, True], [True, "yes"], max_drop_points=1.0)  # type: ignore[list-item]


# --- compare_results on stored runs --------------------------------------------------------------


def result(
    strict: list[bool], flexible: list[bool] | None = None, errors: int = 0, **meta: Any
) -> AccuracyResult:
    flexible = strict if flexible is None else flexible
    outcomes = [
        QuestionOutcome(i, s, f, "1", "1", "1", "HTTP 500: boom" if i < errors else None)
        for i, (s, f) in enumerate(zip(strict, flexible, strict=True))
    ]
    kw: dict[str, object] = {"task": "gsm8k", "shots": 5, "limit": None, "seed": 1234}
    kw.update(meta)
    return AccuracyResult.from_outcomes(outcomes, **kw)


def test_compare_results_uses_the_chosen_metric() -> None:
    base = result([True] * 40 + [False] * 10, [True] * 40 + [False] * 10)
    cand = result([False] * 40 + [True] * 10, [True] * 40 + [False] * 10)
    flex = compare_results(base, cand, max_drop_points=2.0)
    strict = compare_results(base, cand, max_drop_points=2.0, metric="strict_match")
    assert flex.passed and flex.metric == "flexible_extract"
    assert not strict.passed and strict.metric == "strict_match"


def test_compare_results_unknown_metric_fails() -> None:
    r = result([True, False])
    with pytest.raises(UsageError, match="metric"):
        compare_results(r, r, max_drop_points=1.0, metric="exact")


@pytest.mark.parametrize(
    ("key", "value"), [("shots", 8), ("seed", 1), ("task", "gsm8k_cot"), ("data_digest", "x")]
)
def test_compare_results_refuses_unpaired_prompts(key: str, value: Any) -> None:
    base = result([True, False])
    cand = result([True, False], **{key: value})
    with pytest.raises(UsageError) as err:
        compare_results(base, cand, max_drop_points=1.0, baseline_source="b.json")
    assert f"accuracy.{key}" in str(err.value) and "b.json" in str(err.value)


def test_compare_results_refuses_a_candidate_longer_than_the_baseline() -> None:
    with pytest.raises(UsageError, match="number of questions"):
        compare_results(result([True] * 3), result([True] * 5), max_drop_points=1.0)


def test_quick_candidate_is_paired_with_the_baseline_prefix() -> None:
    # Baseline: 100 questions, the first 20 all right, the rest wrong; a quick run on the first
    # 20 that gets them all right is unchanged on those 20, not "up 80 points".
    base = result([True] * 20 + [False] * 80, limit=100)
    cand = result([True] * 20, limit=20)
    v = compare_results(base, cand, max_drop_points=1.0)
    assert v.passed and v.n == 20 and v.delta_points == 0.0 and v.baseline_acc == 1.0
    assert "compared on the first 20 of the baseline's 100 questions" in v.reason
    # ... and a real drop on the prefix still fails.
    worse = compare_results(base, result([False] * 20, limit=20), max_drop_points=1.0)
    assert not worse.passed and worse.n == 20


def test_candidate_with_other_questions_than_the_prefix_is_refused() -> None:
    base = result([True] * 10)
    cand = result([True] * 3)
    cand.per_question[1].index = 7
    with pytest.raises(UsageError, match="number of questions"):
        compare_results(base, cand, max_drop_points=1.0)


def test_compare_results_refuses_different_question_ids() -> None:
    base = result([True, True, False])
    cand = result([True, True, False])
    cand.per_question[2].index = 9
    with pytest.raises(UsageError, match="position 2"):
        compare_results(base, cand, max_drop_points=1.0)


def test_dead_server_never_passes_as_not_informative() -> None:
    base = result([False] * 100)
    cand = result([False] * 100, errors=100)
    v = compare_results(base, cand, max_drop_points=1.0)
    assert not v.passed
    assert v.reason.startswith(
        "candidate: 100 of 100 requests failed (first: HTTP 500: boom), "
        "counted as wrong; not informative"
    )
    assert "passed" not in v.reason  # was "FAILED ...: passed, but the gate is not informative"


def test_errors_are_reported_on_an_informative_pass() -> None:
    base = result([True] * 80 + [False] * 20)
    cand = result([False] + [True] * 79 + [False] * 20, errors=1)
    v = compare_results(base, cand, max_drop_points=2.0)
    assert v.passed
    assert v.reason.endswith(
        "candidate: 1 of 100 requests failed (first: HTTP 500: boom), counted as wrong"
    )


def test_verdict_is_frozen() -> None:
    v = compare_paired([True], [True], max_drop_points=1.0)
    assert isinstance(v, AccuracyVerdict)
    with pytest.raises(AttributeError):
        v.passed = False  # type: ignore[misc]
