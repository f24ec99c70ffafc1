"""Output equivalence of the A/B servers: greedy decoding of one fixed prompt set on each side.

With dummy weights the text is noise, but it is the same noise: vLLM's dummy loader seeds its
generator and the embedded model is a file, so with greedy decoding a server's tokens and
logprobs are a function of its kernels' arithmetic. A new tiling changes the order of the fp32
accumulation, so logprobs move in their last bits, and where two tokens are nearly tied the
greedy pick may flip; from there on the two sequences differ. Such a flip is explained by
rounding. A flip where the base was confident, or a logprob that moves more than the A/A
control's and a floor allow, is not: the head's kernels compute something else.

Prompts go one at a time (batch size 1), so a server's own output does not depend on what else
it is batching; both sides get the same prompts, ``temperature 0``, a fixed seed, and the
top-2 logprobs of every position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PROMPTS = 8
MAX_TOKENS = 32
SEED = 0
#: Nats a chosen token's logprob may move, and the margin a flipped pick may have had on the
#: base side, when the A/A control moved less. Logits leave the model in bf16: one unit in the
#: last place of a logit of magnitude 8-16 is 0.0625, so a re-tiling that changes a logit by
#: one rounding step moves its logprob by that much. 0.1 nats allows one step; a kernel that
#: computes something else moves logprobs by more. The A/A control raises it where the machine
#: itself is not deterministic (twice its own figure).
FLOOR_NATS = 0.1
#: Below this median top-1 / top-2 margin the base's outputs are flat (vLLM's dummy weights
#: give every token -ln(vocab) within 1e-5 nats): no kernel difference can show in them.
FLAT_NATS = 1e-3


@dataclass(frozen=True)
class Greedy:
    """One prompt's greedy continuation: token ids, their logprobs, the top-2 of each step."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[dict[int, float], ...]


@dataclass(frozen=True)
class Divergence:
    """Where a side's greedy pick first differs from the base's, and the base's margin there:
    the base's logprob of its own pick minus that of the other side's pick (inf when that
    token was not in the base's top 2)."""

    prompt: int
    position: int
    base_token: int
    other_token: int
    margin: float


@dataclass(frozen=True)
class Agreement:
    """One side's outputs against the base's."""

    label: str
    tokens: int  # positions compared
    agreeing: int  # positions with the same token (after a divergence: none)
    max_logprob_diff: float  # largest |Δ logprob| of the chosen token before a divergence
    divergences: tuple[Divergence, ...] = ()
    base_margin_median: float = math.inf  # the base's median top-1 minus top-2 logprob

    @property
    def worst_margin(self) -> float:
        return max((d.margin for d in self.divergences), default=0.0)

    def text(self) -> str:
        flips = len(self.divergences)
        s = (
            f"{self.agreeing}/{self.tokens} tokens agree, max |Δ logprob| "
            f"{self.max_logprob_diff:.3g} nats"
        )
        if flips:
            s += f", {flips} prompt(s) diverged (largest base margin {_nats(self.worst_margin)})"
        return s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if math.isinf(d["base_margin_median"]):
            d["base_margin_median"] = None
        for div in d["divergences"]:
            div["margin"] = None if math.isinf(div["margin"]) else div["margin"]
        return d


@dataclass(frozen=True)
class Equivalence:
    """The check's outcome: the head (and control) against the base, and what failed."""

    head: Agreement
    control: Agreement | None
    allowed_nats: float
    failures: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        ctrl = f"; A/A control: {self.control.text()}" if self.control else ""
        word = "pass" if self.ok else "FAIL"
        if self.ok and self.head.base_margin_median < FLAT_NATS:
            word = (
                "not informative (the base's outputs are flat: median top-2 margin "
                f"{self.head.base_margin_median:.2g} nats, as with dummy weights; tokens and "
                "logprobs cannot show a kernel difference, the per-M numerics check can)"
            )
        elif self.ok and math.isinf(self.allowed_nats):
            word = "not judged (the A/A control itself diverged where its base was confident)"
        return (
            f"Output equivalence (greedy, {PROMPTS} prompts x {MAX_TOKENS} tokens, batch 1): "
            f"{word}. Head: {self.head.text()}{ctrl}; allowed {self.allowed_nats:.3g} nats "
            "(docs/ab-gate.md)."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "head": self.head.to_dict(),
            "control": self.control.to_dict() if self.control else None,
            "allowed_nats": self.allowed_nats,
            "failures": list(self.failures),
        }


def _nats(x: float) -> str:
    return "not in its top 2" if math.isinf(x) else f"{x:.3g} nats"


def compare(base: Sequence[Greedy], other: Sequence[Greedy], label: str) -> Agreement:
    """Position by position up to each prompt's first differing token."""
    if len(base) != len(other):
        raise ValueError(f"{label}: {len(other)} outputs against the base's {len(base)}")
    tokens = agreeing = 0
    worst = 0.0
    divs: list[Divergence] = []
    for i, (b, o) in enumerate(zip(base, other, strict=True)):
        tokens += len(b.tokens)
        for j, (tb, to) in enumerate(zip(b.tokens, o.tokens, strict=False)):
            if tb != to:
                margin = b.logprobs[j] - b.top[j].get(to, -math.inf)
                divs.append(Divergence(i, j, tb, to, margin))
                break
            agreeing += 1
            worst = max(worst, abs(b.logprobs[j] - o.logprobs[j]))
        else:
            if len(o.tokens) != len(b.tokens):  # one side stopped early (EOS ignored: rare)
                j = min(len(o.tokens), len(b.tokens))
                divs.append(Divergence(i, j, -1, -1, math.inf))
    margins = sorted(
        b.logprobs[j] - max((v for t, v in b.top[j].items() if t != tok), default=-math.inf)
        for b in base
        for j, tok in enumerate(b.tokens)
    )
    median = margins[len(margins) // 2] if margins else math.inf
    return Agreement(label, tokens, agreeing, worst, tuple(divs), median)


def judge(head: Agreement, control: Agreement | None, floor: float = FLOOR_NATS) -> Equivalence:
    """Fail where the head moved more than the control (or the floor) explains."""
    allowed = floor
    if control is not None:
        allowed = max(floor, 2 * control.max_logprob_diff, 2 * control.worst_margin)
    failures: list[str] = []
    if head.max_logprob_diff > allowed:
        failures.append(
            f"the head's greedy logprobs moved by up to {head.max_logprob_diff:.3g} nats "
            f"before any divergence (allowed {allowed:.3g})"
        )
    for d in head.divergences:
        if d.margin > allowed:
            failures.append(
                f"prompt {d.prompt}, token {d.position}: the head picked {d.other_token} where "
                f"the base picked {d.base_token} with a margin of {_nats(d.margin)} "
                f"(allowed {allowed:.3g}): not a near-tie that rounding explains"
            )
    return Equivalence(head, control, allowed, tuple(failures))


def prompt_set(spec: Any, vocab_size: int) -> list[tuple[tuple[int, ...], int]]:
    """The fixed prompts (token ids) and their lengths to generate, from the spec's workload
    with seeds of their own (never a probe's prompts)."""
    from pytest_moeperf.load.requests import build_requests

    reqs = build_requests(spec.workload, vocab_size=vocab_size,
                          max_model_len=spec.model.max_model_len, rate=1.0, burstiness=1.0,
                          n=PROMPTS, seed_offset=2 * 10**7)  # fmt: skip
    return [(r.prompt_token_ids, min(MAX_TOKENS, r.max_tokens)) for r in reqs]


def parse_choice(body: dict[str, Any]) -> Greedy:
    """A ``/v1/completions`` answer with ``logprobs`` and token ids -> ``Greedy``.

    Raises ValueError naming what is missing (an old server, or a proxy that strips fields)."""
    try:
        lp = body["choices"][0]["logprobs"]
        tokens = tuple(_token_id(t) for t in lp["tokens"])
        logprobs = tuple(float(x) for x in lp["token_logprobs"])
        top = tuple({_token_id(k): float(v) for k, v in d.items()} for d in lp["top_logprobs"])
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no token logprobs in the answer ({type(exc).__name__}: {exc})") from None
    return Greedy(tokens, logprobs, top)


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(f"token {token!r} is not 'token_id:N' (return_tokens_as_token_ids)")
    return int(token.split(":", 1)[1])


def greedy_outputs(
    base_url: str,
    model: str,
    prompts: Sequence[tuple[tuple[int, ...], int]],
    *,
    timeout_s: float = 120.0,
) -> list[Greedy]:
    """Each prompt's greedy continuation from one server, one request at a time."""
    import httpx

    from pytest_moeperf.load.requests import completions_url

    url = completions_url(base_url)
    out: list[Greedy] = []
    with httpx.Client(timeout=timeout_s) as client:
        for ids, n in prompts:
            body = {
                "model": model, "prompt": list(ids), "max_tokens": n, "temperature": 0.0,
                "seed": SEED, "logprobs": 2, "ignore_eos": True,
                "return_tokens_as_token_ids": True,
            }  # fmt: skip
            resp = client.post(url, json=body)
            if resp.status_code != 200:
                raise ValueError(f"HTTP {resp.status_code} from {url}: {resp.text[:200]}")
            out.append(parse_choice(resp.json()))
    return out
