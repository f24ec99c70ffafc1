"""gsm8k n-shot against a vLLM server, prompt- and score-compatible with lm-eval's ``gsm8k`` task.

Why not call lm-eval: the plugin must run offline, without torch or ``datasets``, and it must keep
the outcome of every question so that a baseline and a candidate can be compared pair by pair
(see ``paired.py``). The prompt, exemplar sampling, stop sequences, filters and normalisation follow
lm-eval's ``gsm8k.yaml`` (version 3); docs/accuracy.md lists the few deliberate differences.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import hashlib
import json
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_moeperf.accuracy.paired import AccuracyResult, QuestionOutcome
from pytest_moeperf.errors import UsageError

if TYPE_CHECKING:
    from pytest_moeperf.load.client import StreamingClient

TASK = "gsm8k"
DATA_DIR = Path(__file__).parent / "data"
STOP_SEQUENCES: tuple[str, ...] = ("Question:", "</s>", "<|im_end|>")
FEWSHOT_DELIMITER = "\n\n"
TARGET_DELIMITER = " "
STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
INVALID = "[invalid]"
# lm-eval's exact_match(regexes_to_ignore=..., ignore_case=True), applied to both sides in order.
_IGNORE = tuple(re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$"))


@dataclass(frozen=True)
class Doc:
    """One gsm8k item: the question and the full worked answer ending in ``#### N``."""

    question: str
    answer: str


# --- data -------------------------------------------------------------------------------------


def _split_file(split: str, path: Path | None) -> Path:
    """Find ``<split>.jsonl.gz`` or ``<split>.jsonl`` in the shipped data or in ``path``."""
    folder = DATA_DIR if path is None else Path(path)
    if not folder.is_dir():
        raise UsageError(
            "--moeperf-gsm8k-path",
            "path",
            str(folder),
            "is not a directory",
            "point it at a folder holding test.jsonl[.gz] and train.jsonl[.gz]",
        )
    for name in (f"{split}.jsonl.gz", f"{split}.jsonl"):
        if (folder / name).is_file():
            return folder / name
    raise UsageError(
        "--moeperf-gsm8k-path",
        "path",
        str(folder),
        f"holds neither {split}.jsonl.gz nor {split}.jsonl",
        f"add the gsm8k {split} split there (fields question, answer with '#### N')",
    )


def load_split(split: str, path: Path | None = None) -> list[Doc]:
    """Load the ``train`` or ``test`` split, checking every line so bad data fails by name."""
    if split not in ("train", "test"):
        raise UsageError("load_split", "split", split, "is not a gsm8k split", "use train or test")
    file = _split_file(split, path)
    opener = gzip.open if file.suffix == ".gz" else open
    docs: list[Doc] = []
    with opener(file, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{file}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(
                    where,
                    "line",
                    line[:80],
                    f"is not JSON ({exc.msg})",
                    "write one JSON object per line",
                ) from exc
            if not isinstance(row, dict):
                raise UsageError(
                    where,
                    "line",
                    line[:80],
                    "is not a JSON object",
                    "write one object with fields question and answer per line",
                )
            question, answer = row.get("question"), row.get("answer")
            if not isinstance(question, str) or not question:
                raise UsageError(
                    where,
                    "question",
                    question,
                    "is missing or not a string",
                    "give every line a non-empty 'question' string",
                )
            if not isinstance(answer, str) or STRICT_PATTERN.search(answer) is None:
                raise UsageError(
                    where,
                    "answer",
                    answer,
                    "has no '#### N' final answer",
                    "end every answer with '#### <number>' as gsm8k does",
                )
            docs.append(Doc(question, answer))
    if not docs:
        raise UsageError(
            str(file),
            "file",
            str(file),
            "holds no questions",
            "use the gsm8k split files, one JSON object per line",
        )
    return docs


@functools.lru_cache(maxsize=4)
def questions_in_test_split(path: Path | None = None) -> tuple[Path, int]:
    """(file, question count) of the test split: a marker's ``limit`` is checked against it
    when the marker is read, not after the measurement."""
    return _split_file("test", path), len(load_split("test", path))


def data_digest(train: Sequence[Doc], test: Sequence[Doc]) -> str:
    """Short fingerprint of the data, so results from different question sets are never paired."""
    h = hashlib.sha256()
    for doc in (*train, *test):
        h.update(doc.question.encode())
        h.update(b"\0")
        h.update(doc.answer.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


# --- prompts ----------------------------------------------------------------------------------


def fewshot_sets(
    train: Sequence[Doc], questions: Sequence[Doc], shots: int, seed: int = 1234
) -> list[list[Doc]]:
    """Exemplars for each question, drawn like lm-eval's default ContextSampler.

    One ``random.Random(seed)`` is shared by all questions, in order, each taking
    ``rnd.sample(train, shots)``; so the first K questions get the same exemplars whatever the
    limit. An exemplar whose question equals the one asked (possible only with custom data) is
    dropped and replaced by a draw from the rest, so a prompt never contains its own answer.
    """
    if not 0 <= shots < len(train):
        raise UsageError(
            "gsm8k",
            "shots",
            shots,
            f"must be in 0..{len(train) - 1}",
            "use 5 (lm-eval's default) or another count smaller than the train split",
        )
    rnd = random.Random(seed)
    out: list[list[Doc]] = []
    for doc in questions:
        chosen = [x for x in rnd.sample(list(train), shots) if x.question != doc.question]
        if len(chosen) < shots:
            pool = [x for x in train if x.question != doc.question and x not in chosen]
            if len(pool) < shots - len(chosen):
                raise UsageError(
                    "gsm8k",
                    "shots",
                    shots,
                    f"exceeds the train items that differ from {doc.question!r}",
                    "use fewer shots or a larger train split",
                )
            chosen += rnd.sample(pool, shots - len(chosen))
        out.append(chosen)
    return out


def doc_to_text(doc: Doc) -> str:
    return f"Question: {doc.question}\nAnswer:"


def build_prompt(exemplars: Sequence[Doc], doc: Doc) -> str:
    """lm-eval's context: (text, " ", full answer, "\n\n") per exemplar, then the question."""
    parts = [doc_to_text(x) + TARGET_DELIMITER + x.answer + FEWSHOT_DELIMITER for x in exemplars]
    return "".join(parts) + doc_to_text(doc)


# --- scoring ----------------------------------------------------------------------------------


def normalize(text: str) -> str:
    """lm-eval exact_match rules: drop ``,``, ``$``, all up to ``#### ``, a final ``.``; lower."""
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def _find(pattern: re.Pattern[str], text: str, select: int) -> str:
    """lm-eval's RegexFilter: pick match ``select``, the first non-empty group, else INVALID."""
    matches = pattern.findall(text)
    if not matches:
        return INVALID
    match = matches[select]
    if isinstance(match, tuple):
        groups = [m for m in match if m]
        match = groups[0] if groups else INVALID
    return str(match).strip()


def extract_strict(completion: str) -> str:
    """strict-match: the first ``#### N`` in the completion."""
    return _find(STRICT_PATTERN, completion, 0)


def extract_flexible(completion: str) -> str:
    """flexible-extract: the last number-looking token in the completion."""
    return _find(FLEXIBLE_PATTERN, completion, -1)


def truncate_at_stop(text: str, stop: Sequence[str] = STOP_SEQUENCES) -> str:
    """Cut at the first stop sequence, in case a server returns text past it."""
    for s in stop:
        text = text.split(s, 1)[0]
    return text


def score(index: int, completion: str, answer: str, error: str | None = None) -> QuestionOutcome:
    """Score one completion against a gsm8k answer; a request error is never correct."""
    target = normalize(answer)
    strict = extract_strict(completion)
    flexible = extract_flexible(completion)
    ok = error is None
    return QuestionOutcome(
        index=index,
        strict_correct=ok and normalize(strict) == target,
        flexible_correct=ok and normalize(flexible) == target,
        extracted_strict=strict,
        extracted_flexible=flexible,
        target=target,
        error=error,
        completion=completion,
    )


# --- running ----------------------------------------------------------------------------------


def _check_args(
    base_url: str,
    limit: int | None,
    concurrency: int,
    max_tokens: int,
    timeout_s: float,
    n_test: int,
) -> None:
    from pytest_moeperf.load.client import parse_base_url

    src = "run_gsm8k"
    parse_base_url(base_url, src)
    if limit is not None and not 1 <= limit <= n_test:
        raise UsageError(
            src,
            "limit",
            limit,
            f"must be in 1..{n_test} (the test split size)",
            "pass a smaller limit, or None for all questions",
        )
    if concurrency < 1:
        raise UsageError(src, "concurrency", concurrency, "must be >= 1", "use e.g. 16")
    if max_tokens < 1:
        raise UsageError(src, "max_tokens", max_tokens, "must be >= 1", "use 256 as lm-eval does")
    if not timeout_s > 0:
        raise UsageError(src, "timeout_s", timeout_s, "must be > 0", "use e.g. 300")


async def _complete(
    client: StreamingClient, index: int, payload: bytes, max_tokens: int
) -> tuple[str, str | None]:
    """One streamed completion through the load client: (text, None) or ("", error message)."""
    from pytest_moeperf.load.client import chunk_text
    from pytest_moeperf.load.records import RequestSpec

    texts: list[bytes] = []
    rec = await client.send(RequestSpec(index, 0.0, (), max_tokens), 0.0, payload, texts=texts)
    if not rec.ok:
        return "", rec.error or rec.status
    try:
        return truncate_at_stop(chunk_text(texts)), None
    except ValueError as exc:
        return "", f"malformed response: {exc}"


async def run_gsm8k_async(
    base_url: str,
    model: str,
    *,
    shots: int = 5,
    limit: int | None = None,
    seed: int = 1234,
    concurrency: int = 16,
    max_tokens: int = 256,
    data_path: Path | None = None,
    timeout_s: float = 300.0,
) -> AccuracyResult:
    """Ask the first ``limit`` test questions (all if None) greedily and score them.

    The requests go through the load generator's client (``StreamingClient``: keep-alive
    connections, streamed ``/v1/completions``), ``concurrency`` at a time, so the accuracy task
    exercises the server exactly the way the performance probes do.
    """
    from pytest_moeperf.load.client import StreamingClient

    test = load_split("test", data_path)
    train = load_split("train", data_path)
    _check_args(base_url, limit, concurrency, max_tokens, timeout_s, len(test))
    questions = test if limit is None else test[:limit]
    exemplars = fewshot_sets(train, questions, shots, seed)
    sem = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    client = StreamingClient(base_url, model, t0=start, request_timeout_s=timeout_s)

    async def ask(i: int) -> QuestionOutcome:
        payload = client.prepare_json(
            {
                "prompt": build_prompt(exemplars[i], questions[i]),
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stop": list(STOP_SEQUENCES),
            }
        )
        async with sem:
            text, error = await _complete(client, i, payload, max_tokens)
        return score(i, text, questions[i].answer, error)

    try:
        outcomes = await asyncio.gather(*(ask(i) for i in range(len(questions))))
    finally:
        client.close()
    return AccuracyResult.from_outcomes(
        list(outcomes),
        task=TASK,
        shots=shots,
        limit=limit,
        seed=seed,
        model=model,
        data_digest=data_digest(train, test),
        duration_s=time.perf_counter() - start,
    )


def run_gsm8k(
    base_url: str,
    model: str,
    *,
    shots: int = 5,
    limit: int | None = None,
    seed: int = 1234,
    concurrency: int = 16,
    max_tokens: int = 256,
    data_path: Path | None = None,
    timeout_s: float = 300.0,
) -> AccuracyResult:
    """Blocking wrapper of ``run_gsm8k_async`` (not for use inside a running event loop)."""
    return asyncio.run(
        run_gsm8k_async(
            base_url,
            model,
            shots=shots,
            limit=limit,
            seed=seed,
            concurrency=concurrency,
            max_tokens=max_tokens,
            data_path=data_path,
            timeout_s=timeout_s,
        )
    )
