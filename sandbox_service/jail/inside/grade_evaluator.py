"""The program `POST /grade` runs as the evaluator of an `asserts` case, in a jail of its own.

A pristine interpreter that never holds the candidate's code: it runs the tests' `setup` and one
assert, with the candidate's names bound to proxies. A call through a proxy is a crossing; the
replies of the crossings made so far come in the transcript (the candidate's jail answered them
in an earlier run). At the first crossing the transcript cannot answer, the evaluator reports
what it needs and ends; the grader has the candidate serve it and runs the evaluator again.
Sent as an ordinary execution's `code` (this file's source, then `main()`), its orders on stdin:

    stdin   {"n": nonce, "setup": str, "assert": str, "names": [[name, tagged | ["Q"]], ...],
             "transcript": [[request, reply, mutated], ...], "max_calls": int}
    stdout  `\\x1eRLSB-GRADE <nonce> need <request>` (request as grade_candidate.py reads it),
            or `\\x1eRLSB-GRADE <nonce> verdict [status, message]`, status passed, failed,
            error or mismatch (the replay asked otherwise than the transcript recorded)

The tests are the tenant's own code, so this program runs jailed like any other; it is trusted
only for the verdict of its own tests. Values from the candidate arrive as tagged plain data
(grade_candidate.py) and become this interpreter's own built-in objects; anything else is a
`Handle`, which equals only itself. Standard library only; must not import sandbox_service.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from typing import Any

MARK = "\x1eRLSB-GRADE"
MESSAGE_CHARS = 300


class CandidateError(Exception):
    """An exception the candidate raised whose type is not one of Python's built-in ones."""


class Crossings:
    """The calls into the candidate, answered from the transcript while it lasts."""

    def __init__(self, nonce: str, transcript: list[Any], max_calls: int) -> None:
        self.nonce = nonce
        self.transcript = transcript
        self.max_calls = max_calls
        self.made = 0

    def cross(self, target: list[Any], args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        request = {
            "t": target,
            "a": [encode(a) for a in args],
            "k": {str(k): encode(v) for k, v in (kwargs or {}).items()},
        }
        index = self.made
        self.made += 1
        if index >= self.max_calls:
            raise RuntimeError(f"more than {self.max_calls} calls into the candidate in one case")
        if index >= len(self.transcript):
            report(self.nonce, "need", request)
            os._exit(0)
        recorded, reply, mutated = self.transcript[index]
        if json.dumps(recorded, sort_keys=True) != json.dumps(request, sort_keys=True):
            report(self.nonce, "verdict", ["mismatch", f"call {index} differs on replay"])
            os._exit(0)
        for position, value in mutated.items():
            _update(args[int(position)], decode(value, self))
        if reply[0] == "stop":
            raise StopIteration
        if reply[0] == "raise":
            kind = getattr(builtins, str(reply[1]), None)
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind(str(reply[2]))
            raise CandidateError(f"{reply[1]}: {reply[2]}")
        return decode(reply[1], self)


class Handle:
    """A candidate's object that is not plain data: usable only through crossings."""

    def __init__(self, crossings: Crossings, number: int, type_name: str) -> None:
        self._crossings = crossings
        self._number = number
        self._type_name = type_name

    def __repr__(self) -> str:
        return f"<candidate {self._type_name} #{self._number}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._crossings.cross(["call", self._number], args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._crossings.cross(["getattr", self._number, name])

    def __iter__(self) -> Any:
        return self._crossings.cross(["iter", self._number])

    def __next__(self) -> Any:
        return self._crossings.cross(["next", self._number])

    def __len__(self) -> int:
        value = self._crossings.cross(["len", self._number])
        if type(value) is not int:
            raise TypeError("len() of a candidate object is not an int")
        return value

    def __getitem__(self, key: Any) -> Any:
        return self._crossings.cross(["getitem", self._number], (key,))


class NameProxy:
    """A callable the candidate defines at its top level."""

    def __init__(self, crossings: Crossings, name: str) -> None:
        self._crossings = crossings
        self._name = name

    def __repr__(self) -> str:
        return f"<candidate {self._name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._crossings.cross(["name", self._name], args, kwargs)


def encode(value: Any) -> Any:
    """Tagged plain data of an argument (grade_candidate.py's format)."""
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["B", value]
    if kind is int:
        return ["I", format(value, "x")]
    if kind is float:
        return ["F", value.hex()]
    if kind is complex:
        return ["C", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["S", value]
    if kind is bytes:
        return ["Y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        tags: dict[type, str] = {list: "L", tuple: "T", set: "E", frozenset: "Z"}
        tag = tags[kind]
        return [tag, [encode(item) for item in value]]
    if kind is dict:
        return ["D", [[encode(k), encode(v)] for k, v in value.items()]]
    if kind is Handle:
        return ["H", value._number, value._type_name]
    raise TypeError(f"a {kind.__name__} cannot be passed to the candidate (plain data only)")


def decode(tagged: Any, crossings: Crossings) -> Any:
    """This interpreter's own value of tagged plain data."""
    tag = tagged[0]
    if tag == "N":
        return None
    if tag == "B":
        return tagged[1] is True
    if tag == "I":
        return int(tagged[1], 16)
    if tag == "F":
        return float.fromhex(tagged[1])
    if tag == "C":
        return complex(float.fromhex(tagged[1]), float.fromhex(tagged[2]))
    if tag == "S":
        return str(tagged[1])
    if tag == "Y":
        return bytes.fromhex(tagged[1])
    if tag in ("L", "T", "E", "Z"):
        items = [decode(item, crossings) for item in tagged[1]]
        return {"L": list, "T": tuple, "E": set, "Z": frozenset}[tag](items)
    if tag == "D":
        return {decode(k, crossings): decode(v, crossings) for k, v in tagged[1]}
    if tag == "H":
        return Handle(crossings, int(tagged[1]), str(tagged[2]))
    raise ValueError(f"unknown tag {tag!r}")


def _update(original: Any, now: Any) -> None:
    """Carry a candidate's in-place change of a list, dict or set argument back to ours."""
    if type(original) is list and type(now) is list:
        original[:] = now
    elif type(original) in (dict, set) and type(now) is type(original):
        original.clear()
        original.update(now)


def report(nonce: str, kind: str, payload: object) -> None:
    """One framed line on stdout (the grader ignores everything else)."""
    sys.stdout.flush()
    line = f"\n{MARK} {nonce} {kind} {json.dumps(payload, separators=(',', ':'))}\n"
    data = line.encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(1, data) :]


def main() -> None:
    """Run the setup and the assert once, as far as the transcript allows."""
    orders = json.loads(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
    nonce = str(orders["n"])
    crossings = Crossings(nonce, orders["transcript"], int(orders["max_calls"]))
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    for name, value in orders["names"]:
        is_callable = value == ["Q"]
        namespace[name] = NameProxy(crossings, name) if is_callable else decode(value, crossings)
    verdict: list[str]
    try:
        exec(compile(orders["setup"], "<setup>", "exec"), namespace)
    except BaseException as exc:
        verdict = ["error", f"setup: {type(exc).__name__}: {exc}"[:MESSAGE_CHARS]]
    else:
        try:
            exec(compile(orders["assert"], "<assert>", "exec"), namespace)
        except AssertionError as exc:
            verdict = ["failed", f"AssertionError: {exc}"[:MESSAGE_CHARS]]
        except BaseException as exc:
            verdict = ["error", f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]]
        else:
            verdict = ["passed", ""]
    report(nonce, "verdict", verdict)
    os._exit(0)
