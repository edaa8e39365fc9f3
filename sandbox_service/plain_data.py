"""Plain data that crossed out of a candidate's jail, and the grader's comparison of it (pure).

The candidate's harness (jail/grade_candidate.py) reports a value as tagged JSON: ["N"], ["B", b],
["I", hex], ["F", float.hex], ["C", hex, hex], ["S", s], ["Y", hex], ["L"|"T"|"E"|"Z", items],
["D", [[k, v], ...]], ["H", n, type name]. `decode` reads it back into the grader's own built-in
objects under bounds (nodes, depth, string sizes: bytes a jailed process wrote), and `equal`
compares with the grader's code only: tuples as lists, floats within FLOAT_TOLERANCE (relative or
absolute), otherwise Python's `==` on these exact built-in types. A handle becomes an `Opaque`,
which equals nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FLOAT_TOLERANCE = 1e-6
MAX_NODES = 200_000
MAX_DEPTH = 64
MAX_DIGITS_HEX = 100_000
"""Longest hex integer read (about 120,000 decimal digits)."""


class Malformed(ValueError):
    """The report is not well-formed tagged data."""


@dataclass(frozen=True, slots=True, eq=False)
class Opaque:
    """A candidate's object that is not plain data: it equals nothing but itself."""

    type_name: str


def decode(tagged: object) -> Any:
    """The value of tagged data; Malformed when it is not well-formed or over the bounds."""
    budget = [MAX_NODES]
    return _decode(tagged, 0, budget)


def _decode(tagged: object, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise Malformed("the value is too large or too deeply nested")
    if not isinstance(tagged, list) or not tagged or not isinstance(tagged[0], str):
        raise Malformed("not tagged data")
    tag, rest = tagged[0], tagged[1:]
    try:
        return _decode_tag(tag, rest, depth, budget)
    except (ValueError, TypeError, OverflowError, IndexError) as exc:
        if isinstance(exc, Malformed):
            raise
        raise Malformed(f"bad {tag!r} value") from exc


def _decode_tag(tag: str, rest: list[Any], depth: int, budget: list[int]) -> Any:
    if tag == "N" and not rest:
        return None
    if tag == "B" and len(rest) == 1 and isinstance(rest[0], bool):
        return rest[0]
    if tag == "I" and len(rest) == 1 and isinstance(rest[0], str):
        if len(rest[0]) > MAX_DIGITS_HEX:
            raise Malformed("integer too long")
        return int(rest[0], 16)
    if tag == "F" and len(rest) == 1 and isinstance(rest[0], str) and len(rest[0]) < 64:
        return float.fromhex(rest[0])
    if tag == "C" and len(rest) == 2 and all(isinstance(p, str) and len(p) < 64 for p in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "S" and len(rest) == 1 and isinstance(rest[0], str):
        return rest[0]
    if tag == "Y" and len(rest) == 1 and isinstance(rest[0], str):
        return bytes.fromhex(rest[0])
    if tag in ("L", "T", "E", "Z") and len(rest) == 1 and isinstance(rest[0], list):
        items = [_decode(item, depth + 1, budget) for item in rest[0]]
        if tag == "L":
            return items
        if tag == "T":
            return tuple(items)
        return set(items) if tag == "E" else frozenset(items)
    if tag == "D" and len(rest) == 1 and isinstance(rest[0], list):
        pairs = {}
        for pair in rest[0]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise Malformed("a dict item is not a pair")
            pairs[_decode(pair[0], depth + 1, budget)] = _decode(pair[1], depth + 1, budget)
        return pairs
    if tag == "H" and len(rest) == 2 and isinstance(rest[1], str):
        return Opaque(rest[1][:100])
    raise Malformed(f"bad tag {tag!r}")


def equal(got: Any, expected: Any) -> bool:
    """Whether a candidate's value equals the expected one, by the grader's rules."""
    return _equal(got, expected, 0)


def _equal(got: Any, expected: Any, depth: int) -> bool:
    if depth > MAX_DEPTH + 2:
        return False
    if isinstance(got, Opaque) or isinstance(expected, Opaque):
        return False
    got, expected = _as_list(got), _as_list(expected)
    kinds = (type(got), type(expected))
    if float in kinds or complex in kinds:
        return _numbers_close(got, expected)
    if kinds[0] is list and kinds[1] is list:
        return len(got) == len(expected) and all(
            _equal(a, b, depth + 1) for a, b in zip(got, expected, strict=True)
        )
    if kinds[0] is dict and kinds[1] is dict:
        if got.keys() != expected.keys():
            return False
        return all(_equal(got[key], expected[key], depth + 1) for key in expected)
    if list in kinds or dict in kinds:
        return False
    return bool(got == expected)


def _as_list(value: Any) -> Any:
    return list(value) if type(value) is tuple else value


def _numbers_close(a: Any, b: Any) -> bool:
    numeric = (bool, int, float, complex)
    if type(a) not in numeric or type(b) not in numeric:
        return False
    if type(a) is complex or type(b) is complex:
        ca, cb = complex(a), complex(b)
        return _close(ca.real, cb.real) and _close(ca.imag, cb.imag)
    try:
        return _close(float(a), float(b))
    except OverflowError:
        return False


def _close(a: float, b: float) -> bool:
    if a == b:
        return True
    return math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)
