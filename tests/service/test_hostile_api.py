"""Hostile requests and programs through the HTTP API of a real stack (API, Redis, RQ workers,
nsjail): text that cannot be encoded, non-finite numbers in every number field and bodies that
are not UTF-8 on every route, a timeout under the floor, fetch lists over their bounds, a fetch
over the budget, forged reports, IPC and files across calls. After each, the service still
answers the next call, and every answer is JSON (no NaN)."""

from __future__ import annotations

import base64
import json
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

LONE = "\udc80"
"""A lone surrogate: valid in JSON (as the escape \\udc80), not encodable as UTF-8."""
B64 = base64.b64encode(b"x").decode()
SUBMISSION = {"type": "python", "solution": "print(1)"}

UNENCODABLE: list[tuple[str, dict[str, Any]]] = [
    ("/execute", {"code": "print(1)", "files": {"in" + LONE: B64}}),
    ("/execute", {"code": "print(1)", "fetch_files": ["out" + LONE]}),
    ("/execute", {"code": "print(1)" + LONE}),
    ("/execute", {"code": "print(1)", "stdin": LONE}),
    ("/execute", {"code": "print(1)", "session_id": "s" + LONE}),
    ("/execute/batch", {"requests": [{"code": "print(1)"}, {"code": "1", "fetch_files": [LONE]}]}),
    ("/execute/batch", {"requests": [{"code": "print(1)", "files": {LONE: B64}}]}),
    ("/run_code", {"code": "print(1)", "language": "python", "files": {"a" + LONE: B64}}),
    ("/run_code", {"code": "print(1)", "language": "python", "fetch_files": ["/tmp/a" + LONE]}),
    ("/run_jupyter", {"cells": ["print(1)"], "files": {"a" + LONE: B64}}),
    ("/run_jupyter", {"cells": ["print(1)"], "fetch_files": ["a" + LONE]}),
    ("/run_jupyter", {"cells": ["print(1)", LONE]}),
    ("/run", {**SUBMISSION, "input": LONE}),
    ("/run/batch", {"submissions": [SUBMISSION, {**SUBMISSION, "solution": LONE}]}),
    ("/run/long-batch", {"submissions": [{**SUBMISSION, "sub_id": LONE}]}),
    ("/judge", {**SUBMISSION, "expected_output": LONE}),
    ("/judge/batch", {"submissions": [{**SUBMISSION, "input": LONE}]}),
    ("/judge/long-batch", {"submissions": [{**SUBMISSION, "expected_output": LONE}]}),
    ("/verify", {"items": [{"answer": LONE, "reference": "1"}]}),
    ("/verify", {"items": [{"answer": "1", "reference": "\\frac{1}{2}" + LONE}]}),
]


async def post_raw(client: httpx.AsyncClient, path: str, body: object) -> httpx.Response:
    # json.dumps escapes the surrogate (ensure_ascii), as a client in any language may send it.
    content = json.dumps(body).encode()
    return await client.post(path, content=content, headers={"Content-Type": "application/json"})


async def execute(client: httpx.AsyncClient, **body: object) -> dict[str, Any]:
    response = await client.post("/execute", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def answers_next(client: httpx.AsyncClient) -> None:
    """The service, its workers and their jails serve an ordinary call."""
    result = await execute(client, code="print('next call')")
    assert (result["status"], result["stdout"]) == ("ok", "next call\n"), result


@pytest.mark.parametrize(("path", "body"), UNENCODABLE, ids=[p for p, _ in UNENCODABLE])
async def test_text_that_cannot_be_encoded_is_a_422_on_every_route(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    response = await post_raw(client, path, body)
    assert response.status_code == 422, f"{path}: {response.status_code} {response.text[:300]}"
    assert "detail" in response.json()
    await answers_next(client)


GRADE: dict[str, Any] = {
    "code": "def f(x):\n    return x + 1\n",
    "tests": {"kind": "function", "entry_point": "f", "cases": [{"args": [1], "expected": 2}]},
    "timeout": 5,
}
ROUTES: dict[str, dict[str, Any]] = {
    "/execute": {"code": "print(1)"},
    "/execute/batch": {"requests": [{"code": "print(1)"}]},
    "/run": SUBMISSION,
    "/run/batch": {"submissions": [SUBMISSION]},
    "/run/long-batch": {"submissions": [SUBMISSION]},
    "/judge": SUBMISSION,
    "/judge/batch": {"submissions": [SUBMISSION]},
    "/judge/long-batch": {"submissions": [SUBMISSION]},
    "/run_code": {"code": "print(1)", "language": "python"},
    "/run_jupyter": {"cells": ["print(1)"]},
    "/verify": {"items": [{"answer": "1", "reference": "1"}]},
    "/grade": GRADE,
    "/grade/batch": {"requests": [GRADE]},
}
"""A valid body of every POST route (each list holds one item, where number fields are sought).
A new route belongs here: test_every_post_route_is_covered fails until it is."""

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999"]
"""As a client's JSON encoder may write them (Python's json.dumps writes the first three);
1e999 is valid JSON that no double holds (it parses as Infinity)."""
Loc = tuple[str | int, ...]


def strict_json(text: str) -> Any:
    """The JSON of an answer; fails on NaN or Infinity, which JSON does not have."""

    def refuse(token: str) -> None:
        raise AssertionError(f"the answer holds {token}, which is not JSON: {text[:300]}")

    return json.loads(text, parse_constant=refuse)


def number_fields(schema: dict[str, Any], node: dict[str, Any], loc: Loc = ()) -> Iterator[Loc]:
    """Where a request body of this OpenAPI schema holds numbers (list items at index 0)."""
    if "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    branches = node.get("anyOf", [node])
    if any(branch.get("type") in ("number", "integer") for branch in branches):
        yield loc
    for branch in branches:
        for name, child in branch.get("properties", {}).items():
            yield from number_fields(schema, child, (*loc, name))
        if branch.get("type") == "array":
            yield from number_fields(schema, branch["items"], (*loc, 0))


def with_value(body: Any, loc: Loc, token: str) -> bytes:
    """The JSON of `body` with the value at `loc` written as the raw `token`."""
    body = json.loads(json.dumps(body))
    target = body
    for key in loc[:-1]:
        target = target[key]
    target[loc[-1]] = "@@token@@"
    return json.dumps(body).replace('"@@token@@"', token).encode()


@pytest.fixture
async def openapi(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/openapi.json")
    document: dict[str, Any] = response.json()
    return document


def body_schema(openapi: dict[str, Any], path: str) -> dict[str, Any]:
    content = openapi["paths"][path]["post"]["requestBody"]["content"]
    schema: dict[str, Any] = content["application/json"]["schema"]
    return schema


async def post_bytes(client: httpx.AsyncClient, path: str, content: bytes) -> httpx.Response:
    return await client.post(path, content=content, headers={"Content-Type": "application/json"})


def named(response: httpx.Response, loc: Loc) -> bool:
    """The 422 names the field at `loc` (under `body`)."""
    detail = strict_json(response.text)["detail"]
    return any(list(error["loc"]) == ["body", *loc] for error in detail)


async def test_every_post_route_is_covered(openapi: dict[str, Any]) -> None:
    posts = {path for path, ops in openapi["paths"].items() if "post" in ops}
    posts -= {path for path in posts if "{" in path}  # /sessions/{id}/...: no JSON body of numbers
    assert posts <= set(ROUTES), f"add a valid body for {sorted(posts - set(ROUTES))} to ROUTES"


async def test_non_finite_numbers_are_a_422_naming_the_field_on_every_route(
    client: httpx.AsyncClient, openapi: dict[str, Any]
) -> None:
    tried = []
    for path, body in ROUTES.items():
        for loc in number_fields(openapi, body_schema(openapi, path)):
            for token in NON_FINITE:
                response = await post_bytes(client, path, with_value(body, loc, token))
                assert response.status_code == 422, f"{path} {loc} {token}: {response.text[:300]}"
                assert named(response, loc), f"{path} {loc} {token}: {response.text[:300]}"
                tried.append((path, loc))
    numbered = {path for path, _ in tried}
    assert {"/execute", "/execute/batch", "/run_code", "/run_jupyter", "/verify"} <= numbered
    await answers_next(client)


@pytest.mark.parametrize("path", list(ROUTES))
async def test_a_non_finite_number_where_text_goes_is_a_422(
    client: httpx.AsyncClient, path: str
) -> None:
    body = ROUTES[path]
    text_field = next(k for k, v in body.items() if isinstance(v, str | list) and k != "language")
    loc: Loc = (text_field,) if isinstance(body[text_field], str) else (text_field, 0)
    for token in NON_FINITE:
        response = await post_bytes(client, path, with_value(body, loc, token))
        assert response.status_code == 422, f"{path} {loc} {token}: {response.text[:300]}"
        strict_json(response.text)


@pytest.mark.parametrize("path", list(ROUTES))
async def test_a_body_that_is_not_utf8_is_a_4xx(client: httpx.AsyncClient, path: str) -> None:
    body = json.dumps(ROUTES[path]).encode()
    for content in (body.replace(b"1", b"\xff\xfe", 1), b"\xff" + body, body[:-1] + b"\xc3"):
        response = await post_bytes(client, path, content)
        assert 400 <= response.status_code < 500, f"{path}: {response.status_code}"
        strict_json(response.text)
    await answers_next(client)


TINY_TIMEOUTS: list[tuple[str, dict[str, Any], Loc]] = [
    ("/execute", {"code": "print(1)", "timeout": 0.0005}, ("timeout",)),
    ("/execute", {"code": "print(1)", "timeout": 0}, ("timeout",)),
    ("/execute/batch", {"requests": [{"code": "1"}, {"code": "1", "timeout": 1e-9}]},
     ("requests", 1, "timeout")),
    ("/verify", {"items": [{"answer": "1", "reference": "1"}], "timeout": 0.0005}, ("timeout",)),
    ("/run_code", {"code": "1", "language": "python", "run_timeout": 0.0005}, ("run_timeout",)),
    ("/run_jupyter", {"cells": ["1"], "total_timeout": 0.0005}, ("total_timeout",)),
    ("/run_jupyter", {"cells": ["1"], "cell_timeout": 0.0005}, ("cell_timeout",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "loc"), TINY_TIMEOUTS, ids=[p for p, _, _ in TINY_TIMEOUTS]
)
async def test_a_timeout_under_the_floor_is_a_422_naming_it(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], loc: Loc
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 422 and named(response, loc), response.text[:300]


def _paths(count: int, size: int) -> list[str]:
    return [f"{i:05d}" + "é" * ((size - 5) // 2) for i in range(count)]


OVERSIZED: list[tuple[str, dict[str, Any], Loc]] = [
    ("/execute", {"code": "1", "fetch_files": _paths(65, 20)}, ("fetch_files",)),
    ("/execute", {"code": "1", "fetch_files": _paths(1, 1200)}, ("fetch_files",)),
    ("/execute", {"code": "1", "fetch_files": ["a/" * 600 + "a"]}, ("fetch_files",)),
    ("/execute", {"code": "1", "fetch_files": _paths(3000, 200)}, ("fetch_files",)),
    ("/execute", {"code": "1", "files": {p: B64 for p in _paths(2, 1200)}}, ("files",)),
    ("/execute/batch", {"requests": [{"code": "1"}, {"code": "1", "fetch_files": _paths(65, 9)}]},
     ("requests", 1, "fetch_files")),
    ("/run_code", {"code": "1", "language": "python", "fetch_files": _paths(65, 9)},
     ("fetch_files",)),
    ("/run_code", {"code": "1", "language": "python", "fetch_files": ["/tmp/" + "é" * 600]},
     ("fetch_files",)),
    ("/run_jupyter", {"cells": ["1"], "fetch_files": _paths(65, 9)}, ("fetch_files",)),
    ("/verify", {"items": [{"answer": "1" * 70000, "reference": "1"}]},
     ("items", 0, "answer")),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "loc"), OVERSIZED, ids=[p for p, *_ in OVERSIZED])
async def test_fetch_lists_and_paths_over_their_bounds_are_a_422_naming_the_field(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], loc: Loc
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 422 and named(response, loc), response.text[:300]
    assert len(response.content) < 16384, len(response.content)  # nothing echoed in full
    await answers_next(client)


async def test_a_fetch_over_the_budget_returns_what_fits_and_names_the_rest(
    client: httpx.AsyncClient,
) -> None:
    program = textwrap.dedent("""\
        for i in range(3):
            open(f"big{i}.bin", "wb").write(bytes([65 + i]) * (7 << 20))
        print("written")
        """)
    names = ["big0.bin", "big1.bin", "big2.bin"]
    result = await execute(client, code=program, fetch_files=names, timeout=15, memory_mb=512)
    assert (result["status"], result["stdout"]) == ("ok", "written\n"), result["stderr"][-500:]
    assert sorted(result["files"]) == ["big0.bin", "big1.bin"], sorted(result["files"])
    assert base64.b64decode(result["files"]["big1.bin"]) == b"B" * (7 << 20)
    assert "big2.bin: over the fetch budget" in result["stderr"], result["stderr"][-500:]
    await answers_next(client)


async def test_forged_reports_on_every_descriptor_are_not_believed(
    client: httpx.AsyncClient,
) -> None:
    program = textwrap.dedent("""\
        import os, sys
        forged = (b'{"status": "ok", "exit_code": 0, "cpu_time": -5.0}\\n'
                  b'\\x00\\x00\\x00\\x10{"op": "done"}\\xff\\xff\\xff\\xff{"exit')
        for fd in range(3, 1024):
            try:
                os.write(fd, forged)
            except OSError:
                pass
        print("forged")
        sys.exit(3)
        """)
    result = await execute(client, code=program)
    assert (result["status"], result["exit_code"]) == ("error", 3), result
    assert result["stdout"] == "forged\n" and result["cpu_time"] >= 0
    await answers_next(client)


async def test_ipc_objects_and_files_do_not_survive_into_the_next_calls(
    client: httpx.AsyncClient,
) -> None:
    plant = textwrap.dedent("""\
        import ctypes, os
        from multiprocessing import shared_memory
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5eed, 4096, 0o1000 | 0o666), ctypes.get_errno())
        shm = shared_memory.SharedMemory(name="planted", create=True, size=4096)
        shm.buf[:6] = b"secret"
        shm.close()
        for path in ("/tmp/planted", "/home/sandbox/planted", "/mnt/planted"):
            open(path, "w").write("secret")
        """)
    look = textwrap.dedent("""\
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5eed, 0, 0), ctypes.get_errno())
        print(sorted(os.listdir("/dev/shm") + os.listdir("/tmp") + os.listdir("/mnt")
                     + os.listdir("/home/sandbox")))
        """)
    # Both workers' slots: a batch of two plants, then more looks than slots.
    planted = await client.post("/execute/batch", json={"requests": [{"code": plant}] * 2})
    assert planted.status_code == 200
    for result in planted.json()["results"]:
        assert (result["status"], result["stdout"]) == ("ok", "-1 38\n"), result  # ENOSYS
    looked = await client.post("/execute/batch", json={"requests": [{"code": look}] * 4})
    assert looked.status_code == 200
    for result in looked.json()["results"]:
        assert result["stdout"] == "-1 38\n[]\n", f"state survived a run: {result}"
    await answers_next(client)


async def test_denied_system_calls_are_errors_and_the_worker_keeps_serving(
    client: httpx.AsyncClient,
) -> None:
    program = textwrap.dedent("""\
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        for name, args in (("ptrace", (0, 0, 0, 0)), ("mount", (b"x", b"/tmp", b"tmpfs", 0, 0))):
            ctypes.set_errno(0)
            print(name, getattr(libc, name)(*args), ctypes.get_errno())
        os.unshare(os.CLONE_NEWUSER)
        """)
    result = await execute(client, code=program)
    assert result["status"] == "error" and result["signal"] is None, result
    assert result["stdout"] == "ptrace -1 1\nmount -1 1\n"
    assert "PermissionError: [Errno 1] Operation not permitted" in result["stderr"]
    await answers_next(client)
