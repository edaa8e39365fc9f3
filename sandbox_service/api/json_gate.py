"""One parse of every request body, with the same rules for every route (native and peer wires).

Each route parses its body its own way afterwards (pydantic from bytes, FastAPI's json.loads, a
peer wire's json.loads), and each of those parsers has its own idea of depth, text and numbers:
a 50,000-deep value crashed one with RecursionError, a lone surrogate passed another and then
failed the answer that echoed it. So a body reaches no route before `body_problems` has found it
to be JSON that every one of them reads the same way:

    rule                                         refused with (422; `loc` names the place)
    UTF-8, JSON syntax                           json_invalid, with the parser's position
    nesting at most MAX_DEPTH                    too_deep
    strings and keys: no lone surrogate          lone_surrogate
    numbers finite (no NaN, Infinity, 1e999)     number_not_finite
    numbers at most MAX_NUMBER_CHARS characters  number_too_long
    no key twice in one object                   duplicate_key, naming the key

A non-empty body must say it is JSON (`content-type` absent, `application/json`, or a `+json`
type): anything else is answered 415 naming the type. The E2B data plane is the exception: its
file uploads are multipart or raw bytes and envd's Connect calls are framed, so there only the
bodies declared `application/json` (or undeclared) are checked.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox_service.api.compat.asgi_io import replaying
from sandbox_service.api.compat.e2b import is_control_path, target_of
from sandbox_service.api.invalid import MAX_ERRORS, shown

MAX_DEPTH = 201
"""Deepest nesting of arrays and objects (that of pydantic's JSON parser, which the native
routes parse with, so that every route agrees)."""
MAX_NUMBER_CHARS = 1000
"""Longest number literal: room for the big integers of /grade's arguments and expected values
(exact arithmetic problems), short of the integers Python refuses to print (4,300 digits); one
converts in microseconds, so a body of them costs no more than its size allows."""

Problem = dict[str, Any]
Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class _OddNumber:
    """A number literal the parse kept as text, refused where the walk finds it."""

    text: str
    kind: str


class _Pairs(list[tuple[str, Any]]):
    """An object's members as parsed, duplicates kept (so that the walk can name them)."""


def _constant(text: str) -> _OddNumber:
    return _OddNumber(text, "number_not_finite")


def _float(text: str) -> float | _OddNumber:
    if len(text) > MAX_NUMBER_CHARS:
        return _OddNumber(text, "number_too_long")
    value = float(text)
    return value if math.isfinite(value) else _OddNumber(text, "number_not_finite")


def _int(text: str) -> int | _OddNumber:
    return _OddNumber(text, "number_too_long") if len(text) > MAX_NUMBER_CHARS else int(text)


_LONG_PLAIN = 4096
_LONG_PLAIN_VALUE = re.compile(rb'"[A-Za-z0-9+/=]{%d,}"(?!\s*:)' % _LONG_PLAIN)
"""A long string value of base64's characters (a file, the large case): nothing in it can break
a rule (no escape, no surrogate, no number, no key), so the check reads it as `""`: Python's
parser takes about 6 ns a byte over such a string, the pattern about a quarter of that. (Only
text that cannot be part of a string is outside a match in valid JSON; in invalid JSON a
match changes nothing the routes' own parsers do not refuse with a 4xx.)"""


def body_problems(body: bytes) -> list[Problem]:
    """The 422 errors (FastAPI's shape, at most MAX_ERRORS) of a non-empty body, [] if none."""
    if len(body) > _LONG_PLAIN:
        body = _LONG_PLAIN_VALUE.sub(b'""', body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [_error("json_invalid", ("body",), f"the body is not UTF-8: byte {exc.start}")]
    try:
        value = json.loads(
            text,
            object_pairs_hook=_Pairs,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
        )
    except RecursionError:
        return [_error("too_deep", ("body",), f"nesting deeper than {MAX_DEPTH}")]
    except ValueError as exc:
        return [_error("json_invalid", ("body",), f"the body is not valid JSON: {exc}")]
    problems: list[Problem] = []
    _walk(value, ("body",), 0, problems)
    return problems[:MAX_ERRORS]


def _walk(value: Any, loc: Loc, depth: int, problems: list[Problem]) -> None:
    if len(problems) >= MAX_ERRORS:
        return
    if isinstance(value, str):
        if not _encodable(value):
            problems.append(_error("lone_surrogate", loc, "a lone surrogate in a string"))
    elif isinstance(value, _OddNumber):
        why = (
            f"a number of {len(value.text)} characters; at most {MAX_NUMBER_CHARS}"
            if value.kind == "number_too_long"
            else f"{shown(value.text)} is not a finite number"
        )
        problems.append(_error(value.kind, loc, why))
    elif isinstance(value, _Pairs | list):
        if depth >= MAX_DEPTH:
            problems.append(_error("too_deep", ("body",), f"nesting deeper than {MAX_DEPTH}"))
            return
        if isinstance(value, _Pairs):
            seen: set[str] = set()
            for key, item in value:
                where = (*loc, str(shown(key)))  # escaped and cut: a key is echoed bounded
                if not _encodable(key):
                    problems.append(_error("lone_surrogate", where, "a lone surrogate in a key"))
                elif key in seen:
                    message = f"key {shown(key)!r} appears twice in one object"
                    problems.append(_error("duplicate_key", where, message))
                seen.add(key)
                _walk(item, where, depth + 1, problems)
        else:
            for index, item in enumerate(value):
                _walk(item, (*loc, index), depth + 1, problems)


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def content_type_problem(content_type: str | None) -> str | None:
    """Why a body of this declared type is not taken as JSON, else None."""
    if content_type is None:
        return None
    media = _media(content_type)
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return None
    return f"content-type {shown(content_type)!r} is not JSON; send application/json"


def _media(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _error(kind: str, loc: Loc, message: str) -> Problem:
    return {"type": kind, "loc": list(loc), "msg": message, "input": None}


class JsonGate:
    """ASGI middleware: reads each request's body (the Edge caps its size and time), refuses it
    by the rules above, else hands it on to the app unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await _read(receive)
        if body:
            headers = dict(scope["headers"])
            raw_type = headers.get(b"content-type")
            declared = None if raw_type is None else raw_type.decode("latin-1")
            data_plane = target_of(scope["path"], headers) is not None
            e2b = data_plane or is_control_path(scope["path"])
            if data_plane:
                checked = declared is None or _media(declared) == "application/json"
            else:
                wrong_type = content_type_problem(declared)
                if wrong_type is not None:
                    problem = _error("content_type", ("header", "content-type"), wrong_type)
                    await _refuse(send, 415, [problem], e2b)
                    return
                checked = True
            problems = body_problems(body) if checked else []
            if problems:
                await _refuse(send, 422, problems, e2b)
                return
        await self.app(scope, replaying(body, receive), send)


async def _read(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect  # the Edge logs it as the client's (499)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _refuse(send: Send, status: int, problems: list[Problem], e2b: bool) -> None:
    shape: dict[str, Any] = {"code": status, "message": problems[0]["msg"]} if e2b else {}
    body = json.dumps({"detail": problems, **shape}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
