"""Acceptance: the E2B SDK (e2b-code-interpreter, installed alone in its own environment) against a
running rl-sandbox, configured as E2B's self-hosting docs say (one plain-HTTP port for the API and
the sandboxes), with an API key set on the server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbox_service.api.compat.e2b import e2b_key_for
from sandbox_service.local.redis_server import RedisServer
from tests.compat.client_env import E2B_OLDEST, E2B_REQUIREMENTS, client_python, run_driver
from tests.service.stack import Stack, stack_env

API_KEY = "compat-e2b-key"


@pytest.fixture(scope="module")
def e2b_stack(
    compat_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log = tmp_path_factory.mktemp("e2b-logs") / "stack.log"
    env = stack_env(compat_redis.url, "e2b", 64400, workers=2, api_key=API_KEY, max_timeout=30)
    running = Stack(env, log).start()
    yield running
    running.stop()


@pytest.fixture(scope="module", params=["latest", "oldest"])
def seen(e2b_stack: Stack, request: pytest.FixtureRequest) -> dict[str, Any]:
    requirements = E2B_REQUIREMENTS if request.param == "latest" else E2B_OLDEST
    python = client_python(f"e2b-{request.param}", requirements)
    env = {
        "E2B_API_URL": e2b_stack.url,
        "E2B_SANDBOX_URL": e2b_stack.url,
        "E2B_API_KEY": e2b_key_for(API_KEY),
        "E2B_OTHER_KEY": e2b_key_for("not-the-key"),
    }
    return run_driver(python, "e2b_calls.py", env)


def test_stateful_run_code(seen: dict[str, Any]) -> None:
    assert seen["running"] is True
    assert seen["first_stdout"] == ["set\n"]
    assert seen["second_text"] == "42"
    assert seen["second_stdout"] == []  # the value is the main result, not printed output
    assert seen["after_error"] == "41"  # an error keeps the context's variables


def test_plot_comes_back_as_png(seen: dict[str, Any]) -> None:
    assert seen["png_magic"] == ["89504e470d0a1a0a"]
    assert seen["png_sizes"][0] > 1000


def test_error_with_traceback(seen: dict[str, Any]) -> None:
    error = seen["error"]
    assert error["name"] == "ZeroDivisionError"
    assert error["value"] == "division by zero"
    assert "line 2, in f" in error["traceback"]
    assert error["traceback"].endswith("ZeroDivisionError: division by zero\n")
    assert seen["error_stderr"] == []  # the traceback is the error's, not a stderr chunk


def test_files_written_and_read(seen: dict[str, Any]) -> None:
    assert seen["write_info"] == {"name": "data.txt", "path": "/home/user/data.txt"}
    assert seen["read_by_code"] == "hello from files"
    assert seen["read_back"] == "hello from files"
    assert seen["read_bytes_ok"] is True
    assert seen["read_missing"].startswith("FileNotFoundException")
    assert seen["write_outside"].startswith("InvalidArgumentException")


def test_contexts_are_separate_sessions(seen: dict[str, Any]) -> None:
    assert seen["context_value"] == "in the context"
    assert seen["default_lacks_y"] == "NameError"
    assert seen["contexts"] == sorted(["default", seen["context_id"]])
    assert seen["after_restart"] == "NameError"
    assert seen["contexts_after_remove"] == ["default"]


def test_refused_and_lifecycle(seen: dict[str, Any]) -> None:
    for refused in (seen["commands"], seen["files_list"]):  # envd's Connect RPC: no shell here
        assert refused.lower().startswith("sandboxexception: code.unimplemented: "), refused
    assert seen["envs"] == "hi" and seen["create_env"] == "yes"
    assert seen["sandbox_id"] in seen["listed"]
    assert seen["info_id"] == seen["sandbox_id"]
    assert seen["connected_sees_x"] == "41"  # Sandbox.connect(id) reaches the same contexts
    assert seen["async_value"] == "42"  # AsyncSandbox too
    assert seen["other_create"].startswith("AuthenticationException")
    assert seen["other_kill"].startswith("AuthenticationException")
    assert seen["killed"] is True
    assert seen["running_after_kill"] is False
    assert seen["kill_again"] is False
    assert seen["run_after_kill"] is not None


def test_data_plane_needs_the_sandbox_token(e2b_stack: Stack) -> None:
    key = {"X-API-KEY": e2b_key_for(API_KEY)}
    created = httpx.post(f"{e2b_stack.url}/v2/sandboxes", json={}, headers=key, timeout=30)
    assert created.status_code == 201, created.text
    sandbox = created.json()
    plane = {"E2b-Sandbox-Id": sandbox["sandboxID"], "E2b-Sandbox-Port": "49999"}
    for token in ({}, {"X-Access-Token": "0" * 48}):
        answer = httpx.get(f"{e2b_stack.url}/contexts", headers={**plane, **token}, timeout=30)
        assert answer.status_code == 502, answer.text  # E2B's "no such sandbox"
    own = {"X-Access-Token": sandbox["envdAccessToken"]}
    assert httpx.get(f"{e2b_stack.url}/contexts", headers={**plane, **own}).status_code == 200
    # the control plane of a sandbox is the key's: a wrong or missing key is refused
    url = f"{e2b_stack.url}/sandboxes/{sandbox['sandboxID']}"
    assert httpx.get(url, headers={"X-API-KEY": e2b_key_for("other")}).status_code == 401
    assert httpx.delete(url).status_code == 401
    # sandbox headers do not turn a control-plane call into a data-plane one (e2b 2.26 sends them)
    assert httpx.delete(url, headers={**plane, **own}).status_code == 401
    assert httpx.delete(url, headers=key).status_code == 204


def test_hostile_input_is_never_a_5xx(e2b_stack: Stack) -> None:
    key = {"X-API-KEY": e2b_key_for(API_KEY)}
    url = e2b_stack.url
    sandbox = httpx.post(f"{url}/sandboxes", json={}, headers=key, timeout=30).json()
    token = {"X-Access-Token": sandbox["envdAccessToken"], "E2b-Sandbox-Id": sandbox["sandboxID"]}
    jupyter, envd = {**token, "E2b-Sandbox-Port": "49999"}, {**token, "E2b-Sandbox-Port": "49983"}
    bodies = [b"", b"{", b"[]", b'{"code": 1}', b'{"timeout": 1e999}', b"\xff\xfe", b'"x"' * 100]
    calls = [
        ("POST", "/sandboxes", key),
        ("POST", f"/sandboxes/{sandbox['sandboxID']}/timeout", key),
    ]
    calls += [("POST", "/execute", jupyter), ("POST", "/contexts", jupyter)]
    calls += [("POST", "/contexts/nope/restart", jupyter), ("DELETE", "/contexts/..", jupyter)]
    calls += [("POST", "/files?path=/etc/x", envd), ("POST", "/files", envd)]
    calls += [("GET", "/files?path=../../x", envd), ("POST", "/process.Process/Start", envd)]
    calls += [("POST", "/execute", {"X-Session-ID": "s"}), ("POST", "/open-instruct/execute", {})]
    bearer = {"Authorization": f"Bearer {API_KEY}"}
    calls += [("POST", "/mcp", bearer), ("POST", "/mcp/messages/?session_id=00", bearer)]
    calls += [("DELETE", "/mcp", {**bearer, "mcp-session-id": "nope"}), ("GET", "/mcp/x", bearer)]
    statuses = set()
    for method, path, headers in calls:
        for body in bodies:
            if path == "/execute" and "X-Session-ID" in headers:
                body = b'{"generated_code": ' + body + b"}"
            answer = httpx.request(method, url + path, content=body, headers=headers, timeout=60)
            assert answer.status_code < 500, (method, path, body, answer.status_code, answer.text)
            statuses.add(answer.status_code)
    assert 400 in statuses
    httpx.delete(f"{url}/sandboxes/{sandbox['sandboxID']}", headers=key)


def _sandbox(stack: Stack) -> tuple[dict[str, str], dict[str, str]]:
    key = {"X-API-KEY": e2b_key_for(API_KEY)}
    sandbox = httpx.post(f"{stack.url}/v2/sandboxes", json={}, headers=key, timeout=30).json()
    plane = {
        "E2b-Sandbox-Id": sandbox["sandboxID"],
        "E2b-Sandbox-Port": "49999",
        "X-Access-Token": sandbox["envdAccessToken"],
    }
    return key, plane


def _value(stack: Stack, plane: dict[str, str], code: str) -> list[dict[str, Any]]:
    answer = httpx.post(f"{stack.url}/execute", json={"code": code}, headers=plane, timeout=60)
    return [json.loads(line) for line in answer.text.splitlines()]


def test_long_cell_streams_keepalives(e2b_stack: Stack) -> None:
    _, plane = _sandbox(e2b_stack)
    code = "import time\ntime.sleep(6.5)\n'slept'"
    with httpx.stream("POST", f"{e2b_stack.url}/execute", json={"code": code}, headers=plane) as r:
        lines = [json.loads(line) for line in r.iter_lines()]
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "keepalive" and kinds[-1] == "end_of_execution"
    assert {"type": "result", "is_main_result": True, "text": "slept"} in lines


def test_a_client_that_leaves_cancels_its_cell(e2b_stack: Stack) -> None:
    _, plane = _sandbox(e2b_stack)
    url = f"{e2b_stack.url}/execute"
    # left before the answer started (within the first keepalive interval)
    with pytest.raises(httpx.ReadTimeout):
        code = "import time\ntime.sleep(3)\nbefore = 1"
        httpx.post(url, json={"code": code}, headers=plane, timeout=httpx.Timeout(60, read=1))
    # left after the stream started (after its first keepalive line)
    code = "import time\ntime.sleep(8)\nafter = 1"
    with httpx.stream("POST", url, json={"code": code}, headers=plane, timeout=60) as r:
        first = next(r.iter_lines())
    assert json.loads(first) == {"type": "keepalive"}
    time.sleep(6)  # both cells would have finished by now had they not been killed
    for name in ("before", "after"):
        errors = [line for line in _value(e2b_stack, plane, name) if line["type"] == "error"]
        assert errors and errors[0]["name"] == "NameError", name
