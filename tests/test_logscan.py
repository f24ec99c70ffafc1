"""Reading the vLLM server log: which MoE config file was loaded, the backend, version, port.

The log lines below are vLLM's own messages with its real prefix, taken from recorded server
logs (``docs/results/h200-ab-2026-12-02``, the CPU server logs) and the logger format strings in
``vllm/model_executor/layers/fused_moe/fused_moe.py`` and ``.../oracle/unquantized.py``. The
config check is the proof that an A/B run exercised the requested file, so a regression here
silently turns every A/B comparison into default-vs-default.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_moeperf.server.logscan import (
    ConfigCheck,
    MoeConfigObservation,
    check_requested_config,
    engine_version,
    port_conflict,
    scan_moe_config,
)
from pytest_moeperf.server.process import ServerConfig, VllmServer

NAME = "E=128,N=768,device_name=NVIDIA_H200.json"
NAME_FP8 = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
IN_TREE_DIR = "/root/site/vllm/model_executor/layers/fused_moe/configs"
IN_TREE = f"{IN_TREE_DIR}/{NAME}"
IN_TREE_FP8 = f"{IN_TREE_DIR}/{NAME_FP8}"
TUNED_DIR = (
    "/tmp/pytest-of-root/pytest-2/test_moe_config_ab_h200_E_128_0/"
    "E_128_N_768_device_name_NVIDIA_H200-head-moe-configs"
)
TUNED = f"{TUNED_DIR}/{NAME}"

ENGINE = "(EngineCore pid=30139) INFO 12-02 19:29:56 [core.py:133] "
WORKER = "(Worker pid=30152) INFO 12-02 19:30:07 "


def loaded(path: str, who: str = "EngineCore pid=30139") -> str:
    """fused_moe.py: logger.info_once("Using configuration from %s for MoE layer.", path)."""
    prefix = f"({who}) INFO 12-02 19:30:08 [fused_moe.py:1150] "
    return prefix + f"Using configuration from {path} for MoE layer."


def default(*paths: str) -> str:
    """fused_moe.py: the warning_once with ", ".join(config_file_paths)."""
    return (
        "(EngineCore pid=30139) WARNING 12-02 19:30:08 [fused_moe.py:1163] Using default MoE "
        "config. Performance might be sub-optimal! Config file not found at " + ", ".join(paths)
    )


CPU_ORACLE = (
    WORKER + "[unquantized.py:364] Using CPU Unquantized MoE backend out of potential "
    "backends: ['CPU']."
)
CPU_EXPERTS = WORKER + "[unquantized.py:529] Using CPUUnquantizedExperts MoE backend"
TRITON_ORACLE = (
    WORKER + "[unquantized.py:364] Using TRITON Unquantized MoE backend out of potential "
    "backends: ['FlashInfer TRTLLM', 'FlashInfer CUTLASS', 'TRITON', 'BATCHED_TRITON']."
)
BANNER = (
    "(APIServer pid=30126) INFO 12-02 19:29:45 [api_utils.py:347]  "
    "▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0"
)
ENGINE_INIT = (
    ENGINE + "Initializing a V1 LLM engine (v0.32.0) with config: "
    "model='/root/.cache/pytest-moeperf/models/tiny-qwen3-moe-a018868f3c65', "
    "speculative_config=None, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None"
)
ULIMIT = (
    "(APIServer pid=30126) WARNING 12-02 19:29:45 [system_utils.py:255] Found ulimit of 20000 "
    "and failed to automatically increase with error current limit exceeds maximum limit. This "
    "can cause fd limit errors like `OSError: [Errno 24] Too many open files`."
)
NOISE = [
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    ULIMIT,
    "(APIServer pid=30126) INFO 12-02 19:30:13 [launcher.py:195] Route: /version, Methods: GET",
    'INFO:     127.0.0.1:43446 - "GET /version HTTP/1.1" 200 OK',
]


def log(*lines: str) -> str:
    return "\n".join([*NOISE[:2], *lines, *NOISE[2:]]) + "\n"


# -- scan_moe_config ------------------------------------------------------------------------


def test_loaded_file_is_recorded_with_its_line_as_evidence() -> None:
    """The path in the message is the proof of what the kernel read."""
    obs = scan_moe_config(log(ENGINE_INIT, TRITON_ORACLE, loaded(TUNED)))
    assert obs.loaded == (TUNED,)
    assert obs.backend == "triton"
    assert not obs.default_used
    assert obs.searched == ()
    assert obs.evidence == (loaded(TUNED),)
    assert obs.summary == f"loaded {TUNED}"


def test_loaded_files_keep_log_order_and_drop_duplicates_across_layers_and_ranks() -> None:
    """info_once dedups per process only: each TP rank repeats the line; list each file once."""
    lines = [
        loaded(IN_TREE_FP8, "Worker_TP0 pid=11"),
        loaded(TUNED, "Worker_TP0 pid=11"),
        loaded(IN_TREE_FP8, "Worker_TP1 pid=12"),
        loaded(TUNED, "Worker_TP1 pid=12"),
    ]
    obs = scan_moe_config(log(*lines))
    assert obs.loaded == (IN_TREE_FP8, TUNED)
    assert obs.evidence == tuple(lines)  # every rank's line is kept as evidence
    assert obs.summary == f"loaded {IN_TREE_DIR}/{NAME_FP8}, {TUNED}"


def test_default_fallback_lists_each_searched_path_whole() -> None:
    """vLLM joins the paths with ", " and the file names contain commas (E=..,N=..)."""
    obs = scan_moe_config(log(ENGINE_INIT, default(TUNED, IN_TREE)))
    assert obs.default_used
    assert obs.loaded == ()
    assert obs.searched == (TUNED, IN_TREE)
    assert obs.backend == "triton"
    assert obs.evidence == (default(TUNED, IN_TREE),)
    assert obs.summary == f"vLLM default MoE config (no file found at {TUNED}, {IN_TREE})"


def test_default_fallback_without_tuned_folder_searches_only_in_tree() -> None:
    """Without VLLM_TUNED_CONFIG_FOLDER vLLM looks only in its configs/ dir."""
    obs = scan_moe_config(default(IN_TREE) + "   \n")
    assert obs.searched == (IN_TREE,)


def test_loaded_and_default_in_one_log_reports_the_loaded_file() -> None:
    """Two MoE shapes: one found, one defaulted; the summary names the file that was read."""
    obs = scan_moe_config(log(default(IN_TREE_FP8), loaded(TUNED)))
    assert obs.default_used
    assert obs.loaded == (TUNED,)
    assert obs.searched == (IN_TREE_FP8,)
    assert obs.summary == f"loaded {TUNED}"


def test_path_with_spaces_is_read_whole() -> None:
    """A pytest basetemp with a space must not hide the loaded file (a false check failure)."""
    path = f"/tmp/my runs/x-moe-configs/{NAME}"
    assert scan_moe_config(loaded(path)).loaded == (path,)


@pytest.mark.parametrize(
    "line",
    [
        # fp8_utils.py: same opening, but a block-FP8 GEMM config, not a MoE one.
        ENGINE + "Using configuration from /c/N=1536,K=7168,device_name=NVIDIA_H200,"
        "dtype=fp8_w8a8,block_shape=[128,128].json for W8A8 Block FP8 kernel.",
        # fused_flydsl_moe.py: a different kernel's default.
        ENGINE + "Using default FlyDSL MoE config. Performance might be sub-optimal! "
        f"Config file not found at {IN_TREE}",
        # fp8_utils.py default warning.
        ENGINE + "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "
        f"Config file not found at {IN_TREE}",
    ],
    ids=["block-fp8-loaded", "flydsl-default", "block-fp8-default"],
)
def test_other_kernels_config_messages_are_not_moe_configs(line: str) -> None:
    """Only fused_moe.py's messages say which fused-MoE tiling file was used."""
    obs = scan_moe_config(log(line))
    assert obs == MoeConfigObservation()


@pytest.mark.parametrize("line", [CPU_ORACLE, CPU_EXPERTS], ids=["oracle", "experts"])
def test_cpu_backend_is_detected_from_either_vllm_message(line: str) -> None:
    """vLLM-CPU prints both; either alone must mark the run as CPU (no config files read)."""
    obs = scan_moe_config(log(ENGINE_INIT, line))
    assert obs.backend == "cpu"
    assert obs.loaded == ()
    assert not obs.default_used
    assert obs.evidence == (line,)
    assert obs.summary == "CPU MoE backend: fused-MoE config files are not read"


def test_recorded_cpu_server_log_keeps_first_backend_line_only() -> None:
    """The recorded CPU log has both lines; the first one is the evidence, no duplicates."""
    obs = scan_moe_config(log(ENGINE_INIT, CPU_ORACLE, CPU_EXPERTS))
    assert obs.backend == "cpu"
    assert obs.evidence == (CPU_ORACLE,)


def test_config_message_overrides_an_earlier_cpu_line() -> None:
    """A fused-MoE config message proves the Triton path ran, whatever came before."""
    obs = scan_moe_config(log(CPU_EXPERTS, loaded(TUNED)))
    assert obs.backend == "triton"
    assert obs.evidence == (CPU_EXPERTS, loaded(TUNED))


def test_cpu_line_after_a_config_message_does_not_downgrade_to_cpu() -> None:
    obs = scan_moe_config(log(default(IN_TREE), CPU_EXPERTS))
    assert obs.backend == "triton"
    assert obs.evidence == (default(IN_TREE),)


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", log(ENGINE_INIT, TRITON_ORACLE), log(BANNER)],
    ids=["empty", "blank-lines", "gpu-no-config-yet", "banner-only"],
)
def test_no_moe_message_means_unknown_backend(text: str) -> None:
    """GPU oracle lines and the Triton-without-CPU note are not the CPU backend."""
    obs = scan_moe_config(text)
    assert obs == MoeConfigObservation()
    assert obs.backend == "unknown"
    assert obs.summary == "no MoE config message in the server log"


@pytest.mark.parametrize("name", ["missing.log", "empty.log"])
def test_server_with_missing_or_empty_log_observes_nothing(tmp_path: Path, name: str) -> None:
    """A server that died before writing its log must give an empty observation, not raise."""
    (tmp_path / "empty.log").write_text("")
    server = VllmServer(ServerConfig(model="m", log_path=tmp_path / name))
    assert server.log_text() == ""
    assert server.moe_observation() == MoeConfigObservation()


def test_server_reads_its_log_file(tmp_path: Path) -> None:
    """VllmServer.moe_observation is the path fixture.py takes: it must scan the real file."""
    path = tmp_path / "real.log"
    path.write_bytes(log(ENGINE_INIT, loaded(TUNED)).encode() + b"\xff bad byte\n")
    obs = VllmServer(ServerConfig(model="m", log_path=path)).moe_observation()
    assert obs.loaded == (TUNED,)


def test_crlf_log_lines_are_stripped_in_evidence() -> None:
    obs = scan_moe_config(loaded(TUNED) + "\r\n")
    assert obs.loaded == (TUNED,)
    assert obs.evidence == (loaded(TUNED),)


# -- check_requested_config -----------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    f = tmp_path / "head-moe-configs"
    f.mkdir()
    (f / NAME).write_text("{}")
    return f


def test_requested_file_loaded_from_the_folder_passes(folder: Path) -> None:
    obs = scan_moe_config(log(loaded(str(folder / NAME))))
    check = check_requested_config(obs, folder, (NAME,))
    assert check == ConfigCheck(True, f"loaded {NAME} from {folder}")


@pytest.mark.parametrize("link_side", ["log", "folder"])
def test_requested_file_reached_through_a_symlink_passes(
    folder: Path, tmp_path: Path, link_side: str
) -> None:
    """vLLM prints the env var's path as given; a symlinked folder is still the same folder."""
    link = tmp_path / "link"
    link.symlink_to(folder)
    logged, requested = (link, folder) if link_side == "log" else (folder, link)
    obs = scan_moe_config(loaded(str(logged / NAME)))
    assert check_requested_config(obs, requested, (NAME,)).ok


def test_requested_file_not_loaded_fails_naming_both_paths(folder: Path) -> None:
    """The in-tree file was read instead: the failure must say what was asked and what ran."""
    obs = scan_moe_config(log(loaded(IN_TREE)))
    check = check_requested_config(obs, folder, (NAME,))
    assert not check.ok
    assert f"requested {NAME} from {folder}" in check.message
    assert f"the engine used: loaded {IN_TREE}" in check.message
    assert "E/N/device_name" in check.message


def test_requested_file_but_default_used_fails(folder: Path) -> None:
    """A misnamed file: vLLM searched the folder, found nothing, and used its defaults."""
    wanted = str(folder / NAME_FP8)
    obs = scan_moe_config(default(wanted, IN_TREE_FP8))
    check = check_requested_config(obs, folder, (NAME,))
    assert not check.ok
    assert "vLLM default MoE config" in check.message
    assert wanted in check.message


def test_requested_file_never_mentioned_fails(folder: Path) -> None:
    check = check_requested_config(scan_moe_config(log(ENGINE_INIT)), folder, (NAME,))
    assert check == ConfigCheck(False, "requested MoE config was never mentioned in the server log")


def test_sibling_folder_with_a_shared_prefix_is_not_inside(folder: Path) -> None:
    """``head-moe-configs-old`` starts with the folder's name but is another folder."""
    other = folder.parent / (folder.name + "-old") / NAME
    obs = scan_moe_config(loaded(str(other)))
    assert not check_requested_config(obs, folder, (NAME,)).ok


@pytest.mark.parametrize("expected", [(NAME,), ()], ids=["requested-file", "in-tree"])
def test_cpu_backend_is_recorded_not_failed(folder: Path, expected: tuple[str, ...]) -> None:
    """vLLM-CPU reads no MoE configs: CI on CPU must not fail on a config it cannot use."""
    obs = scan_moe_config(log(ENGINE_INIT, CPU_ORACLE, CPU_EXPERTS))
    check = check_requested_config(obs, folder, expected)
    assert check == ConfigCheck(
        True,
        "backend ignores MoE configs (vLLM CPU MoE backend); "
        "CPU MoE backend: fused-MoE config files are not read",
    )


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        (loaded(IN_TREE), f"loaded {IN_TREE}"),
        (default(IN_TREE), f"vLLM default MoE config (no file found at {IN_TREE})"),
        (ENGINE_INIT, "no MoE config message in the server log"),
    ],
    ids=["in-tree-file", "default", "silent"],
)
def test_in_tree_request_accepts_in_tree_file_default_or_silence(
    tmp_path: Path, text: str, summary: str
) -> None:
    """An empty tuned folder means in-tree: whatever vLLM ships (or its default) is right."""
    check = check_requested_config(scan_moe_config(text), tmp_path, ())
    assert check == ConfigCheck(True, "in-tree: " + summary)


def test_in_tree_request_with_no_folder_passes() -> None:
    check = check_requested_config(scan_moe_config(loaded(IN_TREE)), None, ())
    assert check.ok


def test_in_tree_request_fails_when_the_tuned_folder_was_read(folder: Path) -> None:
    """A stale file in the 'in-tree' variant's folder would make A and B the same config."""
    path = str(folder / NAME)
    obs = scan_moe_config(log(loaded(IN_TREE), loaded(path)))
    check = check_requested_config(obs, folder, ())
    assert check == ConfigCheck(False, f"in-tree requested but the tuned folder was read: {[path]}")


# -- engine_version / port_conflict ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (log(ENGINE_INIT), "0.32.0"),
        (log(BANNER), "0.32.0"),
        (
            log(BANNER.replace("0.32.0", "0.11.1rc2.dev5+g1234abc"), ENGINE_INIT),
            "0.11.1rc2.dev5+g1234abc",
        ),
        (ENGINE_INIT.replace("v0.32.0", "v0.10.2.dev123+gabcdef.cpu"), "0.10.2.dev123+gabcdef.cpu"),
        ("", None),
        (log(CPU_ORACLE), None),
        ('INFO:     127.0.0.1:43446 - "GET /version HTTP/1.1" 200 OK', None),
    ],
    ids=["engine-line", "banner", "first-wins", "dev-build", "empty", "none", "route-only"],
)
def test_engine_version(text: str, version: str | None) -> None:
    """The version goes into the environment record; '/version' routes are not versions."""
    assert engine_version(text) == version


@pytest.mark.parametrize(
    ("text", "taken"),
    [
        (
            "ERROR:    [Errno 98] error while attempting to bind on address "
            "('127.0.0.1', 36889): address already in use",
            True,
        ),
        (log("OSError: [Errno 98] Address already in use"), True),
        # a localised strerror: only the errno number is left to go by
        ("OSError: [Errno 98] Die Adresse wird bereits verwendet", True),
        (log(ENGINE_INIT, CPU_EXPERTS), False),
        (ULIMIT, False),  # a different Errno must not be read as a port clash
        ("", False),
    ],
    ids=["uvicorn", "oserror", "localised", "healthy", "errno-24", "empty"],
)
def test_port_conflict(text: str, taken: bool) -> None:
    """A port clash is retried on a new port; any other startup failure must not be."""
    assert port_conflict(text) is taken
