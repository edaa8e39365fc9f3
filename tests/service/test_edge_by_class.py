"""Every route, native and peer wire, answers each odd body with a 4xx naming the problem: never
a 5xx, never a reset connection, and the service is healthy afterwards (api/json_gate.py).

The routes are those of the OpenAPI document plus the wires served before FastAPI's routing;
each gets a valid body, and every odd shape is made from it: a lone surrogate, a 50,000-deep
value, a huge or non-finite number in place of each of its fields, a key twice, bytes that are
not UTF-8, wrong types, an empty body and a wrong content type.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.service.stack import Stack

ODD = "\x00odd\x00"
"""Stands in a body for the raw JSON text of an odd value (json.dumps escapes it as below)."""
ODD_JSON = json.dumps(ODD)

ODD_VALUES = {
    "lone surrogate": ('"\\udc80"', "surrogate"),
    "50,000-deep": ("[" * 50_000 + "]" * 50_000, "nesting"),
    "huge integer": ("9" * 5_000, "number"),
    "long integer": ("9" * 1_001, "number"),
    "NaN": ("NaN", "finite"),
    "Infinity": ("-Infinity", "finite"),
    "1e999": ("1e999", "finite"),
}
"""Raw JSON text of each odd value, and a word the answer must carry."""


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    body: Any | None
    """A valid body (None: the route takes none)."""
    headers: tuple[tuple[str, str], ...] = ()
    empty_is_valid: bool = False
    """E2B's create takes an empty body for `{}`, as E2B does."""


SUBMISSION = {"type": "python", "solution": "print(1)", "input": "", "expected_output": "1"}
EXECUTE = {
    "code": "print(1)",
    "stdin": "",
    "files": {"in.txt": "aGk="},
    "fetch_files": ["in.txt"],
    "group": "g",
}
WIRE_ROUTES = (
    Route("POST", "/execute", {"generated_code": "print(1)", "timeout": 5, "language": "python"}),
    Route("POST", "/open-instruct/execute", {"code": "print(1)", "timeout": 3}),
    Route(
        "POST",
        "/sandboxes",
        {"templateID": "code-interpreter-v1", "metadata": {"k": "v"}},
        empty_is_valid=True,
    ),
    Route(
        "POST",
        "/mcp",
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        (("accept", "application/json, text/event-stream"),),
    ),
)
"""The peer wires outside the OpenAPI document (compat/wires.py), with a valid body each."""

BODIES = {
    "/execute": EXECUTE,
    "/execute/batch": {"requests": [EXECUTE]},
    "/sessions/{session_id}/fork": {"n": 1},
    "/run": SUBMISSION,
    "/judge": SUBMISSION,
    "/run/batch": {"sub_id": "b", "submissions": [SUBMISSION]},
    "/run/long-batch": {"sub_id": "b", "submissions": [SUBMISSION]},
    "/judge/batch": {"sub_id": "b", "submissions": [SUBMISSION]},
    "/judge/long-batch": {"sub_id": "b", "submissions": [SUBMISSION]},
    "/run_code": {
        "code": "print(1)",
        "language": "python",
        "stdin": "",
        "files": {"in.txt": "aGk="},
        "fetch_files": ["in.txt"],
    },
    "/run_jupyter": {"cells": ["1"], "kernel": "python3", "files": {"in.txt": "aGk="}},
    "/verify": {"items": [{"answer": "1", "reference": "1"}]},
    # stdio: every leaf has one type (a function case's args and expected take any JSON value)
    "/grade": {
        "code": "print(input())",
        "tests": {"kind": "stdio", "cases": [{"stdin": "2", "expected_stdout": "2"}]},
    },
    "/grade/batch": {
        "requests": [
            {"code": "print(2)", "tests": {"kind": "stdio", "cases": [{"expected_stdout": "2"}]}}
        ]
    },
}
"""A valid body of each OpenAPI operation that takes one."""


def openapi_routes(document: dict[str, Any]) -> list[Route]:
    routes = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            body = BODIES[path] if "requestBody" in operation else None
            concrete = path.replace("{session_id}", "s-edge").replace("{group}", "g-edge")
            routes.append(Route(method.upper(), concrete, body))
    return routes


def _with(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[at[0]] = _with(value[at[0]], at[1:], new)
    return copy


def _places(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every value in the body (not the body itself), with where it is."""
    if at:
        yield at, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _places(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _places(item, (*at, index))


@dataclass(frozen=True)
class Odd:
    what: str
    content: bytes
    word: str
    """A word the answer must carry (empty: any 4xx body that says something)."""
    content_type: str = "application/json"


def odd_bodies(route: Route) -> Iterator[Odd]:
    """Each odd shape of a route's body (for a route without one, those of `{}`)."""
    body = route.body
    base = {} if body is None else body
    for name, (raw, word) in ODD_VALUES.items():
        yield Odd(f"{name} as the body", raw.encode(), word)
        for at, _ in _places(base):
            text = json.dumps(_with(base, at, ODD)).replace(ODD_JSON, raw)
            yield Odd(f"{name} at {list(at)}", text.encode(), word)
    duplicated = '{"k": 1, "k": 2}' if not base else json.dumps(base)[:-1] + ', "k": 1, "k": 2}'
    yield Odd("a key twice", duplicated.encode(), "twice")
    yield Odd("bytes not UTF-8", json.dumps(base).encode()[:-1] + b', "\xff\xfe": 1}', "UTF-8")
    yield Odd("a surrogate key", b'{"\\ud800": 1}', "surrogate")
    yield Odd("text/plain", json.dumps(base).encode(), "content-type", "text/plain")
    yield Odd("a form", b"code=print(1)", "content-type", "application/x-www-form-urlencoded")
    if body is None:
        return
    if not route.empty_is_valid:
        yield Odd("an empty body", b"", "")
    for wrong in ([], "text", 5, None, True):
        yield Odd(f"{json.dumps(wrong)} as the body", json.dumps(wrong).encode(), "")
    for at, value in _places(base):
        wrong = 5 if isinstance(value, str) else "text"
        yield Odd(
            f"a {type(wrong).__name__} at {list(at)}",
            json.dumps(_with(base, at, wrong)).encode(),
            "",
        )


async def _send(http: httpx.AsyncClient, route: Route, odd: Odd) -> httpx.Response:
    headers = {"content-type": odd.content_type, **dict(route.headers)}
    return await http.request(route.method, route.path, content=odd.content, headers=headers)


async def test_every_route_answers_every_odd_body_with_a_4xx_naming_it(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
        document = (await http.get("/openapi.json")).json()
        routes = [*openapi_routes(document), *WIRE_ROUTES]
        assert len(routes) >= 20, routes
        wrong: list[str] = []
        sent = 0
        for route in routes:
            for odd in odd_bodies(route):
                sent += 1
                try:
                    response = await _send(http, route, odd)
                except httpx.HTTPError as exc:
                    wrong.append(f"{route.method} {route.path}, {odd.what}: {exc!r}")
                    continue
                text = response.text
                if not 400 <= response.status_code < 500 or odd.word.lower() not in text.lower():
                    shown = text[:300]
                    wrong.append(
                        f"{route.method} {route.path}, {odd.what}: {response.status_code} {shown}"
                    )
                elif not text.strip():
                    wrong.append(f"{route.method} {route.path}, {odd.what}: an empty answer")
        assert not wrong, f"{len(wrong)} of {sent}:\n" + "\n".join(wrong[:80])
        assert (await http.get("/readyz")).status_code == 200
        ran = await http.post("/execute", json={"code": "print(6 * 7)"})
        assert ran.status_code == 200 and ran.json()["stdout"] == "42\n", ran.text


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        (
            "/run/batch",
            b'{"sub_id": "\\udc80", "submissions": [{"type": "python", "solution": "1"}]}',
            ["sub_id"],
        ),
        (
            "/run_code",
            b'{"code": "1", "language": "python", "files": {"a": '
            + b"[" * 50_000
            + b"]" * 50_000
            + b"}}",
            [],
        ),
    ],
    ids=["surrogate sub_id", "deep files"],
)
async def test_the_two_known_breaks_answer_422(
    stack: Stack, path: str, body: bytes, loc: list[str]
) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
        response = await http.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["body", *loc]
