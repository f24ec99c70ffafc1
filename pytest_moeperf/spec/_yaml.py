"""Spec text -> YAML node graph and Python data, in bounded time and memory.

YAML aliases share nodes: a 2 KB file of nested ``&a [*b, *b, ...]`` lines stands for billions
of values. The loader walks the graph to index lines, hashes the spec and sends mappings to vLLM
as JSON, and each of those walks expands the aliases; so the graph's *expanded* size is bounded
here, before anything walks it, and a recursive alias (``&a [*a]``) is refused the same way.
"""

from __future__ import annotations

from typing import Any

import yaml

from pytest_moeperf.errors import UsageError

#: Values (nodes) a spec may stand for once its aliases are expanded. A real spec has ~100;
#: a big ``engine_args`` mapping (a compilation config) a few hundred.
MAX_EXPANDED_NODES = 10_000
#: Nesting depth of the YAML: PyYAML composes recursively (the interpreter's stack is ~1,000).
MAX_DEPTH = 64


class _Loader(yaml.SafeLoader):
    """SafeLoader that remembers where the first alias and the deepest nesting are."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.first_alias: yaml.Mark | None = None
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent) and self.first_alias is None:
            self.first_alias = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _TooDeep(mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _TooDeep(Exception):
    def __init__(self, mark: yaml.Mark) -> None:
        self.mark = mark


def _line_of(text: str, line: int, limit: int = 80) -> str:
    """The text of ``line``, cut to ``limit`` characters: an error stays one readable line."""
    lines = text.splitlines()
    shown = lines[line - 1] if 0 < line <= len(lines) else ""
    return shown if len(shown) <= limit else shown[:limit] + "..."


def compose_and_load(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """The node graph (for line numbers) and the data of one YAML document, or one UsageError
    naming the line: bad YAML, nesting beyond MAX_DEPTH, aliases beyond MAX_EXPANDED_NODES."""
    loader = None
    try:
        loader = _Loader(text)  # the reader refuses control characters here
        try:
            root = loader.get_single_node()
        except _TooDeep as deep:
            line = deep.mark.line + 1
            raise UsageError(f"{source}:{line}", "spec", _line_of(text, line),
                             f"nests deeper than {MAX_DEPTH} levels",
                             "flatten the YAML (a spec needs 4 levels)") from None  # fmt: skip
        if root is not None:
            _check_expanded_size(root, loader.first_alias, text, source)
        try:
            data = loader.construct_document(root) if root is not None else None
        except (ValueError, OverflowError) as exc:  # int('9'*5000), date 2024-13-45
            raise UsageError(f"{source}:1", "spec", _line_of(text, 1),
                             f"holds a value YAML cannot read ({str(exc).split(';')[0]})",
                             "quote odd-looking values, e.g. '2024-13-45'") from None  # fmt: skip
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise UsageError(f"{source}:{line}", "spec", _line_of(text, line),
                         f"is not valid YAML ({exc.problem})",
                         "fix the YAML syntax on that line") from None  # fmt: skip
    except yaml.YAMLError as exc:  # a reader error (control characters) has no problem mark
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(source, "spec", source, f"is not valid YAML ({why})",
                         "save the spec as plain UTF-8 text") from None  # fmt: skip
    finally:
        if loader is not None:
            loader.dispose()  # type: ignore[no-untyped-call]
    return root, data


def _check_expanded_size(root: yaml.Node, alias: yaml.Mark | None, text: str,
                         source: str) -> None:  # fmt: skip
    """Count the values the graph stands for, each shared node once (memoised): linear in the
    file, whatever the aliases multiply to."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def fail(problem: str) -> None:
        line = alias.line + 1 if alias is not None else 1
        raise UsageError(f"{source}:{line}", "spec", _line_of(text, line), problem,
                         "write the values out instead of repeating YAML aliases (*name)"
                         )  # fmt: skip

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            fail("a YAML alias refers to itself (a recursive structure)")
        if depth > MAX_DEPTH:  # aliases of aliases nest deeper than the text does
            fail(f"its YAML aliases nest deeper than {MAX_DEPTH} levels")
        on_path.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                total += size(k, depth + 1) + size(v, depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item, depth + 1)
        on_path.discard(key)
        if total > MAX_EXPANDED_NODES:
            fail(f"its YAML aliases expand to more than {MAX_EXPANDED_NODES:,} values "
                 "(an alias bomb?)")  # fmt: skip
        sizes[key] = total
        return total

    size(root, 0)
