"""Turn a ``WorkloadSpec`` into concrete requests: exact token-id prompts, lengths, arrival times.

Prompts are random token ids (not text) so the server sees exactly the planned input length;
everything is drawn from generators seeded by (workload.seed, seed_offset), so a baseline and a
candidate run send identical traffic. ``schedule_offset`` seeds the lengths and arrival times
apart from the token ids: the SLO search gives every probe of every run the same schedule
(common random numbers) but fresh prompts, so no prompt is served twice. numpy is imported
inside functions: this module is imported by the driver at run time only.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_moeperf.errors import UsageError
from pytest_moeperf.load.records import RequestSpec
from pytest_moeperf.spec.model import WorkloadSpec
from pytest_moeperf.spec.traces import (
    CHAT_MIX_V1,
    fit_to_context,
    lognormal_params,
    read_replay,
    scaled_length,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

DEFAULT_LOW_TOKEN_ID = 100  # ids below this are special in most vocabularies (pad, bos, eos...)
_SRC = "build_requests()"


def _allowed_ids(
    low: int, vocab_size: int, reserved: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Half-open id ranges prompts may use: [low, vocab) minus the reserved ranges."""
    segments = [(low, vocab_size)]
    for a, b in sorted(reserved):
        nxt: list[tuple[int, int]] = []
        for s, e in segments:
            if b <= s or a >= e:
                nxt.append((s, e))
                continue
            if s < a:
                nxt.append((s, a))
            if b < e:
                nxt.append((b, e))
        segments = nxt
    return segments


def _token_ids(
    rng: np.random.Generator, total: int, segments: list[tuple[int, int]]
) -> npt.NDArray[np.int64]:
    import numpy as np

    sizes = np.array([e - s for s, e in segments], dtype=np.int64)
    starts = np.array([s for s, _ in segments], dtype=np.int64)
    bounds = np.cumsum(sizes)
    u = rng.integers(0, int(bounds[-1]), size=total, dtype=np.int64)
    seg = np.searchsorted(bounds, u, side="right")
    offset_in_seg = u - (bounds[seg] - sizes[seg])
    out: npt.NDArray[np.int64] = starts[seg] + offset_in_seg
    return out


def _check_args(vocab_size: int, max_model_len: int, low: int, rate: float, n: int | None) -> None:
    if vocab_size <= low:
        fix = "pass the model's vocab_size (from its config.json)"
        raise UsageError(_SRC, "vocab_size", vocab_size, f"must be above low_token_id {low}", fix)
    if max_model_len < 2:
        fix = "pass model.max_model_len from the spec"
        raise UsageError(_SRC, "max_model_len", max_model_len, "must be >= 2", fix)
    if not rate > 0:
        fix = "pass a rate > 0 requests/s (inf sends all at once)"
        raise UsageError(_SRC, "rate", rate, "must be > 0", fix)
    if n is not None and n < 1:
        raise UsageError(_SRC, "n", n, "must be >= 1", "pass n >= 1 or None for the spec's count")


def build_requests(
    workload: WorkloadSpec,
    *,
    vocab_size: int,
    max_model_len: int,
    rate: float,
    burstiness: float,
    n: int | None = None,
    seed_offset: int = 0,
    schedule_offset: int | None = None,
    low_token_id: int = DEFAULT_LOW_TOKEN_ID,
    reserved_ids: Sequence[tuple[int, int]] = (),
) -> list[RequestSpec]:
    """The requests of one run. ``seed_offset`` gives independent runs from one spec;
    ``schedule_offset``, when given, seeds the lengths and arrival times instead, so that runs
    with one ``schedule_offset`` and different ``seed_offset`` share their schedule (the first
    ``n`` of one sequence: a shorter run is a prefix of a longer one, up to the rescaling of
    ``arrival_offsets``) and differ only in their prompts' token ids.

    ``rate`` and ``burstiness`` shape the arrivals of chat-mix-v1 and fixed traces (gamma gaps,
    from ``load.arrivals``); a replay keeps the arrival times of its file. ``reserved_ids`` are
    half-open ranges of token ids never placed in prompts (e.g. a model's special tokens).
    """
    import numpy as np

    from pytest_moeperf.load.arrivals import arrival_offsets

    _check_args(vocab_size, max_model_len, low_token_id, rate, n)
    segments = _allowed_ids(low_token_id, vocab_size, reserved_ids)
    if not segments:
        fix = "narrow reserved_ids or lower low_token_id"
        raise UsageError(_SRC, "reserved_ids", list(reserved_ids), "leave no usable ids", fix)
    seq = np.random.SeedSequence([workload.seed, seed_offset])
    len_seed, tok_seed, arr_seed = seq.spawn(3)
    if schedule_offset is not None:
        len_seed, _, arr_seed = np.random.SeedSequence([workload.seed, schedule_offset]).spawn(3)
    count = n if n is not None else workload.num_requests
    arrivals: list[float]
    if workload.trace == "replay":
        if workload.resolved_path is None:
            raise UsageError(_SRC, "workload.path", None, "replay needs a path", "load the spec")
        rows = read_replay(workload.resolved_path)
        count = len(rows) if count is None else count
        if count > len(rows):
            fix = f"ask for at most {len(rows)}"
            raise UsageError(_SRC, "n", count, f"the trace has only {len(rows)} requests", fix)
        rows = rows[:count]
        raw_in = np.array([r.input_tokens for r in rows], dtype=np.float64)
        raw_out = np.array([r.output_tokens for r in rows], dtype=np.float64)
        arrivals = [r.arrival_s for r in rows]
    else:
        if count is None:
            raise UsageError(_SRC, "n", None, "no request count", "set workload.num_requests")
        raw_in, raw_out = _draw_lengths(workload, count, len_seed)
        arr_int = int(arr_seed.generate_state(1)[0])
        arrivals = arrival_offsets(count, rate, burstiness, arr_int)
    lengths = []
    for i, o in zip(raw_in.tolist(), raw_out.tolist(), strict=True):
        li = scaled_length(int(i), workload.scale, workload.max_input_tokens)
        lo = scaled_length(int(o), workload.scale, workload.max_output_tokens)
        lengths.append(fit_to_context(li, lo, max_model_len))
    ids = _token_ids(np.random.default_rng(tok_seed), sum(li for li, _ in lengths), segments)
    requests: list[RequestSpec] = []
    pos = 0
    for idx, ((li, lo), t) in enumerate(zip(lengths, arrivals, strict=True)):
        prompt = tuple(ids[pos : pos + li].tolist())
        pos += li
        requests.append(RequestSpec(index=idx, arrival_s=float(t), prompt_token_ids=prompt,
                                    max_tokens=lo))  # fmt: skip
    return requests


def _draw_lengths(
    workload: WorkloadSpec, count: int, seed: np.random.SeedSequence
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    import numpy as np

    if workload.trace == "fixed":
        assert workload.input_tokens is not None and workload.output_tokens is not None
        return (
            np.full(count, float(workload.input_tokens)),
            np.full(count, float(workload.output_tokens)),
        )
    out = []
    # one stream per length, so that the first n lengths of a longer draw are those of a draw
    # of n (a shared schedule: the probes of a search differ in size)
    for key, child in zip(("input", "output"), seed.spawn(2), strict=True):
        mu, sigma = lognormal_params(*CHAT_MIX_V1[key])
        out.append(np.rint(np.random.default_rng(child).lognormal(mu, sigma, size=count)))
    return out[0], out[1]


@functools.lru_cache(maxsize=8)
def planned_lengths(workload: WorkloadSpec, max_model_len: int,
                    count: int = 2000) -> tuple[tuple[int, int], ...]:  # fmt: skip
    """(input, output) lengths the workload asks for, ``count`` of them (a replay: its rows),
    scaled and fitted to the context as ``build_requests`` fits them: what a steady state
    holds. Cached: every probe of a spec asks for the same lengths."""
    import numpy as np

    if workload.trace == "replay":
        if workload.resolved_path is None:
            return ()
        rows = read_replay(workload.resolved_path)
        raw_in = np.array([r.input_tokens for r in rows], dtype=np.float64)
        raw_out = np.array([r.output_tokens for r in rows], dtype=np.float64)
    else:
        seed = np.random.SeedSequence([workload.seed, count]).spawn(3)[0]
        raw_in, raw_out = _draw_lengths(workload, count, seed)
    return tuple(fit_to_context(scaled_length(int(i), workload.scale, workload.max_input_tokens),
                                scaled_length(int(o), workload.scale, workload.max_output_tokens),
                                max_model_len)
                 for i, o in zip(raw_in.tolist(), raw_out.tolist(), strict=True))  # fmt: skip


def planned_output_lengths(workload: WorkloadSpec, max_model_len: int,
                           count: int = 2000) -> tuple[int, ...]:  # fmt: skip
    """The output halves of ``planned_lengths``."""
    return tuple(o for _, o in planned_lengths(workload, max_model_len, count))


def random_prompts(lengths: Sequence[int], vocab_size: int, seed: Sequence[int],
                   low_token_id: int = DEFAULT_LOW_TOKEN_ID) -> list[tuple[int, ...]]:  # fmt: skip
    """Fresh random token-id prompts of the given lengths (ids in [low_token_id, vocab))."""
    import numpy as np

    _check_args(vocab_size, 2, low_token_id, 1.0, None)
    rng = np.random.default_rng(np.random.SeedSequence(list(seed)))
    ids = _token_ids(rng, sum(lengths), [(low_token_id, vocab_size)]).tolist()
    out, pos = [], 0
    for n in lengths:
        out.append(tuple(ids[pos : pos + n]))
        pos += n
    return out


def completions_url(base_url: str) -> str:
    """``/v1/completions`` of a server given as ``http://host:port`` or ``http://host:port/v1``
    (the accuracy task and the A/B gate's greedy requests)."""
    root = base_url.rstrip("/")
    return root + ("/completions" if root.endswith("/v1") else "/v1/completions")
