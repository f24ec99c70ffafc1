"""Whether an accuracy run can gate anything: failed requests, and scores near zero.

A run whose requests all failed (a prompt longer than the server's context, HTTP 400) scores
0.000, exactly like a model that cannot do gsm8k; stored as a baseline it made every later gate
"pass, but not informative". So the server's own error is shown with the count, and a refresh
from such a run, or from any near-zero run the marker does not allow, is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_moeperf.markers import AccuracyGate

#: Below this accuracy on both sides the paired gate cannot see a drop (``compare_paired``).
NEAR_ZERO = 0.05
ALLOW_HINT = "allow_uninformative=True"


def server_message(error: str, limit: int = 300) -> str:
    """``HTTP 400: {"message": ...}`` -> ``HTTP 400: <message>``: vLLM's JSON error body
    (``{"message"}`` or ``{"error": {"message"}}``) read down to the sentence that says why."""
    head, sep, body = error.partition(": ")
    if sep and head.startswith("HTTP "):
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        inner = data.get("error", data) if isinstance(data, dict) else None
        message = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(message, str) and message.strip():
            error = f"{head}: {message.strip()}"
    error = " ".join(error.split())  # one line
    return error if len(error) <= limit else error[: limit - 3] + "..."


def request_errors(rows: Sequence[Mapping[str, Any]] | Sequence[Any]) -> str | None:
    """The line "N of M requests failed (first: <server message>)", or None when none failed.

    ``rows`` are the per-question outcomes, as ``QuestionOutcome`` or as their dicts."""
    errors = [e for r in rows if (e := (r.get("error") if isinstance(r, Mapping)
                                        else getattr(r, "error", None)))]  # fmt: skip
    if not errors:
        return None
    return f"{len(errors)} of {len(rows)} requests failed (first: {server_message(str(errors[0]))})"


def refresh_refusal(accuracy: Mapping[str, Any], gate: AccuracyGate) -> str | None:
    """Why this accuracy run must not become a baseline (one line with the fix), or None."""
    rows = accuracy.get("per_question") or []
    failed = request_errors(rows)
    if failed:
        return (f"accuracy ({gate.source}): gsm8k: {failed}, so this run is no accuracy "
                "baseline; baseline not written. Fix: make the server answer every question "
                "(the first error says why, e.g. a max_model_len too short for the prompts), "
                "then refresh again")  # fmt: skip
    flexible, strict = float(accuracy["flexible_extract"]), float(accuracy["strict_match"])
    if flexible < NEAR_ZERO and not getattr(gate, "allow_uninformative", False):
        return (f"accuracy ({gate.source}): gsm8k scored flexible {flexible:.1%}, strict "
                f"{strict:.1%} (below {NEAR_ZERO:.0%}), so a baseline from it could never show "
                "a drop; baseline not written. Fix: find why the model scores near zero, or "
                f"pass {ALLOW_HINT} to the marker for a model that cannot do gsm8k (random "
                "weights)")  # fmt: skip
    return None
