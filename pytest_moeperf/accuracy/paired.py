"""Per-question accuracy outcomes, and the paired gate that compares a candidate to a baseline.

Why paired: baseline and candidate answer the *same* questions, so only the questions whose
outcome flipped carry information about a regression. An exact McNemar test on those discordant
pairs is far more sensitive than comparing two percentages, each of which has a standard error
of about 1.1 points at 80 % on gsm8k's 1,319 questions. docs/accuracy.md explains the rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pytest_moeperf.errors import UsageError

METRICS = ("strict_match", "flexible_extract")


@dataclass
class QuestionOutcome:
    """How one question went; ``completion`` is kept in memory for reports, not in baselines."""

    index: int
    strict_correct: bool
    flexible_correct: bool
    extracted_strict: str
    extracted_flexible: str
    target: str
    error: str | None = None
    completion: str = ""


_OUTCOME_TYPES: dict[str, tuple[type, ...]] = {
    "index": (int,),
    "strict_correct": (bool,),
    "flexible_correct": (bool,),
    "extracted_strict": (str,),
    "extracted_flexible": (str,),
    "target": (str,),
    "error": (str, type(None)),
}


@dataclass
class AccuracyResult:
    """One gsm8k run: the two lm-eval metrics plus every question's outcome, for pairing."""

    task: str
    shots: int
    n: int
    limit: int | None
    strict_match: float
    flexible_extract: float
    per_question: list[QuestionOutcome] = field(default_factory=list)
    errors: int = 0
    seed: int = 1234
    model: str = ""
    data_digest: str = ""
    duration_s: float = 0.0

    @classmethod
    def from_outcomes(cls, outcomes: list[QuestionOutcome], **meta: Any) -> AccuracyResult:
        n = len(outcomes)
        return cls(
            n=n,
            strict_match=sum(o.strict_correct for o in outcomes) / n if n else 0.0,
            flexible_extract=sum(o.flexible_correct for o in outcomes) / n if n else 0.0,
            per_question=outcomes,
            errors=sum(o.error is not None for o in outcomes),
            **meta,
        )

    def correct(self, metric: str) -> list[bool]:
        """Per-question correctness for ``strict_match`` or ``flexible_extract``."""
        if metric == "strict_match":
            return [o.strict_correct for o in self.per_question]
        if metric == "flexible_extract":
            return [o.flexible_correct for o in self.per_question]
        raise UsageError(
            "accuracy gate",
            "metric",
            metric,
            "is not a gsm8k metric",
            "use strict_match or flexible_extract",
        )

    def to_dict(self, with_completions: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_completions:
            for row in data["per_question"]:
                row.pop("completion")
        return data

    @classmethod
    def from_dict(cls, data: object, source: str = "baseline") -> AccuracyResult:
        """Rebuild a stored result, naming the bad field and its file (``source``) on error."""
        fix = "re-record the accuracy baseline with this plugin version"
        if not isinstance(data, dict):
            raise UsageError(source, "accuracy", data, "is not a mapping", fix)
        rows = data.get("per_question")
        if not isinstance(rows, list):
            raise UsageError(source, "accuracy.per_question", rows, "is not a list", fix)
        outcomes = []
        for k, row in enumerate(rows):
            if not isinstance(row, dict):
                raise UsageError(
                    source, f"accuracy.per_question[{k}]", row, "is not a mapping", fix
                )
            for key, types in _OUTCOME_TYPES.items():
                if not isinstance(row.get(key), types) or (key == "index" and row[key] is True):
                    raise UsageError(
                        source,
                        f"accuracy.per_question[{k}].{key}",
                        row.get(key),
                        "is missing or of the wrong type",
                        fix,
                    )
            outcomes.append(
                QuestionOutcome(
                    **{key: row[key] for key in _OUTCOME_TYPES},
                    completion=str(row.get("completion", "")),
                )
            )
        meta = {
            key: data.get(key)
            for key in ("task", "shots", "limit", "seed", "model", "data_digest", "duration_s")
        }
        for key, types in (
            ("task", (str,)),
            ("shots", (int,)),
            ("limit", (int, type(None))),
            ("seed", (int,)),
            ("model", (str,)),
            ("data_digest", (str,)),
            ("duration_s", (int, float)),
        ):
            if not isinstance(meta[key], types) or isinstance(meta[key], bool):
                raise UsageError(
                    source, f"accuracy.{key}", meta[key], "is missing or of the wrong type", fix
                )
        result = cls.from_outcomes(outcomes, **meta)
        for key in ("n", "errors", "strict_match", "flexible_extract"):
            stored = data.get(key)
            if not isinstance(stored, (int, float)) or abs(stored - getattr(result, key)) > 1e-9:
                raise UsageError(
                    source,
                    f"accuracy.{key}",
                    stored,
                    f"does not match per_question (which gives {getattr(result, key)})",
                    "do not edit baseline files by hand; " + fix,
                )
        return result


@dataclass(frozen=True)
class AccuracyVerdict:
    """The gate's decision; ``delta_points`` and ``ci`` are candidate minus baseline, in points."""

    passed: bool
    baseline_acc: float
    candidate_acc: float
    delta_points: float
    p_value: float
    ci: tuple[float, float]
    n: int
    discordant: tuple[int, int]
    reason: str
    max_drop_points: float = 0.0
    alpha: float = 0.05
    informative: bool = True
    metric: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ci"] = list(self.ci)
        data["discordant"] = list(self.discordant)
        return data


def _as_bools(values: Sequence[object], source: str) -> list[bool]:
    out = []
    for k, v in enumerate(values):
        if not isinstance(v, bool) and v not in (0, 1):
            raise UsageError(
                source,
                f"outcome[{k}]",
                v,
                "is not a correct/incorrect flag",
                "pass one bool per question",
            )
        out.append(bool(v))
    return out


def _check_ids(
    base_ids: Sequence[int], cand_ids: Sequence[int], n: int, base_src: str, cand_src: str
) -> None:
    for src, ids in ((base_src, base_ids), (cand_src, cand_ids)):
        if len(ids) != n:
            raise UsageError(
                src,
                "question ids",
                len(ids),
                f"count differs from the {n} outcomes",
                "pass one id per outcome",
            )
    for k, (a, b) in enumerate(zip(base_ids, cand_ids, strict=True)):
        if a != b:
            raise UsageError(
                cand_src,
                f"question id at position {k}",
                b,
                f"differs from {base_src} (which has {a})",
                "run both on the same questions: same data, same --limit",
            )


def _bootstrap_ci(
    n: int, lost: int, gained: int, alpha: float, n_boot: int, seed: int
) -> tuple[float, float]:
    """Paired bootstrap of the delta: resampling questions is a multinomial over (-1, +1, 0)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, [lost / n, gained / n, (n - lost - gained) / n], size=n_boot)
    deltas = (counts[:, 1] - counts[:, 0]) * (100.0 / n)
    lo, hi = np.quantile(deltas, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def compare_paired(
    baseline: Sequence[bool],
    candidate: Sequence[bool],
    *,
    max_drop_points: float,
    alpha: float = 0.05,
    baseline_ids: Sequence[int] | None = None,
    candidate_ids: Sequence[int] | None = None,
    baseline_source: str = "baseline",
    candidate_source: str = "candidate",
    near_zero: float = 0.05,
    n_boot: int = 10_000,
    seed: int = 0,
) -> AccuracyVerdict:
    """Gate on per-question outcomes: FAIL only if the drop exceeds the tolerance *and* is real.

    Real means the exact two-sided McNemar test on the discordant pairs rejects "no change" at
    ``alpha``. When both accuracies are below ``near_zero`` the gate passes as not informative.
    """
    src = "accuracy gate"
    if not (math.isfinite(max_drop_points) and max_drop_points >= 0):
        raise UsageError(
            src,
            "max_drop_points",
            max_drop_points,
            "must be a finite number >= 0",
            "give the tolerated drop in accuracy points, e.g. 2.0",
        )
    if not 0 < alpha < 1:
        raise UsageError(src, "alpha", alpha, "must be in (0, 1)", "use 0.05")
    if not 0 <= near_zero < 1:
        raise UsageError(src, "near_zero", near_zero, "must be in [0, 1)", "use 0.05")
    if n_boot < 100:
        raise UsageError(src, "n_boot", n_boot, "is too few resamples", "use 10000")
    base = _as_bools(baseline, baseline_source)
    cand = _as_bools(candidate, candidate_source)
    if len(base) != len(cand):
        raise UsageError(
            candidate_source,
            "number of questions",
            len(cand),
            f"differs from {baseline_source} ({len(base)})",
            "run both on the same questions: same data, same --limit",
        )
    n = len(base)
    if n == 0:
        raise UsageError(
            baseline_source,
            "number of questions",
            0,
            "nothing to compare",
            "run at least one question",
        )
    if baseline_ids is not None or candidate_ids is not None:
        _check_ids(baseline_ids or [], candidate_ids or [], n, baseline_source, candidate_source)

    from scipy.stats import binomtest

    lost = sum(x and not y for x, y in zip(base, cand, strict=True))
    gained = sum(y and not x for x, y in zip(base, cand, strict=True))
    base_acc, cand_acc = sum(base) / n, sum(cand) / n
    delta = 100.0 * (cand_acc - base_acc)
    p = float(binomtest(lost, lost + gained, 0.5).pvalue) if lost + gained else 1.0
    ci = _bootstrap_ci(n, lost, gained, alpha, n_boot, seed)
    drop = -delta
    what = (
        f"{base_acc:.1%} -> {cand_acc:.1%} on {n} questions, {lost} lost / {gained} gained, "
        f"McNemar p={p:.3g}, {1 - alpha:.0%} CI of delta [{ci[0]:+.1f}, {ci[1]:+.1f}] points"
    )
    informative = max(base_acc, cand_acc) >= near_zero
    if not informative:
        passed = True
        reason = (  # the caller decides whether that may pass (allow_uninformative)
            f"not informative: accuracy near zero on both sides ({base_acc:.1%} and "
            f"{cand_acc:.1%}, both < {near_zero:.0%}), so a drop cannot be seen ({what})"
        )
    elif drop > max_drop_points and p < alpha:
        passed = False
        reason = (
            f"accuracy dropped {drop:.1f} points, more than the {max_drop_points:g} allowed,"
            f" and the drop is significant ({what})"
        )
    elif drop > max_drop_points:
        passed = True
        reason = (
            f"drop of {drop:.1f} points exceeds {max_drop_points:g} but is not significant"
            f" at alpha={alpha:g}; more questions would tell ({what})"
        )
    else:
        passed = True
        reason = f"within tolerance: drop allowed {max_drop_points:g} points ({what})"
    return AccuracyVerdict(
        passed=passed,
        baseline_acc=base_acc,
        candidate_acc=cand_acc,
        delta_points=delta,
        p_value=p,
        ci=ci,
        n=n,
        discordant=(lost, gained),
        reason=reason,
        max_drop_points=max_drop_points,
        alpha=alpha,
        informative=informative,
    )


def compare_results(
    baseline: AccuracyResult,
    candidate: AccuracyResult,
    *,
    max_drop_points: float,
    metric: str = "flexible_extract",
    alpha: float = 0.05,
    baseline_source: str = "baseline",
    candidate_source: str = "candidate",
    near_zero: float = 0.05,
) -> AccuracyVerdict:
    """Gate two stored runs; refuses to pair runs whose prompts or questions differ.

    A candidate with request errors never passes as "not informative": a dead server also scores
    zero, and that must not look like a tiny model. A candidate on the first K questions of a
    longer baseline (a quick-mode ``limit``) is paired with those K: exemplars are drawn in
    question order, so the first K prompts are the same whatever the limit.
    """
    prefix_note = ""
    if candidate.n < baseline.n and [o.index for o in candidate.per_question] == [
        o.index for o in baseline.per_question[: candidate.n]
    ]:
        prefix_note = (
            f"compared on the first {candidate.n} of the baseline's {baseline.n} questions "
            f"(candidate limit {candidate.limit})"
        )
        baseline = AccuracyResult.from_outcomes(
            baseline.per_question[: candidate.n],
            task=baseline.task, shots=baseline.shots, limit=candidate.n, seed=baseline.seed,
            model=baseline.model, data_digest=baseline.data_digest,
        )  # fmt: skip
    for key in ("task", "shots", "seed", "data_digest"):
        a, b = getattr(baseline, key), getattr(candidate, key)
        if a != b:
            raise UsageError(
                candidate_source,
                f"accuracy.{key}",
                b,
                f"differs from {baseline_source} ({a!r}), so prompts are not paired",
                "re-record the accuracy baseline with the same task, shots, seed and data",
            )
    verdict = compare_paired(
        baseline.correct(metric),
        candidate.correct(metric),
        max_drop_points=max_drop_points,
        alpha=alpha,
        baseline_ids=[o.index for o in baseline.per_question],
        candidate_ids=[o.index for o in candidate.per_question],
        baseline_source=baseline_source,
        candidate_source=candidate_source,
        near_zero=near_zero,
    )
    verdict = replace(verdict, metric=metric)
    if prefix_note:
        verdict = replace(verdict, reason=f"{verdict.reason}; {prefix_note}")
    if candidate.errors:
        from pytest_moeperf.accuracy.health import request_errors

        note = f"candidate: {request_errors(candidate.per_question)}, counted as wrong"
        if not verdict.informative:  # a dead server scores zero too: never a pass
            return replace(verdict, passed=False, reason=f"{note}; {verdict.reason}")
        return replace(verdict, reason=f"{verdict.reason}; {note}")
    return verdict
