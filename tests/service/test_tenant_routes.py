"""Every route that names a tenant's object, tried with another tenant's key, through the real
service (API, workers, Redis, jails) with two tenants from a tenants file.

Amber makes the object (a session, a fork, a group, a NeMo-Skills session, an E2B sandbox or
code context, an MCP session over streamable HTTP or SSE); birch names it on one route. Birch
must get the route's not-found answer, the very answer it gets for an id nobody uses (so it
learns nothing of amber's), with none of amber's name, key or output in it; and amber's object
must still work, unchanged. Client-chosen names used by both tenants are two objects.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_service.local.redis_server import RedisServer
from tests.service.stack import Stack, stack_env
from tests.service.two_tenants import AMBER, BIRCH, TENANTS

SECRET = "amber-output-7f3a"
SLOW = f"import time; time.sleep(2.5); print({SECRET!r})"
"""Amber's call that is still running when birch names its group."""
ADMITTED_S = 1.0
AMBERS_TRACES = ("amber", "key-amber", SECRET)
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
MCP_VERSION = "2025-06-18"
JUPYTER, ENVD = "49999", "49983"


@pytest.fixture(scope="module")
def routes_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    path = logs_dir / "tenant-routes.toml"
    path.write_text(TENANTS)
    env = stack_env(redis_server.url, "tenant-routes", 66100, max_timeout=30)
    stack = Stack({**env, "RL_SANDBOX_TENANTS_FILE": str(path)}, logs_dir / "tenant-routes.log")
    yield stack.start()
    stack.stop()


@pytest.fixture
async def http(routes_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=routes_stack.url, timeout=60) as client:
        yield client


# --- amber's objects: made, and checked intact --------------------------------------------------


@dataclass
class Owned:
    """One object of amber's: the id birch will name, and how amber checks it still works."""

    ident: str
    intact: Callable[[], Awaitable[None]]
    cleanup: list[Callable[[], Awaitable[object]]] = field(default_factory=list)


async def execute(
    http: httpx.AsyncClient, headers: dict[str, str], code: str, **body: object
) -> dict[str, Any]:
    response = await http.post("/execute", json={"code": code, **body}, headers=headers)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def session_holding_secret(http: httpx.AsyncClient, session: str) -> Owned:
    made = await execute(http, AMBER, f"secret = {SECRET!r}", session_id=session)
    assert made["status"] == "ok", made

    async def intact() -> None:
        answer = await execute(http, AMBER, "print(secret)", session_id=session)
        assert answer["stdout"] == f"{SECRET}\n", answer

    end = lambda: http.delete(f"/sessions/{session}", headers=AMBER)  # noqa: E731
    return Owned(session, intact, [end])


async def make_session(http: httpx.AsyncClient) -> Owned:
    return await session_holding_secret(http, f"amber-{uuid.uuid4().hex[:8]}")


async def make_fork(http: httpx.AsyncClient) -> Owned:
    parent = await make_session(http)
    made = await http.post(f"/sessions/{parent.ident}/fork", json={"n": 1}, headers=AMBER)
    assert made.status_code == 200, made.text
    (fork,) = made.json()["session_ids"]
    owned = await session_holding_secret(http, fork)
    owned.cleanup += parent.cleanup
    return owned


async def make_group(http: httpx.AsyncClient) -> Owned:
    group = f"amber-{uuid.uuid4().hex[:8]}"
    assert (await execute(http, AMBER, "pass", group=group))["status"] == "ok"
    running = asyncio.create_task(execute(http, AMBER, SLOW, group=group))
    await asyncio.sleep(ADMITTED_S)

    async def intact() -> None:
        answer = await running
        assert answer["status"] == "ok" and answer["stdout"] == f"{SECRET}\n", answer

    return Owned(group, intact)


async def nemo(
    http: httpx.AsyncClient, headers: dict[str, str], session: str, code: str
) -> dict[str, Any]:
    body = {"generated_code": code, "language": "ipython", "timeout": 10}
    response = await http.post("/execute", json=body, headers={**headers, "X-Session-ID": session})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def make_nemo_session(http: httpx.AsyncClient) -> Owned:
    session = f"amber-{uuid.uuid4().hex[:8]}"
    assert (await nemo(http, AMBER, session, f"secret = {SECRET!r}"))["stderr"] == ""

    async def intact() -> None:
        answer = await nemo(http, AMBER, session, "print(secret)")
        assert answer["stdout"] == f"{SECRET}\n", answer

    end = lambda: http.delete(f"/sessions/{session}", headers=AMBER)  # noqa: E731
    return Owned(session, intact, [end])


@dataclass(frozen=True)
class Sandbox:
    sandbox_id: str
    token: str

    def plane(self, port: str) -> dict[str, str]:
        """The data plane's headers of this sandbox (its token is its credential)."""
        return {
            "E2b-Sandbox-Id": self.sandbox_id,
            "E2b-Sandbox-Port": port,
            "X-Access-Token": self.token,
        }


async def create_sandbox(http: httpx.AsyncClient, headers: dict[str, str]) -> Sandbox:
    body = {"timeout": 120, "metadata": {"owner": SECRET if headers is AMBER else "birch"}}
    created = await http.post("/v2/sandboxes", json=body, headers=headers)
    assert created.status_code == 201, created.text
    return Sandbox(created.json()["sandboxID"], created.json()["envdAccessToken"])


async def make_sandbox(http: httpx.AsyncClient) -> Owned:
    sandbox = await create_sandbox(http, AMBER)
    path = f"/sandboxes/{sandbox.sandbox_id}"
    before = (await http.get(path, headers=AMBER)).json()

    async def intact() -> None:
        detail = await http.get(path, headers=AMBER)
        assert detail.status_code == 200 and detail.json() == before, detail.text
        health = await http.get("/health", headers=sandbox.plane(ENVD))
        assert health.status_code == 204, health.text

    return Owned(sandbox.sandbox_id, intact, [lambda: http.delete(path, headers=AMBER)])


async def run_cell(http: httpx.AsyncClient, sandbox: Sandbox, context: str, code: str) -> str:
    body = {"code": code, "context_id": context}
    response = await http.post("/execute", json=body, headers=sandbox.plane(JUPYTER))
    assert response.status_code == 200, response.text
    return response.text


async def make_context(http: httpx.AsyncClient) -> Owned:
    sandbox = await create_sandbox(http, AMBER)
    created = await http.post("/contexts", json={}, headers=sandbox.plane(JUPYTER))
    assert created.status_code == 200, created.text
    context = created.json()["id"]
    await run_cell(http, sandbox, context, f"secret = {SECRET!r}")

    async def intact() -> None:
        assert SECRET in await run_cell(http, sandbox, context, "print(secret)")

    kill = lambda: http.delete(f"/sandboxes/{sandbox.sandbox_id}", headers=AMBER)  # noqa: E731
    return Owned(context, intact, [kill])


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE body's `data:` lines."""
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def rpc(method: str, ident: int | None = None, **params: object) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    return message if ident is None else {**message, "id": ident}


INITIALIZE = rpc(
    "initialize",
    1,
    protocolVersion=MCP_VERSION,
    capabilities={},
    clientInfo={"name": "tenant-routes", "version": "0"},
)


async def make_mcp_session(http: httpx.AsyncClient) -> Owned:
    opened = await http.post("/mcp", json=INITIALIZE, headers={**AMBER, **MCP_HEADERS})
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    headers = mcp_session_headers(AMBER, session)
    initialized = await http.post("/mcp", json=rpc("notifications/initialized"), headers=headers)
    assert initialized.status_code == 202, initialized.text

    async def call(code: str) -> str:
        called = rpc("tools/call", 2, name="python", arguments={"code": code})
        response = await http.post("/mcp", json=called, headers=headers)
        assert response.status_code == 200, response.text
        (answer,) = sse_messages(response.text)
        return str(answer["result"]["content"][0]["text"])

    await call(f"secret = {SECRET!r}")

    async def intact() -> None:
        assert SECRET in await call("print(secret)")

    return Owned(session, intact, [lambda: http.delete("/mcp", headers=headers)])


async def make_mcp_sse_session(http: httpx.AsyncClient) -> Owned:
    stream = http.stream("GET", "/mcp/sse", headers=AMBER)
    response = await stream.__aenter__()
    lines = response.aiter_lines()

    async def next_message() -> str:
        async for line in lines:
            if line.startswith("data:"):
                return line[5:].strip()
        raise AssertionError("the SSE stream ended")

    endpoint = await asyncio.wait_for(next_message(), 10)
    session = endpoint.rpartition("session_id=")[2]

    async def post(message: dict[str, Any]) -> dict[str, Any] | None:
        posted = await http.post(endpoint, json=message, headers=AMBER)
        assert posted.status_code == 202, posted.text
        if "id" not in message:
            return None
        answer: dict[str, Any] = json.loads(await asyncio.wait_for(next_message(), 10))
        return answer

    await post(INITIALIZE)
    await post(rpc("notifications/initialized"))

    async def intact() -> None:
        # The next message on amber's stream answers amber's ping: none came from birch's.
        assert await post(rpc("ping", 7)) == {"jsonrpc": "2.0", "id": 7, "result": {}}

    return Owned(session, intact, [lambda: stream.__aexit__(None, None, None)])


MAKERS: dict[str, Callable[[httpx.AsyncClient], Awaitable[Owned]]] = {
    "session": make_session,
    "fork": make_fork,
    "group": make_group,
    "nemo session": make_nemo_session,
    "sandbox": make_sandbox,
    "context": make_context,
    "mcp session": make_mcp_session,
    "mcp sse session": make_mcp_sse_session,
}

UNUSED: dict[str, Callable[[], str]] = {
    "session": lambda: f"amber-{uuid.uuid4().hex[:8]}",
    "fork": lambda: f"fork-{uuid.uuid4().hex}",
    "group": lambda: f"amber-{uuid.uuid4().hex[:8]}",
    "nemo session": lambda: f"amber-{uuid.uuid4().hex[:8]}",
    "sandbox": lambda: secrets.token_hex(10),
    "context": lambda: secrets.token_hex(8),
    "mcp session": lambda: uuid.uuid4().hex,
    "mcp sse session": lambda: uuid.uuid4().hex,
}
"""A fresh id of each object's shape, which nobody uses."""


# --- the routes, each with birch's key ----------------------------------------------------------

Probe = Callable[[httpx.AsyncClient, str, Sandbox], Awaitable[httpx.Response]]
"""Birch's request naming `ident` (with birch's own sandbox, for the E2B data plane)."""


@dataclass(frozen=True)
class Route:
    """A route that names one of amber's objects (its id as `spelled`), and its not-found
    status."""

    name: str
    thing: str
    probe: Probe
    not_found: int = 404
    spelled: str = "{id}"


def nemo_delete(http: httpx.AsyncClient, ident: str, _: Sandbox) -> Awaitable[httpx.Response]:
    return http.delete(f"/sessions/{ident}", headers={**BIRCH, "X-Session-ID": ident})


def mcp_session_headers(key: dict[str, str], session: str) -> dict[str, str]:
    return {**key, **MCP_HEADERS, "mcp-session-id": session, "mcp-protocol-version": MCP_VERSION}


def mcp_request(method: str, body: object = None) -> Probe:
    def probe(http: httpx.AsyncClient, ident: str, _: Sandbox) -> Awaitable[httpx.Response]:
        headers = mcp_session_headers(BIRCH, ident)
        # A short timeout: a GET let into amber's session would stream her events, never end.
        return http.request(method, "/mcp", json=body, headers=headers, timeout=10)

    return probe


def amber_sandbox_plane(method: str, port: str, path: str, body: object = None) -> Probe:
    """A data-plane request to amber's sandbox with birch's key and birch's sandbox token."""

    def probe(http: httpx.AsyncClient, ident: str, birch: Sandbox) -> Awaitable[httpx.Response]:
        headers = {**BIRCH, **birch.plane(port), "E2b-Sandbox-Id": ident}
        return http.request(method, path, json=body, headers=headers)

    return probe


def own_sandbox_plane(method: str, path: str, body: object = None) -> Probe:
    """A request naming amber's code context on birch's own sandbox."""

    def probe(http: httpx.AsyncClient, ident: str, birch: Sandbox) -> Awaitable[httpx.Response]:
        filled = None if body is None else json.loads(json.dumps(body).replace("{id}", ident))
        return http.request(
            method, path.format(id=ident), json=filled, headers=birch.plane(JUPYTER)
        )

    return probe


def plain(method: str, path: str, body: object = None) -> Probe:
    def probe(http: httpx.AsyncClient, ident: str, _: Sandbox) -> Awaitable[httpx.Response]:
        return http.request(method, path.format(id=ident), json=body, headers=BIRCH)

    return probe


def e2b_key(method: str, path: str, body: object = None) -> Probe:
    """A control-plane request with the E2B SDK's key header."""

    def probe(http: httpx.AsyncClient, ident: str, _: Sandbox) -> Awaitable[httpx.Response]:
        headers = {"X-API-KEY": BIRCH["Authorization"].removeprefix("Bearer ")}
        return http.request(method, path.format(id=ident), json=body, headers=headers)

    return probe


ROUTES = [
    Route("DELETE /sessions/{id}", "session", plain("DELETE", "/sessions/{id}")),
    Route("POST /sessions/{id}/fork", "session", plain("POST", "/sessions/{id}/fork", {"n": 1})),
    Route("NeMo DELETE /sessions/{id} of a native session", "session", nemo_delete),
    Route("DELETE /sessions/{fork}", "fork", plain("DELETE", "/sessions/{id}")),
    Route("POST /sessions/{fork}/fork", "fork", plain("POST", "/sessions/{id}/fork", {"n": 1})),
    Route("POST /groups/{group}/cancel", "group", plain("POST", "/groups/{id}/cancel")),
    Route(
        "POST /groups/{group}/cancel spelled as stored",
        "group",
        plain("POST", "/groups/{id}/cancel"),
        spelled="amber/{id}",
    ),
    Route("NeMo DELETE /sessions/{id}", "nemo session", nemo_delete),
    Route(
        "NeMo DELETE /sessions/{id} spelled as stored",
        "nemo session",
        nemo_delete,
        spelled="amber/{id}",
    ),
    Route(
        "DELETE /sessions/{id} of a NeMo session", "nemo session", plain("DELETE", "/sessions/{id}")
    ),
    Route("GET /sandboxes/{id}", "sandbox", plain("GET", "/sandboxes/{id}")),
    Route("GET /v2/sandboxes/{id}", "sandbox", e2b_key("GET", "/v2/sandboxes/{id}")),
    Route("DELETE /sandboxes/{id}", "sandbox", e2b_key("DELETE", "/sandboxes/{id}")),
    Route(
        "POST /sandboxes/{id}/timeout",
        "sandbox",
        plain("POST", "/sandboxes/{id}/timeout", {"timeout": 5}),
    ),
    Route("POST /sandboxes/{id}/connect", "sandbox", plain("POST", "/sandboxes/{id}/connect", {})),
    Route(
        "POST /v2/sandboxes/{id}/connect",
        "sandbox",
        e2b_key("POST", "/v2/sandboxes/{id}/connect", {"timeout": 5}),
    ),
    Route("GET /sandboxes/{id}/logs", "sandbox", plain("GET", "/sandboxes/{id}/logs")),
    Route("E2B GET /health", "sandbox", amber_sandbox_plane("GET", ENVD, "/health"), 502),
    Route("E2B GET /files", "sandbox", amber_sandbox_plane("GET", ENVD, "/files?path=a"), 502),
    Route("E2B GET /contexts", "sandbox", amber_sandbox_plane("GET", JUPYTER, "/contexts"), 502),
    Route(
        "E2B POST /contexts", "sandbox", amber_sandbox_plane("POST", JUPYTER, "/contexts", {}), 502
    ),
    Route(
        "E2B POST /files",
        "sandbox",
        amber_sandbox_plane("POST", ENVD, "/files?path=a", {"a": "b"}),
        502,
    ),
    Route(
        "E2B POST /execute",
        "sandbox",
        amber_sandbox_plane("POST", JUPYTER, "/execute", {"code": "print(secret)"}),
        502,
    ),
    Route(
        "E2B POST /execute in a context",
        "context",
        own_sandbox_plane("POST", "/execute", {"code": "print(secret)", "context_id": "{id}"}),
    ),
    Route("E2B DELETE /contexts/{id}", "context", own_sandbox_plane("DELETE", "/contexts/{id}")),
    Route(
        "E2B POST /contexts/{id}/restart",
        "context",
        own_sandbox_plane("POST", "/contexts/{id}/restart", {}),
    ),
    Route(
        "POST /mcp (tools/call)",
        "mcp session",
        mcp_request("POST", rpc("tools/call", 3, name="python", arguments={"code": "1"})),
    ),
    Route("GET /mcp", "mcp session", mcp_request("GET")),
    Route("DELETE /mcp", "mcp session", mcp_request("DELETE")),
    Route(
        "POST /mcp/messages/",
        "mcp sse session",
        plain("POST", "/mcp/messages/?session_id={id}", rpc("ping", 9)),
    ),
]


def assert_same_answer(
    seen: httpx.Response, seen_id: str, unused: httpx.Response, unused_id: str
) -> None:
    assert seen.status_code == unused.status_code, (seen.text, unused.text)
    assert seen.text.replace(seen_id, "<id>") == unused.text.replace(unused_id, "<id>")


@pytest.mark.parametrize("route", ROUTES, ids=[route.name for route in ROUTES])
async def test_another_tenants_id_is_not_found_and_left_alone(
    http: httpx.AsyncClient, route: Route
) -> None:
    owned = await MAKERS[route.thing](http)
    birch = await create_sandbox(http, BIRCH)
    try:
        named = route.spelled.format(id=owned.ident)
        seen = await route.probe(http, named, birch)
        unused_id = route.spelled.format(id=UNUSED[route.thing]())
        unused = await route.probe(http, unused_id, birch)
        assert seen.status_code == route.not_found, seen.text
        assert_same_answer(seen, named, unused, unused_id)
        told = seen.text.replace(named, "<id>")  # birch's own words echoed are no leak
        assert not any(trace in told for trace in AMBERS_TRACES), seen.text
        await owned.intact()
    finally:
        await http.delete(f"/sandboxes/{birch.sandbox_id}", headers=BIRCH)
        for end in owned.cleanup:
            await end()


async def test_another_tenants_sandboxes_are_not_listed(http: httpx.AsyncClient) -> None:
    amber = await make_sandbox(http)
    try:
        for query in ("", "?state=running"):
            listed = await http.get(f"/v2/sandboxes{query}", headers=BIRCH)
            assert listed.status_code == 200, listed.text
            assert amber.ident not in listed.text and SECRET not in listed.text, listed.text
        filtered = await http.get(f"/v2/sandboxes?metadata=owner%3D{SECRET}", headers=BIRCH)
        assert filtered.status_code == 200 and filtered.json() == [], filtered.text
        await amber.intact()
    finally:
        for end in amber.cleanup:
            await end()


# --- the same client-chosen name, used by both tenants ------------------------------------------


async def test_a_session_name_of_both_tenants_is_two_sessions(http: httpx.AsyncClient) -> None:
    name = f"shared-{uuid.uuid4().hex[:8]}"
    amber = await session_holding_secret(http, name)
    fresh = await execute(http, BIRCH, "print(secret)", session_id=name)
    assert fresh["status"] == "error" and "NameError" in fresh["stderr"], fresh
    assert not any(trace in json.dumps(fresh) for trace in AMBERS_TRACES)
    body = {"requests": [{"code": "print(secret)", "session_id": name}]}
    batch = await http.post("/execute/batch", json=body, headers=BIRCH)
    assert batch.status_code == 200 and "NameError" in batch.json()["results"][0]["stderr"]
    stored = await execute(http, BIRCH, "print(secret)", session_id=f"amber/{name}")
    assert "NameError" in stored["stderr"], stored  # amber's session as the server names it
    assert (await execute(http, BIRCH, "secret = 'birch'", session_id=name))["status"] == "ok"
    forked = await http.post(f"/sessions/{name}/fork", json={"n": 1}, headers=BIRCH)
    assert forked.status_code == 200, forked.text
    (fork,) = forked.json()["session_ids"]
    assert (await execute(http, BIRCH, "print(secret)", session_id=fork))["stdout"] == "birch\n"
    for session in (name, fork):
        assert (await http.delete(f"/sessions/{session}", headers=BIRCH)).status_code == 204
    await amber.intact()
    assert (await http.delete(f"/sessions/{name}", headers=AMBER)).status_code == 204


async def test_a_nemo_session_name_of_both_tenants_is_two_sessions(
    http: httpx.AsyncClient,
) -> None:
    name = f"shared-{uuid.uuid4().hex[:8]}"
    assert (await nemo(http, AMBER, name, f"secret = {SECRET!r}"))["stderr"] == ""
    fresh = await nemo(http, BIRCH, name, "print(secret)")
    assert "NameError" in fresh["stderr"] and SECRET not in json.dumps(fresh), fresh
    deleted = await http.delete(f"/sessions/{name}", headers={**BIRCH, "X-Session-ID": name})
    assert deleted.status_code == 200, deleted.text
    assert (await nemo(http, AMBER, name, "print(secret)"))["stdout"] == f"{SECRET}\n"
    deleted = await http.delete(f"/sessions/{name}", headers={**AMBER, "X-Session-ID": name})
    assert deleted.status_code == 200, deleted.text


async def test_a_group_name_of_both_tenants_is_two_groups(http: httpx.AsyncClient) -> None:
    name = f"shared-{uuid.uuid4().hex[:8]}"
    ambers = asyncio.create_task(execute(http, AMBER, SLOW, group=name))
    await asyncio.sleep(ADMITTED_S)
    assert (await execute(http, BIRCH, "pass", group=name))["status"] == "ok"
    labelled = {**BIRCH, "X-RL-Sandbox-Group": name}
    ran = await http.post(
        "/run_code", json={"code": "pass", "language": "python"}, headers=labelled
    )
    assert ran.status_code == 200 and ran.json()["status"] == "Success", ran.text
    judged = await http.post("/run", json={"type": "python", "solution": "pass"}, headers=labelled)
    assert judged.status_code == 200 and judged.json()["run_success"] is True, judged.text
    cancelled = await http.post(f"/groups/{name}/cancel", headers=BIRCH)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {"group": name, "cancelled": 0, "sessions": 0}
    answer = await ambers
    assert answer["status"] == "ok" and answer["stdout"] == f"{SECRET}\n", answer
    cancelled = await http.post(f"/groups/{name}/cancel", headers=AMBER)
    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] == 0, cancelled.text
