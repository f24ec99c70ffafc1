"""The A/B gate's per-M step (``ab/perm_gate.in_gate``) on a GPU, without the servers around it.

Usage (GPU machine, vLLM 0.24.0 importable), from the checkout root:
    python benchmarks/h200/perm_gate_check.py OUT [CASE ...]
CASE is one of perm_cli's test heads (large-M-worse, one-middle-key-worse, reordered); each is
made from vLLM's in-tree H200 file and gated against it as the gate does: base in-tree, head a
changed file, the subprocess, the files it writes, the summary block and the gate's failures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_moeperf.ab.cases import AbCase, AbSide
from pytest_moeperf.ab.perm_cli import make_cases
from pytest_moeperf.ab.perm_gate import in_gate
from pytest_moeperf.moeconfig.folder import in_tree_config_dir
from pytest_moeperf.moeconfig.naming import parse
from pytest_moeperf.moeconfig.validate import parse_config_text

NAME = "E=128,N=768,device_name=NVIDIA_H200.json"
SHAPE = Path("perf_tests/models/qwen3-30b-a3b-shape")


def main(argv: list[str]) -> int:
    out, wanted = Path(argv[0]), argv[1:] or ["large-M-worse"]
    tree = in_tree_config_dir()
    if tree is None or not (tree / NAME).is_file():
        print(f"no in-tree {NAME}: is vLLM 0.24 importable?")
        return 2
    heads = make_cases(json.loads((tree / NAME).read_text()))
    report = {}
    for case_name in wanted:
        files = {NAME: parse_config_text(heads[case_name], case_name)}
        case = AbCase(NAME, parse(NAME), "modified", AbSide("base", "in-tree", {}),
                      AbSide("head", case_name, files), f"in-tree vs {case_name}")  # fmt: skip
        got = in_gate(case, None, SHAPE, out / case_name, [256], print)
        assert got is not None, "no GPU visible"
        print("\n".join(got.summary_lines()))
        print("gate failures:", got.failures(NAME) or "none")
        report[case_name] = {"regressed_keys": got.regressed_keys, "error": got.error,
                             "skipped": got.skipped, "numerics_passed": got.numerics_passed,
                             "failures": got.failures(NAME)}  # fmt: skip
    (out / "perm-gate-check.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
