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


def test_notebook_cells_a_dataframe_and_pip(seen: dict[str, Any]) -> None:
    assert seen["frame_html"] == [True] and seen["frame_is_main"] == [True]
    assert seen["pip_error"] is None
    assert [line.split(" in ")[0] for line in seen["pip_stdout"].splitlines()] == [
        "Requirement already satisfied: numpy",
        "Requirement already satisfied: pillow",
    ]


def test_plot_comes_back_as_png(seen: dict[str, Any]) -> None:
    assert seen["png_magic"] == ["89504e470d0a1a0a"]
    assert seen["png_sizes"][0] > 1000


def test_error_with_traceback(seen: dict[str, Any]) -> None:
    error = seen["error"]
    assert error["name"] == "ZeroDivisionError"
    assert error["value"] == "division by zero"
    assert seen["error_stderr"] == []  # the traceback is the error's, not a stderr chunk
    # IPython's items (NoColor) joined with "", as E2B's server does, with the cell's lines
    count = seen["ipython_traceback"].split("Cell In[", 1)[1].split("]", 1)[0]
    assert seen["ipython_traceback"] == (
        "-" * 75 + "ZeroDivisionError" + " " * 25 + "Traceback (most recent call last)"
        f"Cell In[{count}], line 3\n      1 def g(a, b):\n      2     return a / b\n"
        "----> 3 g(1, 0)\n"
        f"Cell In[{count}], line 2, in g(a, b)\n      1 def g(a, b):\n----> 2     return a / b\n"
        "ZeroDivisionError: division by zero"
    )
    # a function an earlier cell defined is shown from that cell, with its count
    assert (
        f"Cell In[{count}], line 2, in g(a, b)\n      1 def g(a, b):\n----> 2     return a / b\n"
        in seen["earlier_cell_frame"]
    )


def test_text_as_e2b_renders_it(seen: dict[str, Any]) -> None:
    assert seen["apostrophe"] == "it's"  # the repr "it's" loses its double quotes too
    assert seen["quoted"] == "plain"


def test_files_written_and_read(seen: dict[str, Any]) -> None:
    assert seen["write_info"] == {"name": "data.txt", "path": "/home/user/data.txt"}
    assert seen["read_by_code"] == "hello from files"
    assert seen["read_back"] == "hello from files"
    assert seen["read_bytes_ok"] is True
    assert seen["read_missing"].startswith("FileNotFoundException")
    assert seen["write_outside"].startswith("InvalidArgumentException")


def test_contexts_share_the_sandbox_apart_from_variables(seen: dict[str, Any]) -> None:
    assert seen["context_reads_files"] == "hello from files"
    assert seen["default_reads_context_file"] == "ctx"
    assert seen["context_keeps_x_apart"] == "NameError"
    assert seen["concurrent_contexts"] == [["in the context"] * 4, ["41"] * 4]
    assert seen["context_value"] == "in the context"
    assert seen["default_lacks_y"] == "NameError"
    assert seen["contexts"] == sorted(["default", seen["context_id"]])
    assert seen["after_restart"] == "NameError"
    assert seen["contexts_after_remove"] == ["default"]


def test_files_of_envd(seen: dict[str, Any]) -> None:
    assert seen["make_dir_again"] is False  # already there
    assert seen["list_1"] == [["a.txt", "file"], ["sub", "dir"]]
    assert seen["list_2"] == [
        "/home/user/dir/a.txt",
        "/home/user/dir/sub",
        "/home/user/dir/sub/b.bin",
    ]
    assert seen["exists"] == [True, False]
    assert seen["info"] == ["a.txt", "file", 5, "-rw-r--r--"]
    assert seen["renamed"] == ["/home/user/dir/c.txt", "alpha"]
    assert seen["after_remove"] == ["c.txt"]
    assert seen["list_missing"].startswith("FileNotFoundException"), seen["list_missing"]


def test_commands_in_the_sandbox(seen: dict[str, Any]) -> None:
    exit_code, stdout, stderr = seen["command"]
    assert exit_code == 0
    assert stdout == "hello from /home/user/dir\nalpha1000\n"  # the program's uid
    assert stderr == "oops\n"
    assert seen["on_stdout"] == stdout
    assert seen["command_exit"].startswith("CommandExitException"), seen["command_exit"]
    assert seen["command_sees_code_files"] == "ctx"
    assert seen["code_sees_command_files"] == "made-by-shell"
    assert "Network is unreachable" in seen["no_network"], seen["no_network"]
    assert seen["command_timeout"].startswith("TimeoutException"), seen["command_timeout"]
    assert seen["handle_pid"] in seen["listed_pids"]
    assert seen["x_while_running"] == "41"
    assert seen["background"] == "late\n"
    assert seen["listed_after_disconnect"] is True
    assert seen["connected"] == "later\n"
    assert seen["home"] == "/home/user\ndata.txt\n"
    assert seen["streamed"] == ["a\n", "b\n"]
    assert seen["stdin"] == "got hi\n"
    assert seen["served"] == "200"  # a server a command left running, reached from code
    assert seen["kill"] is True
    assert seen["killed_wait"].startswith("CommandExitException"), seen["killed_wait"]
    assert seen["after_kill_x"] == "41"
    assert seen["pty"] is not None and "pty" in seen["pty"], seen["pty"]


def test_refused_and_lifecycle(seen: dict[str, Any]) -> None:
    assert seen["envs"] == "hi" and seen["create_env"] == "yes"
    assert seen["sandbox_id"] in seen["listed"]
    assert seen["info_id"] == seen["sandbox_id"]
    assert seen["connected_sees_x"] == "41"  # Sandbox.connect(id) reaches the same contexts
    assert seen["async_value"] == ["42", True, "async file", False]  # AsyncSandbox too
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
    bodies += [b'{"path": 1, "depth": "99999999999999999999"}', b'{"path": "' + b"n" * 300 + b'"}']
    bodies += [b'{"process": {"cmd": "ls", "args": "x", "envs": [1]}, "pty": {}}']
    bodies += [b"\x00\x00\x00\x00\x05" + b'{"process": {"pid": "x"}}', b"\x00\xff\xff\xff\xff{}"]
    calls = [
        ("POST", "/sandboxes", key),
        ("POST", f"/sandboxes/{sandbox['sandboxID']}/timeout", key),
    ]
    calls += [("POST", "/execute", jupyter), ("POST", "/contexts", jupyter)]
    calls += [("POST", "/contexts/nope/restart", jupyter), ("DELETE", "/contexts/..", jupyter)]
    calls += [("POST", "/files?path=/etc/x", envd), ("POST", "/files", envd)]
    calls += [("GET", "/files?path=../../x", envd), ("POST", "/process.Process/Start", envd)]
    calls += [("POST", f"/filesystem.Filesystem/{m}", envd) for m in ("ListDir", "Move", "Stat")]
    calls += [("POST", f"/filesystem.Filesystem/{m}", envd) for m in ("MakeDir", "WatchDir")]
    calls += [("POST", f"/process.Process/{m}", envd) for m in ("Connect", "SendSignal", "List")]
    calls += [("POST", "/process.Process/SendInput", envd), ("GET", "/nope.Service/X", envd)]
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
    url = f"{e2b_stack.url}/execute"
    # the first keepalive comes 5 s in: httpx's default read timeout (5 s) would race it
    with httpx.stream("POST", url, json={"code": code}, headers=plane, timeout=30) as r:
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


SMOLAGENTS_REQUIREMENTS = ("smolagents[e2b]>=1.20",)


def test_smolagents_code_agent_step(e2b_stack: Stack) -> None:
    """smolagents' CodeAgent with E2BExecutor: `!pip install numpy pillow` (what the image has
    answers as pip does), its tools' definitions, then one code action ending in final_answer."""
    python = client_python("smolagents-e2b", SMOLAGENTS_REQUIREMENTS)
    env = {
        "E2B_API_URL": e2b_stack.url,
        "E2B_SANDBOX_URL": e2b_stack.url,
        "E2B_API_KEY": e2b_key_for(API_KEY),
    }
    seen = run_driver(python, "smolagents_e2b.py", env)
    assert seen["answer"] == 36
    assert "computed 36" in seen["observations"][0]
