"""Verdicts on repeated runs: baseline against candidate, one metric at a time.

Importing this package is cheap (no numpy or scipy at import time), so the pytest plugin may
import it at start-up.
"""

from pytest_moeperf.verdict.metrics import (
    DEFAULT_METRICS,
    MetricSpec,
    generic_metrics,
    get_metric,
)
from pytest_moeperf.verdict.stats import (
    DEFAULT_BASELINE_RUNS,
    DEFAULT_CANDIDATE_RUNS,
    Outcome,
    Verdict,
    VerdictConfig,
    judge,
    judge_all,
    runs_needed,
    search_resolution,
)

__all__ = [
    "DEFAULT_BASELINE_RUNS",
    "DEFAULT_CANDIDATE_RUNS",
    "DEFAULT_METRICS",
    "MetricSpec",
    "Outcome",
    "Verdict",
    "VerdictConfig",
    "generic_metrics",
    "get_metric",
    "judge",
    "judge_all",
    "runs_needed",
    "search_resolution",
]
