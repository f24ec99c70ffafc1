"""Tests for gsm8k data, lm-eval-compatible prompts and scoring, and the runner (fake server)."""

from __future__ import annotations

import gzip
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.accuracy.gsm8k import (
    INVALID,
    STOP_SEQUENCES,
    Doc,
    build_prompt,
    data_digest,
    extract_flexible,
    extract_strict,
    fewshot_sets,
    load_split,
    normalize,
    run_gsm8k,
    score,
    truncate_at_stop,
)
from pytest_moeperf.accuracy.paired import AccuracyResult
from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.requests import completions_url

# --- scoring -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "strict", "flexible"),
    [
        # Well-formed answers, as 5-shot models write them.
        ("She has 9 eggs.\n#### 18", "...\n#### 18", True, True),
        ("Total 1,000 + 234\n#### 1,234", "x\n#### 1234", True, True),
        ("So $18 per day.\n#### 18.", "x\n#### 18", True, True),
        ("He loses 10 points.\n#### -10", "x\n#### -10", True, True),
        ("Half of 5 is\n#### 2.5", "x\n#### 2.5", True, True),
        # No #### line: strict fails, flexible takes the last number (with $ and , removed).
        ("She makes $1,234 a day.", "x\n#### 1234", False, True),
        ("The temperature fell to -3", "x\n#### -3", False, True),
        ("It costs $18.", "x\n#### 18", False, True),
        # Wrong or missing answers.
        ("She makes 16 dollars.\n#### 16", "x\n#### 18", False, False),
        ("I do not know.", "x\n#### 18", False, False),
        ("", "x\n#### 18", False, False),
        # lm-eval compares strings, not numbers: 18.00 is not 18 (documented, kept for parity).
        ("#### 18.00", "x\n#### 18", False, False),
        # strict takes the first #### answer, flexible the last number.
        ("#### 5\nWait, no.\n#### 6", "x\n#### 5", True, False),
        ("#### 5\nWait, no.\n#### 6", "x\n#### 6", False, True),
    ],
)
def test_score_known_answers(completion: str, answer: str, strict: bool, flexible: bool) -> None:
    outcome = score(3, completion, answer)
    assert outcome.strict_correct is strict
    assert outcome.flexible_correct is flexible
    assert outcome.index == 3
    assert outcome.error is None


def test_extractors_return_lm_eval_strings() -> None:
    text = "He pays $1,200.50 for 3 items.\n#### 1,200.50"
    assert extract_strict(text) == "1,200.50"
    assert extract_flexible(text) == "1,200.50"
    assert extract_flexible("items: 3") == "3"
    assert extract_flexible("-7 degrees") == "-7"
    assert extract_flexible("paid $5, then 12.") == "12."
    assert extract_strict("the answer is 7") == INVALID
    assert extract_flexible("no digits here") == INVALID


def test_normalize_matches_lm_eval_regexes_to_ignore() -> None:
    assert normalize("Natalia sold 48.\n#### 72") == "72"
    assert normalize("$1,234.") == "1234"
    assert normalize("-3") == "-3"
    assert normalize("#### A") == "a"
    assert normalize(INVALID) == "[invalid]"


def test_error_is_never_correct() -> None:
    outcome = score(0, "#### 18", "x\n#### 18", error="HTTP 500: boom")
    assert not outcome.strict_correct and not outcome.flexible_correct
    assert outcome.error == "HTTP 500: boom"


def test_target_is_normalised_answer() -> None:
    assert score(0, "", "a\nb\n#### 1,000").target == "1000"


# --- prompts -------------------------------------------------------------------------------------


def test_prompt_is_byte_exact_for_known_exemplars() -> None:
    ex = [Doc("What is 1+1?", "1+1=<<1+1=2>>2\n#### 2"), Doc("Half of 8?", "8/2=4\n#### 4")]
    expected = (
        "Question: What is 1+1?\nAnswer: 1+1=<<1+1=2>>2\n#### 2\n\n"
        "Question: Half of 8?\nAnswer: 8/2=4\n#### 4\n\n"
        "Question: How many legs has a cat?\nAnswer:"
    )
    assert build_prompt(ex, Doc("How many legs has a cat?", "#### 4")) == expected


def test_zero_shot_prompt_is_the_question_alone() -> None:
    assert build_prompt([], Doc("Q?", "#### 1")) == "Question: Q?\nAnswer:"


def test_shipped_exemplars_follow_lm_eval_sampler() -> None:
    # lm-eval: one random.Random(1234) per task; rnd.sample(train_docs, 5) per test doc, in order.
    train, test = load_split("train"), load_split("test")
    rnd = random.Random(1234)
    expected = [rnd.sample(train, 5) for _ in range(3)]
    assert fewshot_sets(train, test[:3], 5, 1234) == expected
    prompt = build_prompt(expected[0], test[0])
    assert prompt.startswith(
        f"Question: {expected[0][0].question}\nAnswer: {expected[0][0].answer}"
    )
    assert prompt.endswith(f"\n\nQuestion: {test[0].question}\nAnswer:")
    assert prompt.count("Question: ") == 6


def small_docs(n: int, prefix: str) -> list[Doc]:
    return [Doc(f"{prefix} question {i}?", f"work {i}\n#### {i}") for i in range(n)]


def test_exemplars_are_deterministic_by_seed() -> None:
    train, test = small_docs(50, "train"), small_docs(20, "test")
    a = fewshot_sets(train, test, 5, seed=1)
    assert a == fewshot_sets(train, test, 5, seed=1)
    assert a != fewshot_sets(train, test, 5, seed=2)
    assert all(len(x) == 5 and len(set(x)) == 5 for x in a)


def test_exemplars_of_first_questions_do_not_depend_on_limit() -> None:
    train, test = small_docs(50, "train"), small_docs(20, "test")
    assert fewshot_sets(train, test[:4], 3, 9) == fewshot_sets(train, test, 3, 9)[:4]


def test_exemplars_never_include_the_question_asked() -> None:
    # Custom data where every test question also sits in train: it must never be its own exemplar.
    train = small_docs(8, "shared")
    for seed in range(200):
        sets = fewshot_sets(train, train, 5, seed)
        for doc, chosen in zip(train, sets, strict=True):
            assert doc not in chosen
            assert len(chosen) == 5 and len(set(chosen)) == 5


def test_train_full_of_the_asked_question_fails_instead_of_looping() -> None:
    train = [Doc("same?", "#### 1")] * 4 + small_docs(1, "other")
    with pytest.raises(UsageError, match="differ from 'same\\?'"):
        fewshot_sets(train, [Doc("same?", "#### 1")], 3, 1)


def test_truncate_at_stop_cuts_at_the_earliest_stop() -> None:
    assert truncate_at_stop("#### 4</s>junk\n\nQuestion: x") == "#### 4"
    assert truncate_at_stop("#### 4<|im_end|>") == "#### 4"
    assert truncate_at_stop("no stop here") == "no stop here"


@pytest.mark.parametrize("shots", [-1, 8, 9])
def test_bad_shots_fail(shots: int) -> None:
    with pytest.raises(UsageError, match="shots"):
        fewshot_sets(small_docs(8, "t"), small_docs(2, "q"), shots, 1)


# --- data ----------------------------------------------------------------------------------------


def test_shipped_data_is_complete() -> None:
    train, test = load_split("train"), load_split("test")
    assert (len(train), len(test)) == (7473, 1319)
    assert test[0].question.startswith("Janet")
    assert normalize(test[0].answer) == "18"
    license_text = (Path(__file__).parents[1] / "pytest_moeperf/accuracy/data/LICENSE").read_text()
    assert "MIT License" in license_text


def write_split(folder: Path, split: str, docs: list[Doc], gz: bool = False) -> None:
    lines = "".join(json.dumps({"question": d.question, "answer": d.answer}) + "\n" for d in docs)
    if gz:
        (folder / f"{split}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    else:
        (folder / f"{split}.jsonl").write_text(lines)


def test_custom_path_plain_and_gzip(tmp_path: Path) -> None:
    write_split(tmp_path, "test", small_docs(3, "t"))
    write_split(tmp_path, "train", small_docs(6, "tr"), gz=True)
    assert load_split("test", tmp_path) == small_docs(3, "t")
    assert load_split("train", tmp_path) == small_docs(6, "tr")


def test_digest_changes_with_data() -> None:
    a, b = small_docs(3, "a"), small_docs(3, "b")
    assert data_digest(a, b) == data_digest(list(a), list(b))
    assert data_digest(a, b) != data_digest(b, a)


def test_path_not_a_directory_fails(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a directory") as err:
        load_split("test", tmp_path / "nope")
    assert "--moeperf-gsm8k-path" in str(err.value)


def test_missing_split_file_fails(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"neither test\.jsonl\.gz nor test\.jsonl"):
        load_split("test", tmp_path)


def test_unknown_split_fails() -> None:
    with pytest.raises(UsageError, match="split"):
        load_split("validation")


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text('{"question": "a?", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(UsageError, match=r"test\.jsonl:2"):
        load_split("test", tmp_path)


def test_non_object_line_fails(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text("[1, 2]\n")
    with pytest.raises(UsageError, match="not a JSON object"):
        load_split("test", tmp_path)


def test_missing_question_fails(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text('{"answer": "#### 1"}\n')
    with pytest.raises(UsageError, match="question"):
        load_split("test", tmp_path)


def test_answer_without_final_marker_fails(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text('{"question": "a?", "answer": "it is 1"}\n')
    with pytest.raises(UsageError, match="####"):
        load_split("test", tmp_path)


def test_empty_file_fails(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="no questions"):
        load_split("test", tmp_path)


# --- runner against a fake /v1/completions server -------------------------------------------------

ANSWERS = {
    # question -> (completion the fake server returns, or an HTTP status to fail with)
    "test question 0?": "0 apples.\n#### 0",  # strict and flexible right
    "test question 1?": "So the answer is 1",  # flexible only
    "test question 2?": "#### 7\n\nQuestion: leaked next question 99",  # wrong; text past stop
    "test question 3?": 500,  # server error
    "test question 4?": "#### 4",
}


def split_text(text: str) -> list[str]:
    """Stream the reply the way vLLM does: a few characters per chunk, an empty one too."""
    return ["", *(text[i : i + 3] for i in range(0, len(text), 3))]


def sse_stream(texts: list[object]) -> bytes:
    """A streamed /v1/completions answer: content chunks, the usage chunk, [DONE]."""
    events = [{"id": "c", "choices": [{"index": 0, "text": t}]} for t in texts]
    events.append({"id": "c", "choices": [], "usage": {"completion_tokens": len(texts)}})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + b"data: [DONE]\n\n"


class FakeServer:
    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()


@pytest.fixture
def server() -> Iterator[tuple[str, FakeServer]]:
    state = FakeServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            with state.lock:
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with state.lock:
                    state.payloads.append({"path": self.path, **body})
                time.sleep(0.01)
                asked = body["prompt"].rsplit("Question: ", 1)[1].split("\n", 1)[0]
                reply = ANSWERS.get(asked, "garbage")
                if self.path != "/v1/completions":
                    self._send(404, b"not found")
                elif isinstance(reply, int):
                    self._send(reply, b'{"error": "boom"}')
                elif asked == "test question 5?":  # a chunk whose text is not a string
                    self._send(200, sse_stream([5]), "text/event-stream")
                else:
                    assert isinstance(reply, str)
                    self._send(200, sse_stream(split_text(reply)), "text/event-stream")
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _send(self, status: int, data: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_split(tmp_path, "test", small_docs(6, "test"))
    write_split(tmp_path, "train", small_docs(10, "train"))
    return tmp_path


def test_run_scores_each_question(server: tuple[str, FakeServer], data: Path) -> None:
    url, _ = server
    r = run_gsm8k(url, "tiny", shots=2, data_path=data, concurrency=4)
    got = [(o.index, o.strict_correct, o.flexible_correct) for o in r.per_question]
    assert got == [
        (0, True, True),
        (1, False, True),
        (2, False, False),
        (3, False, False),
        (4, True, True),
        (5, False, False),
    ]
    assert (r.n, r.errors, r.task, r.shots, r.limit) == (6, 2, "gsm8k", 2, None)
    assert r.strict_match == pytest.approx(2 / 6)
    assert r.flexible_extract == pytest.approx(3 / 6)
    assert r.per_question[2].completion == "#### 7\n\n"
    assert r.per_question[2].extracted_strict == "7"


def test_http_500_counts_as_error_and_incorrect(server: tuple[str, FakeServer], data: Path) -> None:
    url, _ = server
    r = run_gsm8k(url, "tiny", shots=2, data_path=data)
    bad = r.per_question[3]
    assert bad.error is not None and bad.error.startswith("HTTP 500")
    assert not bad.strict_correct and not bad.flexible_correct
    malformed = r.per_question[5]
    assert malformed.error is not None and "malformed response" in malformed.error


def test_request_carries_stop_sequences_and_greedy_settings(
    server: tuple[str, FakeServer], data: Path
) -> None:
    url, state = server
    run_gsm8k(url, "my-model", shots=2, limit=1, max_tokens=77, data_path=data)
    (p,) = state.payloads
    assert p["stop"] == ["Question:", "</s>", "<|im_end|>"] == list(STOP_SEQUENCES)
    assert p["temperature"] == 0.0
    assert p["max_tokens"] == 77
    assert p["model"] == "my-model"
    assert p["path"] == "/v1/completions"
    train, test = load_split("train", data), load_split("test", data)
    assert p["prompt"] == build_prompt(fewshot_sets(train, test[:1], 2, 1234)[0], test[0])


def test_limit_asks_only_the_first_questions(server: tuple[str, FakeServer], data: Path) -> None:
    url, state = server
    r = run_gsm8k(url, "tiny", shots=2, limit=2, data_path=data)
    assert (r.n, r.limit) == (2, 2)
    assert [o.index for o in r.per_question] == [0, 1]
    assert len(state.payloads) == 2
    asked = sorted(p["prompt"].rsplit("Question: ", 1)[1] for p in state.payloads)
    assert asked == ["test question 0?\nAnswer:", "test question 1?\nAnswer:"]


def test_concurrency_is_bounded(server: tuple[str, FakeServer], data: Path) -> None:
    url, state = server
    run_gsm8k(url, "tiny", shots=2, data_path=data, concurrency=2)
    assert len(state.payloads) == 6
    assert state.max_in_flight <= 2


def test_zero_shot_run_sends_the_bare_question(server: tuple[str, FakeServer], data: Path) -> None:
    url, state = server
    r = run_gsm8k(url, "tiny", shots=0, limit=1, data_path=data)
    assert state.payloads[0]["prompt"] == "Question: test question 0?\nAnswer:"
    assert r.shots == 0 and r.strict_match == 1.0


def test_base_url_with_v1_suffix(server: tuple[str, FakeServer], data: Path) -> None:
    url, _ = server
    assert completions_url(url + "/v1/") == url + "/v1/completions"
    r = run_gsm8k(url + "/v1", "tiny", shots=2, limit=1, data_path=data)
    assert r.errors == 0 and r.strict_match == 1.0


def test_unreachable_server_counts_every_question_as_error(data: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_gsm8k(f"http://127.0.0.1:{port}", "tiny", shots=2, data_path=data, timeout_s=5)
    assert r.errors == r.n == 6
    assert r.strict_match == r.flexible_extract == 0.0
    assert all("Connect" in (o.error or "") for o in r.per_question)


def test_result_round_trips_through_json(server: tuple[str, FakeServer], data: Path) -> None:
    url, _ = server
    r = run_gsm8k(url, "tiny", shots=2, data_path=data)
    stored = json.loads(json.dumps(r.to_dict()))
    assert "completion" not in stored["per_question"][0]
    back = AccuracyResult.from_dict(stored, source="b.json")
    assert back.correct("strict_match") == r.correct("strict_match")
    assert (back.n, back.errors, back.data_digest, back.seed) == (
        r.n,
        r.errors,
        r.data_digest,
        1234,
    )
    assert r.to_dict(with_completions=True)["per_question"][0]["completion"] == "0 apples.\n#### 0"


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 7}, "limit"),
        ({"concurrency": 0}, "concurrency"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_run_arguments_fail(data: Path, kwargs: dict[str, Any], what: str) -> None:
    with pytest.raises(UsageError, match=what):
        run_gsm8k("http://127.0.0.1:1", "tiny", shots=2, data_path=data, **kwargs)


def test_bad_base_url_fails(data: Path) -> None:
    with pytest.raises(UsageError, match="base_url"):
        run_gsm8k("127.0.0.1:8000", "tiny", data_path=data, shots=2)


# --- stored results: misuse ----------------------------------------------------------------------


def stored() -> dict[str, Any]:
    outcome = score(0, "#### 1", "x\n#### 1")
    return AccuracyResult.from_outcomes([outcome], task="gsm8k", shots=5, limit=1).to_dict()


def test_from_dict_rejects_non_mapping() -> None:
    with pytest.raises(UsageError, match="not a mapping"):
        AccuracyResult.from_dict([1, 2], source="b.json")


def test_from_dict_rejects_missing_outcomes() -> None:
    data = stored()
    del data["per_question"]
    with pytest.raises(UsageError, match="per_question"):
        AccuracyResult.from_dict(data)


def test_from_dict_rejects_wrong_field_type() -> None:
    data = stored()
    data["per_question"][0]["strict_correct"] = "yes"
    with pytest.raises(UsageError, match=r"b\.json: accuracy\.per_question\[0\]\.strict_correct"):
        AccuracyResult.from_dict(data, source="b.json")


def test_from_dict_rejects_bool_index() -> None:
    data = stored()
    data["per_question"][0]["index"] = True
    with pytest.raises(UsageError, match="index"):
        AccuracyResult.from_dict(data)


def test_from_dict_rejects_missing_meta() -> None:
    data = stored()
    del data["shots"]
    with pytest.raises(UsageError, match=r"accuracy\.shots"):
        AccuracyResult.from_dict(data)


def test_from_dict_rejects_edited_summary() -> None:
    data = stored()
    data["strict_match"] = 0.5
    with pytest.raises(UsageError, match="does not match per_question"):
        AccuracyResult.from_dict(data)
