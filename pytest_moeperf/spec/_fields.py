"""Where each field of a spec sits, and errors that point at it: file, line, dotted field.

Shared by the schema's type errors (``schema``) and the loader's rules across fields.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import NoReturn

import yaml

from pytest_moeperf.errors import UsageError

FieldPath = tuple[str, ...]

YAML11 = (
    "PyYAML (YAML 1.1) reads it as a string, not a number: its floats need a dot and a signed "
    "exponent (`1e3` and `1.0e3` are strings, `1.0e+3` is 1000.0)"
)
_NUMBER_CHARS = re.compile(r"[-+]?[0-9_.]*[0-9][0-9_.]*(?:[eE][-+]?[0-9]+)?")


def yaml_string_number(value: object) -> float | None:
    """The number a YAML string such as ``1e3`` spells, when PyYAML left it a string."""
    if not isinstance(value, str) or not _NUMBER_CHARS.fullmatch(value.strip()):
        return None
    try:
        number = float(value.strip())
    except ValueError:  # "1.2.3", "1__0" (Python's own underscore rules)
        return None
    return number if math.isfinite(number) else None


def yaml_spellings(number: float) -> list[str]:
    """Ways to write ``number`` that PyYAML reads as a number: plain, and with an exponent."""
    mantissa, _, exponent = f"{number:.15e}".partition("e")
    mantissa = mantissa.rstrip("0")
    mantissa += "0" if mantissa.endswith(".") else ""
    exp = int(exponent)
    scientific = f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp)}"
    plain = format(Decimal(repr(number)), "f")  # 1e-07 -> 0.0000001, 1000.0 -> 1000.0
    if plain.endswith(".0"):
        plain = plain[:-2]
    return [plain, scientific] if len(plain) <= 20 else [scientific]


class FieldCtx:
    """Where each field of one spec text sits, and a way to fail pointing at it."""

    def __init__(self, source: str, lines: dict[FieldPath, int]) -> None:
        self.source = source
        self.lines = lines

    def line(self, path: FieldPath) -> int:
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return 1

    def fail(self, path: FieldPath, value: object, problem: str, fix: str) -> NoReturn:
        where = f"{self.source}:{self.line(path)}"
        raise short_error(where, dotted(path), value, problem, fix)

    def missing(self, path: FieldPath) -> NoReturn:
        """A required field is absent (or null): the schema's own, or one that the spec's other
        fields make required (``num_requests`` but for a replay)."""
        section = ".".join(path[:-1]) or "the top level"
        self.fail(path, None, "missing required field", f"add `{path[-1]}:` to {section}")


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


def dotted(path: FieldPath) -> str:
    """``workload.seed``; an odd key (a newline, 200 characters) shown quoted and cut, so the
    error stays one line."""
    parts = [k if _PLAIN_KEY.match(k) else repr(_Shown(k)) for k in path]
    return ".".join(parts) or "spec"


class _Shown:
    """A value as an error shows it: its repr, cut to 120 characters."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        text = repr(self.value)
        return text if len(text) <= 120 else text[:117] + "..."


def short_error(source: str, what: str, value: object, problem: str, fix: str) -> UsageError:
    """A UsageError that keeps ``value`` itself but shows a long one cut, in one line."""
    err = UsageError(source, what, value, problem, fix)
    err.args = (str(UsageError(source, what, _Shown(value), problem, fix)),)
    return err


def line_index(node: yaml.Node, path: FieldPath, out: dict[FieldPath, int], source: str) -> None:
    """Record the line of every field; reject duplicate keys, which PyYAML would silently merge."""
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise short_error(f"{source}:{line}", dotted((*path, key)), key,
                                  "field given twice", "keep one of the two")  # fmt: skip
            seen.add(key)
            out[(*path, key)] = line
            line_index(value_node, (*path, key), out, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            line_index(item, (*path, str(i)), out, source)
