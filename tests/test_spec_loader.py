"""Spec YAML -> frozen dataclasses; every bad field gets one error with file, line and fix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_moeperf.errors import UsageError
from pytest_moeperf.spec import Spec, load_spec, load_spec_text
from pytest_moeperf.spec.model import is_named_model

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "perf_tests" / "specs"

MINIMAL = """\
name: tiny
model:
  path: embedded
  max_model_len: 1024
workload:
  trace: fixed
  num_requests: 10
  input_tokens: 64
  output_tokens: 16
arrival:
  rate: 2
slo:
  ttft_p99_ms: 1000
  tpot_p99_ms: 100
"""


def error_of(text: str, source: str = "spec.yaml") -> UsageError:
    with pytest.raises(UsageError) as info:
        load_spec_text(text, source)
    return info.value


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), start=1) if needle in ln)


def test_minimal_spec_fills_defaults() -> None:
    s = load_spec_text(MINIMAL)
    assert s.name == "tiny" and s.runs == 3
    assert s.model.dtype == "bfloat16" and s.model.max_model_len == 1024
    assert s.parallelism.tensor == 1 and not s.parallelism.expert
    assert s.arrival.process == "poisson" and s.arrival.rate == 2.0 and s.arrival.burstiness == 1.0
    assert s.window.warmup_fraction == 0.1 and s.window.cooldown_fraction == 0.1
    assert s.search is None and s.slo.e2el_p99_ms is None


def test_spec_is_frozen() -> None:
    s = load_spec_text(MINIMAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.name = "other"  # type: ignore[misc]


def test_example_specs_load() -> None:
    smoke = load_spec(SPECS / "cpu-smoke.yaml")
    assert smoke.model.path == "embedded" and smoke.workload.input_tokens == 128
    assert smoke.slo.ttft_p99_ms == 2000 and smoke.slo.tpot_p99_ms == 200 and smoke.runs == 3
    h200 = load_spec(SPECS / "chat-mix-v1-h200.yaml")
    assert h200.model.load_format == "dummy" and h200.model.max_model_len == 8192
    assert h200.workload.trace == "chat-mix-v1" and h200.search is not None
    assert (h200.slo.ttft_p99_ms, h200.slo.tpot_p99_ms) == (2000, 50)


def test_hash_ignores_layout_comments_and_explicit_defaults() -> None:
    reordered = MINIMAL.replace("name: tiny\n", "") + "name: tiny  # same\nruns: 3\n"
    reordered += "parallelism:\n  tensor: 1\nwindow:\n  cooldown_fraction: 0.1\n"
    a, b = load_spec_text(MINIMAL), load_spec_text(reordered, "other.yaml")
    assert a == b and a.hash() == b.hash()
    assert len(a.hash()) == 64


def test_hash_changes_with_content() -> None:
    a = load_spec_text(MINIMAL)
    b = load_spec_text(MINIMAL.replace("ttft_p99_ms: 1000", "ttft_p99_ms: 999"))
    assert a.hash() != b.hash()


def test_hash_is_stable_across_processes() -> None:
    # the canonical JSON is fixed, so the digest is reproducible anywhere
    s = load_spec_text(MINIMAL)
    text = json.dumps(s.to_dict(), sort_keys=True, separators=(",", ":"))
    import hashlib

    assert hashlib.sha256(text.encode()).hexdigest() == s.hash()
    assert "source" not in s.to_dict() and "base_dir" not in s.to_dict()


def test_vllm_args() -> None:
    text = MINIMAL.replace("  path: embedded\n", "  path: embedded\n  served_name: m\n  "
                           "load_format: dummy\n  tokenizer: ./tok\n")  # fmt: skip
    text += (
        "parallelism:\n  tensor: 2\n  data: 2\n  expert: true\n"
        "engine_args:\n  max-num-seqs: 64\n  enforce-eager: true\n  disable-log-stats: false\n"
        "  max_num_batched_tokens: 2048\n  middleware: [a.b, c.d]\n"
        "  compilation-config: {level: 3}\n"
    )
    s = load_spec_text(text, base_dir=Path("/specs"))
    args = s.vllm_args()
    joined = " ".join(args)
    assert "--served-model-name m" in joined and "--load-format dummy" in joined
    assert "--tokenizer /specs/tok" in joined
    assert "--tensor-parallel-size 2" in joined and "--data-parallel-size 2" in joined
    assert "--pipeline-parallel-size 1" in joined and "--enable-expert-parallel" in args
    assert "--enforce-eager" in args and "--disable-log-stats" not in args
    assert "--max-num-batched-tokens 2048" in joined  # underscores normalised
    assert args.count("--middleware") == 2
    i = args.index("--compilation-config")
    assert json.loads(args[i + 1]) == {"level": 3}
    assert "--dtype bfloat16 --max-model-len 1024" in joined


def test_model_location_named_or_local(tmp_path: Path) -> None:
    assert load_spec_text(MINIMAL).model_location() == "embedded"
    s = load_spec_text(MINIMAL.replace("path: embedded", "path: ./models/x"), base_dir=tmp_path)
    assert s.model_location() == str(tmp_path / "models" / "x")
    assert is_named_model("qwen3-30b-a3b-shape") and not is_named_model("../m")


def test_window_resolve() -> None:
    s = load_spec_text(MINIMAL + "window:\n  warmup_s: 2\n  cooldown_fraction: 0.2\n")
    assert s.window.resolve(10.0) == (2.0, 2.0)
    assert load_spec_text(MINIMAL).window.resolve(10.0) == (1.0, 1.0)


def test_replay_path_is_relative_to_the_spec_and_hashed(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "input_tokens": 4, "output_tokens": 2}\n')
    text = MINIMAL.replace(
        "  trace: fixed\n  num_requests: 10\n  input_tokens: 64\n  output_tokens: 16\n",
        "  trace: replay\n  path: t.jsonl\n",
    )
    f = tmp_path / "s.yaml"
    f.write_text(text)
    s = load_spec(f)
    assert s.workload.resolved_path == tmp_path / "t.jsonl" and s.workload.path == "t.jsonl"
    assert s.workload.trace_sha256 is not None and s.workload.num_requests is None
    h = s.hash()
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "input_tokens": 5, "output_tokens": 2}\n')
    assert load_spec(f).hash() != h  # a different trace is a different baseline key


# --- misuse: one test per kind of mistake ---------------------------------------------------


def test_unknown_field_suggests_the_closest_name() -> None:
    text = MINIMAL.replace("  tpot_p99_ms: 100", "  tpot_p99_ms: 100\n  ttft_p99: 5")
    err = error_of(text)
    assert err.what == "slo.ttft_p99" and "ttft_p99_ms" in err.fix
    assert err.source == f"spec.yaml:{line_of(text, 'ttft_p99: 5')}"


def test_unknown_top_level_field() -> None:
    err = error_of(MINIMAL + "wrkload: {}\n")
    assert err.what == "wrkload" and "workload" in err.fix


def test_missing_required_field_points_at_its_section() -> None:
    text = MINIMAL.replace("  tpot_p99_ms: 100\n", "")
    err = error_of(text)
    assert err.what == "slo.tpot_p99_ms" and err.problem == "missing required field"
    assert err.source == f"spec.yaml:{line_of(text, 'slo:')}"


def test_missing_section() -> None:
    text = MINIMAL.split("slo:")[0]
    err = error_of(text)
    assert err.what == "slo" and "missing" in err.problem


def test_wrong_type_names_the_value_and_line() -> None:
    text = MINIMAL.replace("max_model_len: 1024", "max_model_len: lots")
    err = error_of(text)
    assert err.what == "model.max_model_len" and err.value == "lots"
    assert err.source == f"spec.yaml:{line_of(text, 'max_model_len')}"
    assert "integer" in err.problem


def test_bool_is_not_an_int() -> None:
    err = error_of(MINIMAL + "runs: true\n")
    assert err.what == "runs" and err.value is True


def test_negative_slo_is_rejected() -> None:
    err = error_of(MINIMAL.replace("ttft_p99_ms: 1000", "ttft_p99_ms: -5"))
    assert err.what == "slo.ttft_p99_ms" and err.value == -5 and "> 0" in err.problem


def test_zero_parallelism_is_rejected() -> None:
    err = error_of(MINIMAL + "parallelism:\n  tensor: 0\n")
    assert err.what == "parallelism.tensor" and ">= 1" in err.problem


def test_expert_must_be_bool() -> None:
    err = error_of(MINIMAL + "parallelism:\n  expert: 2\n")
    assert err.what == "parallelism.expert"


def test_unknown_trace_suggests_a_choice() -> None:
    err = error_of(MINIMAL.replace("trace: fixed", "trace: chat-mix"))
    assert err.what == "workload.trace" and "chat-mix-v1" in err.fix


def test_fixed_trace_needs_lengths() -> None:
    err = error_of(MINIMAL.replace("  output_tokens: 16\n", ""))
    assert err.what == "workload.output_tokens"


def test_fixed_lengths_must_fit_the_context() -> None:
    err = error_of(MINIMAL.replace("input_tokens: 64", "input_tokens: 1020"))
    assert err.what == "workload.input_tokens" and "max_model_len" in err.problem


def test_lengths_on_a_non_fixed_trace_are_rejected() -> None:
    err = error_of(MINIMAL.replace("trace: fixed", "trace: chat-mix-v1"))
    assert err.what == "workload.input_tokens" and "only used by trace `fixed`" in err.problem


def test_replay_file_missing(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "  trace: fixed\n  num_requests: 10\n  input_tokens: 64\n  output_tokens: 16\n",
        "  trace: replay\n  path: nope.jsonl\n",
    )
    with pytest.raises(UsageError) as info:
        load_spec_text(text, "s.yaml", base_dir=tmp_path)
    assert info.value.what == "workload.path" and "cannot read" in info.value.problem


def test_replay_with_too_many_requests(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "input_tokens": 4, "output_tokens": 2}\n')
    text = MINIMAL.replace(
        "  trace: fixed\n  num_requests: 10\n  input_tokens: 64\n  output_tokens: 16\n",
        "  trace: replay\n  path: t.jsonl\n  num_requests: 3\n",
    )
    with pytest.raises(UsageError) as info:
        load_spec_text(text, "s.yaml", base_dir=tmp_path)
    assert info.value.what == "workload.num_requests"


def test_replay_with_search_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "input_tokens": 4, "output_tokens": 2}\n')
    text = (
        MINIMAL.replace(
            "  trace: fixed\n  num_requests: 10\n  input_tokens: 64\n  output_tokens: 16\n",
            "  trace: replay\n  path: t.jsonl\n",
        )
        + "search:\n  rate_min: 1\n"
    )
    with pytest.raises(UsageError) as info:
        load_spec_text(text, "s.yaml", base_dir=tmp_path)
    assert info.value.what == "search"


def test_poisson_needs_a_rate_without_search() -> None:
    err = error_of(MINIMAL.replace("arrival:\n  rate: 2\n", ""))
    assert err.what == "arrival.rate" and "missing" in err.problem


def test_search_makes_rate_optional() -> None:
    s = load_spec_text(MINIMAL.replace("arrival:\n  rate: 2\n", "") + "search:\n  rate_min: 1\n")
    assert s.arrival.rate is None and s.search is not None and s.search.max_probes == 7


def test_concurrency_process_rejects_rate() -> None:
    err = error_of(MINIMAL.replace("arrival:\n  rate: 2", "arrival:\n  process: concurrency\n"
                                   "  concurrency: 4\n  rate: 2"))  # fmt: skip
    assert err.what == "arrival.rate"


def test_poisson_rejects_concurrency() -> None:
    err = error_of(MINIMAL.replace("  rate: 2", "  rate: 2\n  concurrency: 4"))
    assert err.what == "arrival.concurrency"


def test_search_with_concurrency_is_rejected() -> None:
    text = MINIMAL.replace("arrival:\n  rate: 2", "arrival:\n  process: concurrency\n"
                           "  concurrency: 4") + "search:\n  rate_min: 1\n"  # fmt: skip
    assert error_of(text).what == "arrival.process"


def test_concurrency_spec_loads() -> None:
    s = load_spec_text(MINIMAL.replace("  rate: 2", "  process: concurrency\n  concurrency: 4"))
    assert s.arrival.process == "concurrency" and s.arrival.concurrency == 4


def test_rate_max_below_rate_min() -> None:
    err = error_of(MINIMAL + "search:\n  rate_min: 5\n  rate_max: 2\n")
    assert err.what == "search.rate_max"


def test_tolerance_out_of_range() -> None:
    err = error_of(MINIMAL + "search:\n  rate_min: 1\n  tolerance: 0.9\n")
    assert err.what == "search.tolerance"


def test_probe_requests_and_duration_combine() -> None:
    spec = load_spec_text(
        MINIMAL + "search:\n  rate_min: 1\n  probe_requests: 5\n  probe_duration_s: 9\n"
    )
    assert spec.search is not None
    assert (spec.search.probe_requests, spec.search.probe_duration_s) == (5, 9.0)


def test_probe_duration_must_be_positive() -> None:
    err = error_of(MINIMAL + "search:\n  rate_min: 1\n  probe_duration_s: 0\n")
    assert err.what == "search.probe_duration_s"


def test_warmup_s_and_fraction_are_exclusive() -> None:
    err = error_of(MINIMAL + "window:\n  warmup_s: 1\n  warmup_fraction: 0.1\n")
    assert err.what == "window.warmup_fraction"


def test_window_fractions_must_leave_a_window() -> None:
    err = error_of(MINIMAL + "window:\n  warmup_fraction: 0.6\n  cooldown_fraction: 0.5\n")
    assert err.what == "window.cooldown_fraction"


def test_engine_arg_with_dashes_prefix() -> None:
    err = error_of(MINIMAL + "engine_args:\n  --max-num-seqs: 4\n")
    assert err.what == "engine_args.--max-num-seqs" and "max-num-seqs:" in err.fix


def test_engine_arg_that_the_spec_derives() -> None:
    err = error_of(MINIMAL + "engine_args:\n  tensor_parallel_size: 2\n")
    assert "parallelism.tensor" in err.fix


def test_engine_arg_null_value_is_rejected() -> None:
    err = error_of(MINIMAL + "engine_args:\n  max-num-seqs:\n")
    assert err.what == "engine_args.max-num-seqs"


def test_engine_arg_empty_list() -> None:
    err = error_of(MINIMAL + "engine_args:\n  middleware: []\n")
    assert err.what == "engine_args.middleware"


def test_engine_args_both_spellings() -> None:
    err = error_of(MINIMAL + "engine_args:\n  max-num-seqs: 4\n  max_num_seqs: 8\n")
    assert "twice" in err.problem


def test_duplicate_key_is_caught_with_its_line() -> None:
    text = MINIMAL + "runs: 2\nruns: 4\n"
    err = error_of(text)
    assert err.what == "runs" and err.source == f"spec.yaml:{line_of(text, 'runs: 4')}"


def test_bad_name() -> None:
    assert error_of(MINIMAL.replace("name: tiny", "name: 'a b/c'")).what == "name"


def test_invalid_yaml_reports_the_line() -> None:
    text = MINIMAL.replace("  rate: 2", "  rate: [2")
    err = error_of(text)
    assert err.what == "spec" and "YAML" in err.problem and err.source.startswith("spec.yaml:")


def test_top_level_must_be_a_mapping() -> None:
    assert "mapping" in error_of("- a\n- b\n").problem
    assert "mapping" in error_of("").problem


def test_section_must_be_a_mapping() -> None:
    err = error_of(MINIMAL.replace("slo:\n  ttft_p99_ms: 1000\n  tpot_p99_ms: 100\n", "slo: 5\n"))
    assert err.what == "slo" and "mapping" in err.problem


def test_missing_file() -> None:
    with pytest.raises(UsageError) as info:
        load_spec(Path("/nonexistent/spec.yaml"))
    assert info.value.what == "spec file"


def test_error_message_is_one_line_with_source_field_value_and_fix() -> None:
    err = error_of(MINIMAL.replace("ttft_p99_ms: 1000", "ttft_p99_ms: -5"), "a/b.yaml")
    msg = str(err)
    assert msg.startswith("a/b.yaml:") and "slo.ttft_p99_ms = -5" in msg and "Fix:" in msg
    assert "\n" not in msg


def test_spec_type() -> None:
    assert isinstance(load_spec_text(MINIMAL), Spec)


def test_engine_arg_and_max_num_seqs_read_engine_args_or_vllm_default() -> None:
    from pytest_moeperf.spec.loader import load_spec_text

    base = """
name: e
model: {path: embedded, dtype: bfloat16, max_model_len: 2048}
workload: {trace: fixed, num_requests: 8, seed: 0, input_tokens: 16, output_tokens: 8}
slo: {ttft_p99_ms: 1000, tpot_p99_ms: 100}
arrival: {process: poisson, rate: 2}
"""
    plain = load_spec_text(base)
    assert plain.engine_arg("quantization") is None and plain.max_num_seqs == 256
    tuned = load_spec_text(base + "engine_args: {max-num-seqs: 12, quantization: fp8}\n")
    assert tuned.engine_arg("quantization") == "fp8" and tuned.max_num_seqs == 12
