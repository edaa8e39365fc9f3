"""docs/api.md's example request of every route, sent as written to a real service: each is
a well-formed request that the route answers with its success code."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROUTE = re.compile(r"^### `(GET|POST|PUT|PATCH|DELETE) (/\S*)`$", re.M)
EXAMPLE = re.compile(r"Example:\n\n```\n(.*?)\n```", re.S)
SUCCESS = {"DELETE": 204}
"""The success code of a route by method (200 otherwise)."""
BEFORE = {
    # What must exist for the example to succeed: the session it names, the group it cancels.
    "/sessions/my-session": {"code": "x = 1", "session_id": "my-session"},
    "/groups/step-12": {"code": "import time; time.sleep(30)", "group": "step-12"},
}


def examples() -> list[tuple[str, str, str]]:
    """(route heading, method, the example's curl command) for every route, in page order."""
    text = API_DOC.read_text().split("\n## Routes\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for match in ROUTE.finditer(text):
        section = text[match.end() :].split("\n### ", 1)[0]
        commands = EXAMPLE.findall(section)
        assert len(commands) == 1, f"{match[0]} has {len(commands)} examples, not one"
        found.append((f"{match[1]} {match[2]}", match[1], commands[0]))
    return found


def parse_curl(command: str) -> tuple[str, str, Any]:
    """(method, path, JSON body or None) of a `curl -s [-X M] localhost:8000/path [-d '...']`."""
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["curl", "-s"], command
    method, body, path = "GET", None, None
    rest = iter(words[2:])
    for word in rest:
        if word == "-X":
            method = next(rest)
        elif word == "-d":
            body = json.loads(next(rest))
            method = "POST" if method == "GET" else method
        elif word == "-H":
            assert next(rest) == "content-type: application/json"
        else:
            assert word.startswith("localhost:8000/"), word
            path = word.removeprefix("localhost:8000")
    assert path is not None, command
    return method, path, body


def test_every_route_has_an_example_of_its_own_method_and_path() -> None:
    found = examples()
    assert len(found) >= 18
    for heading, method, command in found:
        sent_method, path, _ = parse_curl(command)
        template = re.escape(heading.split(" ", 1)[1])
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", template)
        assert sent_method == method and re.fullmatch(pattern, path), (heading, command)


@pytest.mark.parametrize(("heading", "command"), [(h, c) for h, _, c in examples()])
async def test_the_example_succeeds(client: httpx.AsyncClient, heading: str, command: str) -> None:
    method, path, body = parse_curl(command)
    running = None
    for prefix, setup in BEFORE.items():
        if path.startswith(prefix) and "group" in setup:
            running = asyncio.create_task(client.post("/execute", json=setup))
            await asyncio.sleep(1.0)  # admitted: the group exists
        elif path.startswith(prefix):
            assert (await client.post("/execute", json=setup)).status_code == 200
    response = await client.request(method, path, json=body)
    assert response.status_code == SUCCESS.get(method, 200), (heading, response.text)
    if path == "/execute":
        assert response.json()["stdout"] == "45\n"
    if running is not None:
        assert (await running).json()["status"] == "cancelled"
