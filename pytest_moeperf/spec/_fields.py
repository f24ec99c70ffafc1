"""Field checks for the spec loader: each one fails pointing at the file, line and field.

Split from ``loader`` so the loader reads as the spec's schema, section by section.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, NoReturn

import yaml

from pytest_moeperf.errors import UsageError

FieldPath = tuple[str, ...]
MISSING: Any = object()

_YAML11 = (
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

    def mapping(self, value: object, path: FieldPath, allowed: Sequence[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            what = "the spec" if not path else f"`{'.'.join(path)}`"
            self.fail(
                path, value, f"{what} must be a mapping", f"write {what} as `key: value` lines"
            )
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
                hint = f"did you mean `{close[0]}`?" if close else "remove it"
                self.fail(
                    (*path, str(key)),
                    key,
                    "unknown field",
                    f"{hint} Known fields here: {', '.join(allowed)}",
                )
        return value

    def get(self, m: dict[str, Any], path: FieldPath, key: str, default: Any) -> Any:
        value = m.get(key)
        if value is None:
            if default is MISSING:
                section = ".".join(path) or "the top level"
                self.fail(
                    (*path, key), None, "missing required field", f"add `{key}:` to {section}"
                )
            return default
        return value

    def int_(
        self,
        m: dict[str, Any],
        path: FieldPath,
        key: str,
        default: Any = MISSING,
        minimum: int = 1,
    ) -> Any:
        value = self.get(m, path, key, default)
        if value is default and default is not MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            number = yaml_string_number(value)
            if number is not None and number.is_integer():
                self.fail((*path, key), value, f"must be an integer; {_YAML11}",
                          f"write `{int(number)}`")  # fmt: skip
            self.fail(
                (*path, key), value, "must be an integer", f"write a whole number >= {minimum}"
            )
        if value < minimum:
            self.fail((*path, key), value, f"must be >= {minimum}", f"use a value >= {minimum}")
        return value

    def num(
        self,
        m: dict[str, Any],
        path: FieldPath,
        key: str,
        default: Any = MISSING,
        *,
        low: float = 0.0,
        low_inclusive: bool = False,
        high: float = math.inf,
    ) -> Any:
        value = self.get(m, path, key, default)
        if value is default and default is not MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            number = yaml_string_number(value)
            if number is not None:
                spellings = " or ".join(f"`{s}`" for s in yaml_spellings(number))
                self.fail((*path, key), value, f"must be a number; {_YAML11}",
                          f"write {spellings}")  # fmt: skip
            self.fail((*path, key), value, "must be a number", "write a plain number, e.g. 1.5")
        ok_low = value >= low if low_inclusive else value > low
        if not ok_low or value >= high or math.isinf(value):
            rng = f"{'>=' if low_inclusive else '>'} {low:g}" + (
                f" and < {high:g}" if high < math.inf else ""
            )
            self.fail((*path, key), value, f"must be {rng}", f"use a finite number {rng}")
        return float(value)

    def bool_(self, m: dict[str, Any], path: FieldPath, key: str, default: bool | None,
              fix: str) -> Any:  # fmt: skip
        """``true``/``false``; absent gives ``default``, and an explicit null is accepted only
        where the default is None (unset)."""
        value = m.get(key, default)
        if value is None and default is None:
            return None
        if not isinstance(value, bool):
            self.fail((*path, key), value, "must be true or false", fix)
        return value

    def str_(self, m: dict[str, Any], path: FieldPath, key: str, default: Any = MISSING) -> Any:
        value = self.get(m, path, key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, str) or not value.strip():
            self.fail((*path, key), value, "must be a non-empty string", "quote it: key: 'text'")
        return value

    def choice(
        self, m: dict[str, Any], path: FieldPath, key: str, options: Sequence[str], default: Any
    ) -> Any:
        value = self.str_(m, path, key, default)
        if value is None and default is None:
            return None
        if value not in options:
            close = difflib.get_close_matches(str(value), options, n=1, cutoff=0.5)
            hint = f"did you mean `{close[0]}`? " if close else ""
            self.fail(
                (*path, key), value, "unknown choice", f"{hint}use one of {', '.join(options)}"
            )
        return value


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
