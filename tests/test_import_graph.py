"""The package's import graph flows one way: no folder imports a folder that imports it back.

Read from the source with ``ast`` (imports inside functions and under TYPE_CHECKING count: they
are dependencies all the same). A new cycle fails here with the modules that make it.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "pytest_moeperf"

#: Cycles allowed by name; empty since the orchestration (driver, probe, search, measure,
#: record) moved from ``load`` into ``run``, above both ``load`` and ``metrics`` (issue 19).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


def folders() -> set[str]:
    return {d.name for d in PKG.iterdir() if (d / "__init__.py").is_file()}


def edges() -> dict[str, dict[str, set[str]]]:
    """folder -> imported folder -> the modules (relative paths) whose imports make the edge."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    pkgs = folders()
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG)
        if len(rel.parts) < 2:
            continue  # top-level modules (plugin, session, ...) wire the folders together
        src = rel.parts[0]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                inside = parts[0] == "pytest_moeperf" and len(parts) > 1
                if inside and parts[1] in pkgs and parts[1] != src:
                    out[src][parts[1]].add(str(rel))
    return out


def cycles() -> dict[frozenset[str], str]:
    g = edges()
    found = {}
    for a, targets in g.items():
        for b in targets:
            if a < b and a in g.get(b, {}):
                ab, ba = ", ".join(sorted(g[a][b])), ", ".join(sorted(g[b][a]))
                found[frozenset({a, b})] = f"{a} -> {b} ({ab}); {b} -> {a} ({ba})"
    return found


def test_no_new_import_cycles_between_folders() -> None:
    new = {k: v for k, v in cycles().items() if k not in KNOWN_CYCLES}
    assert not new, "import cycles between folders:\n" + "\n".join(new.values())


def test_known_cycles_are_still_real() -> None:
    """A cycle that is gone must leave KNOWN_CYCLES, so the allowance cannot outlive it."""
    gone = KNOWN_CYCLES - set(cycles())
    assert not gone, f"no longer cycles, remove from KNOWN_CYCLES: {sorted(map(sorted, gone))}"


def test_the_scan_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    """The scanner itself: spec -> load (in a function) and load -> spec make a cycle."""
    global PKG
    saved = PKG
    try:
        PKG = tmp_path / "pytest_moeperf"
        for name in ("spec", "load"):
            (PKG / name).mkdir(parents=True)
            (PKG / name / "__init__.py").write_text("")
        (PKG / "spec" / "a.py").write_text("def f():\n    from pytest_moeperf.load.b import x\n")
        (PKG / "load" / "b.py").write_text(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pytest_moeperf.spec.a import f\n"
        )
        assert set(cycles()) == {frozenset({"load", "spec"})}
    finally:
        PKG = saved


def test_folders_form_a_dag() -> None:
    """Not only pairs: no longer loop either (a -> b -> c -> a), found by depth-first search."""
    g = {a: set(t) for a, t in edges().items()}
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    path: list[str] = []

    def visit(a: str) -> list[str] | None:
        state[a] = 1
        path.append(a)
        for b in sorted(g.get(a, ())):
            if state.get(b) == 1:
                return [*path[path.index(b) :], b]
            if b not in state and (loop := visit(b)):
                return loop
        path.pop()
        state[a] = 2
        return None

    for a in sorted(g):
        if a not in state and (loop := visit(a)):
            ok = frozenset({loop[0], loop[1]}) in KNOWN_CYCLES and len(loop) == 3
            assert ok, "import loop between folders: " + " -> ".join(loop)


def documented() -> dict[str, set[str]]:
    """docs/architecture.md's table: folder -> the folders it may import."""
    doc = (PKG.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)/` \| (.*?) \|$", doc, re.M)
    return {name: set(re.findall(r"`(\w+)`", allowed)) for name, allowed in rows}


def test_the_architecture_page_lists_every_folder_and_import() -> None:
    table, real = documented(), {a: set(t) for a, t in edges().items()}
    assert set(table) == folders(), "docs/architecture.md: rows for " + ", ".join(sorted(table))
    for folder in sorted(folders()):
        have, doc = real.get(folder, set()), table[folder]
        assert have == doc, (
            f"{folder}/ imports {sorted(have)}, docs/architecture.md says {sorted(doc)}: "
            "update the page (or the import)"
        )
