"""Output equivalence of the A/B servers (``ab/equivalence.py``): recorded greedy outputs for
the judgement, a small HTTP server for the client (the real servers: docs/tutorial.md's A/B
block, run by tests/test_tutorial.py)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pytest_moeperf.ab.equivalence import (
    FLOOR_NATS,
    Greedy,
    compare,
    greedy_outputs,
    judge,
    parse_choice,
)


def g(tokens: list[int], logprobs: list[float], runner_up: list[tuple[int, float]]) -> Greedy:
    """A greedy output whose top-2 at each step is (its pick, runner_up[j])."""
    top = tuple({t: lp, r: rl} for t, lp, (r, rl) in zip(tokens, logprobs, runner_up, strict=True))
    return Greedy(tuple(tokens), tuple(logprobs), top)


BASE = [
    g([5, 6, 7], [-0.1, -0.5, -0.2], [(9, -3.0), (8, -0.51), (9, -4.0)]),
    g([1, 2, 3], [-0.3, -0.3, -0.3], [(4, -5.0), (4, -5.0), (4, -5.0)]),
]


def test_identical_outputs_agree_everywhere_and_pass() -> None:
    a = compare(BASE, BASE, "head")
    assert (a.tokens, a.agreeing, a.max_logprob_diff, a.divergences) == (6, 6, 0.0, ())
    eq = judge(a, None)
    assert eq.ok and eq.allowed_nats == FLOOR_NATS
    assert "pass" in eq.line() and "6/6 tokens agree" in eq.line()


def test_a_flip_at_a_near_tie_is_explained_by_rounding() -> None:
    # position 1 of prompt 0: the base picked 6 at -0.5 over 8 at -0.51 (margin 0.01 nats)
    head = [g([5, 8, 7], [-0.1, -0.5, -0.2], [(9, -3.0), (6, -0.51), (9, -4.0)]), BASE[1]]
    a = compare(BASE, head, "head")
    assert a.agreeing == 1 + 3  # the rest of prompt 0 no longer counts as agreeing
    (d,) = a.divergences
    assert (d.prompt, d.position, d.base_token, d.other_token) == (0, 1, 6, 8)
    assert d.margin == pytest.approx(0.01)
    assert judge(a, None).ok


def test_a_flip_where_the_base_was_confident_fails_with_prompt_and_token() -> None:
    head = [BASE[0], g([1, 4, 3], [-0.3, -0.3, -0.3], [(2, -5.0)] * 3)]
    eq = judge(compare(BASE, head, "head"), None)
    assert not eq.ok
    assert "prompt 1, token 1" in eq.failures[0] and "margin of 4.7 nats" in eq.failures[0]
    assert "FAIL" in eq.line()


def test_a_token_outside_the_base_top_two_is_an_infinite_margin() -> None:
    head = [BASE[0], g([1, 2, 77], [-0.3, -0.3, -0.3], [(4, -5.0)] * 3)]
    a = compare(BASE, head, "head")
    assert math.isinf(a.divergences[0].margin)
    assert "not in its top 2" in judge(a, None).failures[0]
    assert a.to_dict()["divergences"][0]["margin"] is None  # JSON has no inf


def test_logprobs_that_move_beyond_the_floor_fail_without_any_flip() -> None:
    head = [g([5, 6, 7], [-0.1, -1.3, -0.2], [(9, -3.0), (8, -1.4), (9, -4.0)]), BASE[1]]
    a = compare(BASE, head, "head")
    assert a.divergences == () and a.max_logprob_diff == pytest.approx(0.8)
    eq = judge(a, None)
    assert not eq.ok and "moved by up to 0.8 nats" in eq.failures[0]


def test_the_control_raises_the_allowance_where_the_machine_itself_moves() -> None:
    drift = [g([5, 6, 7], [-0.1, -1.2, -0.2], [(9, -3.0), (8, -1.3), (9, -4.0)]), BASE[1]]
    ctrl = [g([5, 6, 7], [-0.1, -0.9, -0.2], [(9, -3.0), (8, -1.0), (9, -4.0)]), BASE[1]]
    eq = judge(compare(BASE, drift, "head"), compare(BASE, ctrl, "control"))
    assert eq.allowed_nats == pytest.approx(0.8) and eq.ok  # 2 x the control's 0.4
    assert "A/A control: 6/6 tokens agree" in eq.line()


def test_a_control_that_diverges_confidently_leaves_the_check_not_judged() -> None:
    ctrl = [BASE[0], g([1, 2, 77], [-0.3, -0.3, -0.3], [(4, -5.0)] * 3)]
    eq = judge(compare(BASE, BASE, "head"), compare(BASE, ctrl, "control"))
    assert eq.ok and math.isinf(eq.allowed_nats)
    assert "not judged" in eq.line()


def test_outputs_of_unequal_prompt_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="1 outputs against the base's 2"):
        compare(BASE, BASE[:1], "head")


def _choice(tokens: list[int], lps: list[float]) -> dict[str, Any]:
    return {
        "choices": [
            {
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in tokens],
                    "token_logprobs": lps,
                    "top_logprobs": [
                        {f"token_id:{t}": lp, "token_id:0": -9.0}
                        for t, lp in zip(tokens, lps, strict=True)
                    ],
                }
            }
        ]
    }


def test_parse_choice_reads_token_ids_and_names_what_is_missing() -> None:
    out = parse_choice(_choice([3, 4], [-0.1, -0.2]))
    assert out.tokens == (3, 4) and out.top[1] == {4: -0.2, 0: -9.0}
    with pytest.raises(ValueError, match="no token logprobs"):
        parse_choice({"choices": [{"text": "x", "logprobs": None}]})
    body = _choice([3], [-0.1])
    body["choices"][0]["logprobs"]["tokens"] = ["hello"]
    with pytest.raises(ValueError, match="return_tokens_as_token_ids"):
        parse_choice(body)


@pytest.fixture
def fake_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Answers /v1/completions with the prompt's last id + 1, +2, ... as the greedy tokens."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, **body})
            if body["prompt"] == [666]:
                self.send_response(400)
                self.end_headers()
                self.wfile.write(b'{"error": "bad prompt"}')
                return
            toks = [body["prompt"][-1] + k + 1 for k in range(body["max_tokens"])]
            data = json.dumps(_choice(toks, [-0.5] * len(toks))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()


def test_greedy_outputs_asks_for_greedy_token_ids_one_prompt_at_a_time(
    fake_server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = fake_server
    out = greedy_outputs(url, "m", [((1, 2, 10), 3), ((7,), 2)])
    assert [o.tokens for o in out] == [(11, 12, 13), (8, 9)]
    first = seen[0]
    assert first["path"] == "/v1/completions" and first["prompt"] == [1, 2, 10]
    assert first["temperature"] == 0.0 and first["logprobs"] == 2 and first["ignore_eos"]
    assert first["return_tokens_as_token_ids"] is True and first["model"] == "m"


def test_greedy_outputs_names_the_url_and_the_answer_of_a_failed_request(
    fake_server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, _ = fake_server
    with pytest.raises(ValueError, match=r"HTTP 400 from http://127.0.0.1:\d+/v1/completions"):
        greedy_outputs(url, "m", [((666,), 2)])


def test_flat_outputs_are_reported_as_not_informative() -> None:
    # recorded on an H100 (2026-12-05): Qwen3-30B-A3B shapes with vLLM's dummy weights give
    # every token -ln(151,936); the top-2 margin is 7.6e-6 nats, whatever the tiling
    top1, top2 = -11.93117618560791, -11.931183815002441
    flat = [g([143720, 162] * 4, [top1] * 8, [(132303, top2)] * 8)]
    eq = judge(compare(flat, flat, "head"), compare(flat, flat, "control"))
    assert eq.ok and eq.head.base_margin_median == pytest.approx(7.6e-6, rel=0.01)
    assert "not informative (the base's outputs are flat: median top-2 margin 7.6e-06" in eq.line()
    assert "per-M numerics check can" in eq.line()
    assert "not informative" not in judge(compare(BASE, BASE, "head"), None).line()


def test_a_head_that_moves_a_flat_base_still_fails() -> None:
    flat = [g([1, 2], [-11.93, -11.93], [(3, -11.930001)] * 2)]
    moved = [g([1, 2], [-11.93, -12.5], [(3, -11.930001)] * 2)]
    eq = judge(compare(flat, moved, "head"), None)
    assert not eq.ok and "FAIL" in eq.line() and "not informative" not in eq.line()
