"""An accuracy run that cannot gate anything never becomes a baseline, nor passes unnoticed.

A run whose requests failed (prompt longer than the context: HTTP 400) scores 0.000, like a model
that cannot do gsm8k; stored as a baseline it made every later gate "pass, not informative".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from baseline_helpers import PROV, make_key

from pytest_moeperf import gates
from pytest_moeperf.accuracy import AccuracyResult, QuestionOutcome
from pytest_moeperf.accuracy.health import (
    ALLOW_HINT,
    refresh_refusal,
    request_errors,
    server_message,
)
from pytest_moeperf.baseline import Baseline, BaselineStore
from pytest_moeperf.markers import AccuracyGate

SOURCE = "marker @pytest.mark.moeperf_accuracy on t.py:3"
GATE = AccuracyGate("gsm8k", 5, 1.0, None, SOURCE)
ALLOWING = AccuracyGate("gsm8k", 5, 1.0, None, SOURCE, allow_uninformative=True)
VLLM_400 = (
    'HTTP 400: {"object":"error","message":"This model\'s maximum context length is 1024 tokens. '
    'However, you requested 1290 tokens (1034 in the messages, 256 in the completion).",'
    '"type":"BadRequestError","param":null,"code":400}'
)


def accuracy(correct: int, n: int = 100, errors: int = 0, error: str = "HTTP 500: boom") -> Any:
    """A gsm8k result: the first ``correct`` right, the last ``errors`` failed requests."""
    rows = [
        QuestionOutcome(
            i, i < correct, i < correct, "1", "1", "1", error=error if i >= n - errors else None
        )
        for i in range(n)
    ]
    result = AccuracyResult.from_outcomes(rows, task="gsm8k", shots=5, limit=None, seed=1234,
                                          model="m", data_digest="d0", duration_s=1.0)  # fmt: skip
    return result.to_dict()


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (VLLM_400, "HTTP 400: This model's maximum context length is 1024 tokens. However, you "
                   "requested 1290 tokens (1034 in the messages, 256 in the completion)."),
        ('HTTP 500: {"error": {"message": "engine dead"}}', "HTTP 500: engine dead"),
        ("HTTP 502: <html>bad gateway</html>", "HTTP 502: <html>bad gateway</html>"),
        ("connection reset\nby peer", "connection reset by peer"),
        ('HTTP 400: {"message": "  "}', 'HTTP 400: {"message": " "}'),
    ],
)  # fmt: skip
def test_server_message_reads_vllm_error_bodies(raw: str, shown: str) -> None:
    assert server_message(raw) == shown


def test_server_message_is_cut_to_one_short_line() -> None:
    text = server_message("HTTP 500: " + "x" * 1000, limit=50)
    assert len(text) == 50 and text.endswith("...") and "\n" not in text


def test_request_errors_counts_and_names_the_first() -> None:
    assert request_errors([]) is None
    assert request_errors(accuracy(10)["per_question"]) is None
    rows = accuracy(0, n=20, errors=20, error=VLLM_400)["per_question"]
    assert request_errors(rows) == (
        "20 of 20 requests failed (first: HTTP 400: This model's maximum context length is 1024 "
        "tokens. However, you requested 1290 tokens (1034 in the messages, 256 in the "
        "completion).)"
    )
    outcomes = [QuestionOutcome(0, False, False, "", "", "1", error="HTTP 500: boom"),
                QuestionOutcome(1, True, True, "1", "1", "1")]  # fmt: skip
    assert request_errors(outcomes) == "1 of 2 requests failed (first: HTTP 500: boom)"


def test_refresh_refused_when_requests_failed_even_if_allowed() -> None:
    why = refresh_refusal(accuracy(0, n=20, errors=20, error=VLLM_400), ALLOWING)
    assert why is not None
    assert why.startswith(f"accuracy ({SOURCE}): gsm8k: 20 of 20 requests failed (first: HTTP "
                          "400: This model's maximum context length is 1024 tokens.")  # fmt: skip
    assert "baseline not written. Fix: make the server answer every question" in why


def test_refresh_refused_near_zero_unless_the_marker_allows() -> None:
    why = refresh_refusal(accuracy(2), GATE)
    assert why is not None
    assert "gsm8k scored flexible 2.0%, strict 2.0% (below 5%)" in why
    assert ALLOW_HINT in why
    assert refresh_refusal(accuracy(2), ALLOWING) is None
    assert refresh_refusal(accuracy(60), GATE) is None  # informative: a baseline


def _store(tmp_path: Path, acc: dict[str, Any]) -> BaselineStore:
    store = BaselineStore(tmp_path)
    base = Baseline("t.py::t", make_key(), {"slo_goodput_tok_s": [1.0, 1.0, 1.0]},
                    [{"run": i} for i in range(3)], PROV, accuracy=acc)  # fmt: skip
    store.write(base, complete=True)
    return store


def _gate(store: BaselineStore, acc: dict[str, Any], gate: AccuracyGate) -> Any:
    return gates.compare(store, "t.py::t", make_key(), {"slo_goodput_tok_s": [1.0, 1.0, 1.0]},
                         allow_other_hardware=False, ci_mode=False, target="t.py",
                         accuracy=acc, accuracy_gate=gate)  # fmt: skip


def test_near_zero_on_both_sides_fails_the_gate_unless_allowed(tmp_path: Path) -> None:
    store = _store(tmp_path, accuracy(1))
    out = _gate(store, accuracy(2), GATE)
    assert out.accuracy is not None and not out.accuracy["passed"]
    (failure,) = [f for f in out.failures if f.startswith("accuracy gate")]
    assert failure.startswith(f"accuracy gate ({SOURCE}): not informative: accuracy near zero")
    assert failure.endswith(f"or pass {ALLOW_HINT} to the marker for a model that cannot do gsm8k")
    allowed = _gate(store, accuracy(2), ALLOWING)
    assert allowed.accuracy is not None and allowed.accuracy["passed"]
    assert allowed.accuracy["reason"].endswith(f"allowed by {ALLOW_HINT}")
    assert not [f for f in allowed.failures if f.startswith("accuracy gate")]


def test_a_dead_server_never_passes_even_when_allowed(tmp_path: Path) -> None:
    store = _store(tmp_path, accuracy(1))
    out = _gate(store, accuracy(0, errors=100), ALLOWING)
    assert out.accuracy is not None and not out.accuracy["passed"]
    assert "candidate: 100 of 100 requests failed (first: HTTP 500: boom)" in out.accuracy["reason"]


def test_marker_allow_uninformative_must_be_a_bool(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="import pytest\n\n@pytest.mark.moeperf_accuracy('gsm8k', "
        "allow_uninformative='yes')\ndef test_it(request):\n"
        "    from pytest_moeperf.markers import accuracy_gate\n"
        "    accuracy_gate(request.node)\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # the marker is read before the test runs
    result.stdout.fnmatch_lines(["*allow_uninformative = 'yes': must be True or False*"])
    assert json.dumps("Traceback") not in result.stdout.str()
