"""What a workload's lengths are: chat-mix quantiles, scaling and clipping, replay files.

The spec loader validates workloads with these at pytest start-up; turning a workload into
concrete requests (prompts, arrival times) is the load generator's part: ``load/requests.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.errors import UsageError

#: chat-mix-v1 length quantiles: (median, p90) for input and output tokens.
CHAT_MIX_V1 = {"input": (1024.0, 4096.0), "output": (256.0, 1024.0)}
Z_090 = 1.2815515655446004  # standard normal 0.9 quantile


@dataclass(frozen=True)
class ReplayRow:
    """One validated line of a replay trace; ``arrival_s`` is relative to the first request."""

    line: int
    arrival_s: float
    input_tokens: int
    output_tokens: int


def lognormal_params(median: float, p90: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal whose median and 90th percentile are the given values."""
    return math.log(median), math.log(p90 / median) / Z_090


def scaled_length(n: int, scale: float, clip: int | None) -> int:
    """A length after ``workload.scale`` and the optional max clip, never below 1."""
    out = max(1, round(n * scale))
    return min(out, clip) if clip is not None else out


def fit_to_context(inp: int, out: int, max_model_len: int) -> tuple[int, int]:
    """Clip so input + output <= max_model_len, shrinking the longer side first."""
    if inp + out <= max_model_len:
        return inp, out
    out = max(1, min(out, max(max_model_len - inp, max_model_len // 2)))
    return max(1, min(inp, max_model_len - out)), out


def _replay_error(path: Path, line: int, what: str, value: object, problem: str) -> UsageError:
    fix = (
        "each line must be a JSON object with arrival_s (or timestamp), input_tokens, output_tokens"
    )
    return UsageError(f"{path}:{line}", what, value, problem, fix)


def read_replay(path: Path) -> list[ReplayRow]:
    """Parse and validate a JSONL trace; errors name the file and line."""
    rows: list[ReplayRow] = []
    first: float | None = None
    prev = -math.inf
    text = path.read_text(encoding="utf-8")
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj: Any = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _replay_error(path, lineno, "line", raw[:80], f"not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise _replay_error(path, lineno, "line", raw[:80], "not a JSON object")
        key = "arrival_s" if "arrival_s" in obj else "timestamp"
        t = obj.get(key)
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise _replay_error(path, lineno, key, t, "missing or not a finite number")
        if t < prev:
            raise _replay_error(path, lineno, key, t, f"goes back in time (previous {prev})")
        prev = t
        lengths = []
        for name in ("input_tokens", "output_tokens"):
            v = obj.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _replay_error(path, lineno, name, v, "missing or not an integer >= 1")
            lengths.append(v)
        if first is None:
            first = float(t)
        rows.append(ReplayRow(lineno, float(t) - first, lengths[0], lengths[1]))
    if not rows:
        raise _replay_error(path, 1, "trace", str(path), "has no requests")
    return rows
