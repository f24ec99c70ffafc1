"""Fuzzing the spec loader: any text gives a valid Spec or one clear error, in bounded memory.

A spec is hand-edited and may come from a PR: whatever it holds, the loader must answer with a
``UsageError`` (one line naming file, line and fix) or a ``Spec``, never another exception, and
never grow without bound (a 2 KB YAML alias bomb once grew pytest to 24 GB).
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_moeperf.errors import MoePerfError
from pytest_moeperf.spec import _yaml
from pytest_moeperf.spec.loader import load_spec_text
from pytest_moeperf.spec.model import Spec
from pytest_moeperf.spec.schema import (
    ARRIVAL_FIELDS,
    MODEL_FIELDS,
    PARALLEL_FIELDS,
    SEARCH_FIELDS,
    SLO_FIELDS,
    TOP_FIELDS,
    WINDOW_FIELDS,
    WORKLOAD_FIELDS,
)

MAX_PEAK_BYTES = 64 * 2**20  # a spec is a few KB; 64 MB of Python objects is a leak
#: CPU seconds of this thread, not wall time: the bound is about the parser (PyYAML's scanner
#: is quadratic in flow nesting: 5,000 '[' take ~1.4 s on a quiet core), and wall time also
#: counts the other xdist worker's vLLM server (5.3 s once, with three workers on 2 cores).
MAX_SECONDS = 5.0

VALID: dict[str, Any] = {
    "name": "tiny",
    "model": {"path": "embedded", "dtype": "bfloat16", "max_model_len": 1024},
    "workload": {
        "trace": "fixed",
        "num_requests": 16,
        "seed": 0,
        "input_tokens": 64,
        "output_tokens": 16,
    },
    "arrival": {"process": "poisson", "rate": 2.0},
    "slo": {"ttft_p99_ms": 2000, "tpot_p99_ms": 200},
    "runs": 1,
}
SECTIONS = {"model": MODEL_FIELDS, "parallelism": PARALLEL_FIELDS, "workload": WORKLOAD_FIELDS,
            "arrival": ARRIVAL_FIELDS, "slo": SLO_FIELDS, "search": SEARCH_FIELDS,
            "window": WINDOW_FIELDS}  # fmt: skip

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["embedded", "fixed", "poisson", "replay", "ray",
                                           "chat-mix-v1", "1e3", "inf", ".nan", "-5", "0"]),
)  # fmt: skip
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                      max_leaves=12)  # fmt: skip


def _check(text: str) -> None:
    """The property: a Spec or a MoePerfError with one line, in bounded memory and time."""
    tracemalloc.start()
    t0 = time.thread_time()
    try:
        spec = load_spec_text(text, "fuzz.yaml")
    except MoePerfError as exc:
        assert str(exc).startswith("fuzz.yaml"), str(exc)
        assert "\n" not in str(exc), str(exc)
    else:
        assert isinstance(spec, Spec)
        spec.vllm_args()  # what a server would be started with must be computable too
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MAX_PEAK_BYTES, f"{peak / 2**20:.0f} MB for {len(text)} characters"
    assert time.thread_time() - t0 < MAX_SECONDS


@st.composite
def mutated_specs(draw: st.DrawFn) -> str:
    """The valid spec with fields replaced, added or removed: reaches the field checks."""
    spec: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in VALID.items()}
    for _ in range(draw(st.integers(1, 4))):
        section = draw(st.sampled_from([*TOP_FIELDS, "engine_args", "bogus"]))
        if section in SECTIONS and draw(st.booleans()):
            sub = spec.setdefault(section, {})
            if not isinstance(sub, dict):
                sub = spec[section] = {}
            sub[draw(st.sampled_from([*SECTIONS[section], "bogus"]))] = draw(values)
        elif draw(st.booleans()):
            spec[section] = draw(values)
        else:
            spec.pop(section, None)
    return yaml.safe_dump(spec, sort_keys=False)


@st.composite
def alias_texts(draw: st.DrawFn) -> str:
    """Anchors and aliases: chains that multiply (bombs), self references, merges."""
    fan = draw(st.integers(1, 12))
    depth = draw(st.integers(1, 12))
    lines = ["a0: &a0 [x, y]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, depth)]
    extra = draw(st.sampled_from(["", "r: &r [*r]", "m: &m {k: *m}", "<<: *a0",
                                  f"engine_args: {{x: *a{depth - 1}}}"]))  # fmt: skip
    body = "\n".join([*lines, extra])
    return yaml.safe_dump(VALID, sort_keys=False) + body + "\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_any_text(text: str) -> None:
    _check(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="[]{}:,-&*!|>'\"#\n ?ab01.e", max_size=200))
def test_yaml_punctuation(text: str) -> None:
    _check(text)


@settings(max_examples=300, deadline=None)
@given(mutated_specs())
def test_mutated_valid_spec(text: str) -> None:
    _check(text)


@settings(max_examples=150, deadline=None)
@given(alias_texts())
def test_aliases(text: str) -> None:
    _check(text)


def test_the_valid_spec_loads() -> None:
    """The fuzzers' seed is itself valid: mutations start from a spec that passes."""
    assert isinstance(load_spec_text(yaml.safe_dump(VALID), "fuzz.yaml"), Spec)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("\n".join(["name: &a0 [x, x, x, x, x, x, x, x, x, x]"]
                   + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 20)]),
         "fuzz.yaml:2: spec = 'a1: &a1 [*a0, *a0,"),
        ("r: &r [*r]", "a YAML alias refers to itself"),
        ("[" * 5000, f"nests deeper than {_yaml.MAX_DEPTH} levels"),
        ("x: " + "9" * 5000, "holds a value YAML cannot read"),
        ("d: 2024-13-45", "holds a value YAML cannot read (month must be in 1..12)"),
        ("a: \x07", "unacceptable character #x0007"),
    ],
)  # fmt: skip
def test_hostile_yaml_is_one_line(text: str, needle: str) -> None:
    _check(text)  # bounded memory and time
    with pytest.raises(MoePerfError) as info:
        load_spec_text(text, "fuzz.yaml")
    assert needle in str(info.value), str(info.value)
