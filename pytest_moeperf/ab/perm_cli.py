"""Per-M kernel A/B of fused-MoE config files on one GPU, through vLLM 0.24's own Triton path.

Usage (GPU machine, vLLM 0.24.0 importable; ``benchmarks/h200/perm_kernels.py`` is the same):
    python -m pytest_moeperf.ab.perm_cli --make-cases CASES --base BASE.json
    python -m pytest_moeperf.ab.perm_cli --base BASE.json --head CASES/large-M-worse.json \\
        --head CASES/one-middle-key-worse.json --head CASES/reordered.json --dtype bf16 --out OUT
    python -m pytest_moeperf.ab.perm_cli --pairs BASE.json:HEAD.json --dtype fp8_w8a8 --out OUT
    python -m pytest_moeperf.ab.perm_cli --from-result OUT/NAME.json --out OUT2   # no GPU

The A/B gate runs it as a subprocess before its servers start (``ab/perm_gate.py``), so that
its CUDA context is gone before vLLM sizes its memory.

For each (base, head) pair: ``kernel_bench.run_ab`` times the tiling each file serves at every M
of ``m_values`` (both files' keys plus ``--workload-ms``), base and head interleaved ABBA, and
checks each tiling's output against an fp64 reference; then ``compare_all``, the per-M table,
best of both, its predicted gain and the numerics guard. Written to OUT: ``<name>.json`` (raw
samples, configs, results), ``<name>.md`` (table, verdict lines, numerics) and
``<name>-best-of-both.json`` (the merged config, ready to commit); name = head's stem + dtype.

``--make-cases DIR`` writes the three test heads of the issue from ``--base``: large-M-worse
(every key M >= 64 poorly tiled), one-middle-key-worse (the key nearest 48 in 32..64 only) and
reordered (same content, keys reversed, other JSON formatting). Without CUDA (or vLLM's Triton
path) the A/B prints why and exits 2, or 0 with ``--allow-skip``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pytest_moeperf.ab.kernel_bench import (
    DTYPES,
    BenchResult,
    MoeShape,
    run_ab,
    skip_reason,
)
from pytest_moeperf.ab.perm_report import check_numerics, perm_rows, perm_table
from pytest_moeperf.errors import UsageError
from pytest_moeperf.moeconfig.naming import moe_section, moe_shard
from pytest_moeperf.moeconfig.perm import compare_all, config_keys
from pytest_moeperf.moeconfig.perm_merge import Merged, best_of_both, predicted_gain
from pytest_moeperf.moeconfig.validate import load_config as validate_config

#: the project's Qwen3-30B-A3B-shaped model folder, relative to the checkout it runs in
DEFAULT_SHAPE = Path("perf_tests") / "models" / "qwen3-30b-a3b-shape"
#: A deliberately poor tiling for a large M: tiny tiles, no grouping, shallow pipeline.
POOR = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}  # fmt: skip
CASES = ("large-M-worse", "one-middle-key-worse", "reordered")


def load_config(path: Path) -> dict[str, Any]:
    """A config file as vLLM reads it: the raw dict, string keys in file order (which breaks
    ties), after the project's own checks of the file (``moeconfig.validate.load_config``:
    UTF-8, JSON, every tiling's fields, errors that name the file and line)."""
    validate_config(path)
    config: dict[str, Any] = json.loads(path.read_text())
    config_keys(config, str(path))
    return config


def shape_from_config(
    cfg: Mapping[str, Any], dtype: str = "bf16", tp: int = 1, source: str = "config.json"
) -> MoeShape:
    """The MoE layer of a Hugging Face config on one GPU: E and N as vLLM's config file name
    has them (``moe_shard``, which knows each model family's field names), hidden size, top-k."""
    experts, n = moe_shard(cfg, tp=tp, source=source)
    section = moe_section(cfg)  # multimodal MoE models keep these under text_config

    def get(name: str) -> Any:
        if name not in section:
            raise UsageError(source, name, None, "missing", "pass a MoE model's config")
        return section[name]

    return MoeShape(experts, n, get("hidden_size"), get("num_experts_per_tok"), dtype)


def read_shape(folder: Path, dtype: str, tp: int = 1) -> MoeShape:
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        why = f"unreadable: {e}"
        raise UsageError("--shape", "config.json", str(path), why, "pass a folder") from e
    return shape_from_config(cfg, dtype, tp, source=str(path))


def middle_key(config: Mapping[str, Any]) -> str:
    """The key nearest 48 among keys 32..64 (the decode-to-prefill middle), else the median."""
    keys = config_keys(config)
    mid = [m for m in keys if 32 <= m <= 64]
    m = min(mid, key=lambda k: (abs(k - 48), k)) if mid else sorted(keys)[len(keys) // 2]
    return keys[m]


def make_cases(base: Mapping[str, Any]) -> dict[str, str]:
    """name -> file text of the three test heads (metadata keys kept as they are)."""
    keys = {s: m for m, s in config_keys(base).items()}
    large = {k: dict(POOR) if k in keys and keys[k] >= 64 else v for k, v in base.items()}
    mid = middle_key(base)
    one = {k: dict(POOR) if k == mid else v for k, v in base.items()}
    rev = {k: (dict(sorted(v.items())) if isinstance(v, Mapping) else v)
           for k, v in reversed(list(base.items()))}  # fmt: skip
    return {
        "large-M-worse": json.dumps(large, indent=4) + "\n",
        "one-middle-key-worse": json.dumps(one, indent=4) + "\n",
        "reordered": json.dumps(rev, indent=2, separators=(",", " : ")),
    }


def summarize(
    base: Mapping[str, Any],
    head: Mapping[str, Any],
    result: BenchResult,
    *,
    title: str = "head vs base",
) -> tuple[str, dict[str, Any], Merged]:
    """The .md text, the .json document and the merged config, from recorded samples."""
    comps = compare_all(base, head, result.samples())
    merged = best_of_both(base, head, comps)
    gain_note = ""
    try:
        gain: float | None = predicted_gain(merged, comps)
    except UsageError as e:  # an M served by neither side's timed tiling
        gain, gain_note = None, f"- predicted change: n/a ({e})"
    shape = result.shape
    numerics = check_numerics(result.errors("base"), result.errors("head"), shape.dtype, shape.k)
    n = [len(r.base_us) for r in result.per_m]
    v = result.versions
    lines = [
        f"# Per-M kernel A/B: {title}",
        "",
        f"{result.device}; vLLM {v.get('vllm')}, torch {v.get('torch')}, triton "
        f"{v.get('triton')}; E={shape.experts} N={shape.n} K={shape.k} top-k={shape.topk} "
        f"{shape.dtype}; {len(result.per_m)} Ms, {min(n, default=0)}..{max(n, default=0)} "
        f"replays a side ({result.invocations} invocations each); {result.timing_s:.1f} s "
        f"timed, {result.wall_s:.1f} s in all",
        "",
        perm_table(perm_rows(base, head, comps), merged=merged, gain=gain),
    ]
    lines += [gain_note] if gain_note else []
    lines.append(f"- {numerics.message}")
    doc = {
        "base_config": base,
        "head_config": head,
        "result": result.to_dict(),
        "comparisons": {str(m): asdict(c) for m, c in comps.items()},
        "best_of_both": {
            "config": merged.config,
            "chosen": {str(m): s for m, s in merged.chosen.items()},
            "not_realisable": [asdict(p) for p in merged.not_realisable],
            "same_as_base": merged.same_as_base,
            "predicted_gain": gain,
        },
        "numerics": {"passed": numerics.passed, "tolerance": numerics.tolerance},
        "numerics_message": numerics.message,
    }
    return "\n".join(lines) + "\n", doc, merged


def outputs(out: Path, name: str) -> list[Path]:
    """What one pair writes to ``out``: raw samples, the table, the merged config."""
    return [out / f"{name}.json", out / f"{name}.md", out / f"{name}-best-of-both.json"]


def write_report(
    out: Path, name: str, base: Mapping[str, Any], head: Mapping[str, Any], result: BenchResult,
    title: str = "head vs base",
) -> list[Path]:  # fmt: skip
    md, doc, merged = summarize(base, head, result, title=title)
    out.mkdir(parents=True, exist_ok=True)
    paths = outputs(out, name)
    paths[0].write_text(json.dumps(doc, indent=2) + "\n")
    paths[1].write_text(md)
    paths[2].write_text(merged.to_json())
    return paths


def _pairs(args: argparse.Namespace) -> list[tuple[Path, Path]]:
    pairs = [(Path(args.base), Path(h)) for h in args.head or []] if args.base else []
    for p in args.pairs or []:
        b, sep, h = p.partition(":")
        if not sep or not b or not h:
            raise UsageError("--pairs", "pair", p, "not BASE:HEAD", "write base.json:head.json")
        pairs.append((Path(b), Path(h)))
    if not pairs:
        raise UsageError("command line", "pairs", [], "nothing to compare", "pass --base/--head")
    return pairs


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", help="base config file")
    p.add_argument("--head", action="append", help="head config file (repeatable)")
    p.add_argument("--pairs", nargs="+", metavar="BASE:HEAD", help="pairs with their own base")
    p.add_argument("--shape", type=Path, default=DEFAULT_SHAPE, help="folder with config.json")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--workload-ms", default="", help="extra Ms to time, e.g. 3,40,200")
    p.add_argument("--budget-s", type=float, default=40.0, help="timed seconds per pair")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="folder for the .json/.md/best-of-both files")
    p.add_argument("--make-cases", type=Path, metavar="DIR", help="write the 3 test heads")
    p.add_argument("--from-result", type=Path, help="rebuild the report from a written .json")
    p.add_argument("--allow-skip", action="store_true", help="exit 0 when no GPU can run it")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.make_cases:
            if not args.base:
                raise UsageError("--make-cases", "--base", None, "missing", "pass --base FILE")
            base = load_config(Path(args.base))
            args.make_cases.mkdir(parents=True, exist_ok=True)
            for name, text in make_cases(base).items():
                (args.make_cases / f"{name}.json").write_text(text)
                print(f"wrote {args.make_cases / name}.json")
            return 0
        if args.out is None:
            raise UsageError("command line", "--out", None, "missing", "pass --out DIR")
        if args.from_result:
            doc = json.loads(args.from_result.read_text())
            res = BenchResult.from_dict(doc["result"])
            name = args.from_result.stem
            paths = write_report(args.out, name, doc["base_config"], doc["head_config"], res)
            print(paths[1].read_text())
            return 0
        pairs = [(b, h, load_config(b), load_config(h)) for b, h in _pairs(args)]
        shape = read_shape(args.shape, args.dtype, args.tp)
        workload = [int(m) for m in args.workload_ms.split(",") if m.strip()]
    except (UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0 if args.allow_skip else 2
    used: set[str] = set()
    for bpath, hpath, base, head in pairs:
        name = f"{hpath.stem}-{args.dtype}"
        while name in used:
            name += "-2"
        used.add(name)
        print(f"== {hpath} vs {bpath} ({args.dtype})", flush=True)
        res = run_ab(base, head, shape, workload_ms=workload, budget_s=args.budget_s,
                     seed=args.seed, log=lambda s: print("  " + s, flush=True))  # fmt: skip
        paths = write_report(args.out, name, base, head, res, title=f"{hpath.name} vs {bpath.name}")
        print(paths[1].read_text())
        print("wrote " + ", ".join(map(str, paths)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
