"""Accuracy gate: gsm8k n-shot against the server, compared per question with a baseline.

Kept import-light (no httpx, numpy or scipy at import) because the plugin imports it at pytest
start-up; the heavy modules are imported inside the functions that run the task or the test.
"""

from pytest_moeperf.accuracy.gsm8k import (
    STOP_SEQUENCES,
    Doc,
    build_prompt,
    extract_flexible,
    extract_strict,
    fewshot_sets,
    load_split,
    normalize,
    run_gsm8k,
    run_gsm8k_async,
    score,
)
from pytest_moeperf.accuracy.paired import (
    AccuracyResult,
    AccuracyVerdict,
    QuestionOutcome,
    compare_paired,
    compare_results,
)

__all__ = [
    "STOP_SEQUENCES",
    "AccuracyResult",
    "AccuracyVerdict",
    "Doc",
    "QuestionOutcome",
    "build_prompt",
    "compare_paired",
    "compare_results",
    "extract_flexible",
    "extract_strict",
    "fewshot_sets",
    "load_split",
    "normalize",
    "run_gsm8k",
    "run_gsm8k_async",
    "score",
]
