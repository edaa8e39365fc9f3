"""The pure mappings of the E2B, NeMo-Skills and open-instruct wires (api/compat/e2b.py,
nemo.py, openinstruct.py)."""

from __future__ import annotations

import json

import pytest

from sandbox_service.api.compat import e2b, nemo, openinstruct
from sandbox_service.api.compat import e2b_interpreter as interpreter
from trainer_client.wire import ExecuteResult


def test_data_plane_target_from_headers_or_host() -> None:
    headers = {b"e2b-sandbox-id": b"abcdef0123", b"e2b-sandbox-port": b"49999"}
    assert e2b.target_of("/execute", headers) == e2b.Target("abcdef0123", 49999)
    assert e2b.target_of(
        "/files", {b"host": b"49983-abcdef0123.sandbox.example:443"}
    ) == e2b.Target("abcdef0123", 49983)
    for host in (b"127.0.0.1:8000", b"rl-sandbox.internal", b"8000-x.example", b""):
        assert e2b.target_of("/execute", {b"host": host}) is None
    assert (
        e2b.target_of("/contexts", {b"e2b-sandbox-id": b"x", b"e2b-sandbox-port": b"9" * 40}).port
        == 0
    )
    # the control plane stays the control plane (and keyed) whatever headers come with it
    assert e2b.target_of("/sandboxes/abcdef0123/connect", headers) is None


def test_control_paths() -> None:
    for path in (
        "/sandboxes",
        "/v2/sandboxes",
        "/sandboxes/abc/timeout",
        "/v2/sandboxes/a/connect",
    ):
        assert e2b.is_control_path(path)
    for path in ("/sandboxesx", "/execute", "/v2/sandbox", "/sessions/x"):
        assert not e2b.is_control_path(path)


def test_api_key_mapping_round_trips() -> None:
    key = "my key/with:odd chars"
    presented = e2b.e2b_key_for(key)
    assert presented.startswith("e2b_") and all(c in "0123456789abcdef" for c in presented[4:])
    assert e2b.api_key_of(presented.encode()) == key.encode()
    assert e2b.api_key_of(b"plain-key") == b"plain-key"
    assert e2b.api_key_of(b"e2b_not-hex") == b"e2b_not-hex"


def test_new_sandbox_validation() -> None:
    spec = e2b.parse_new_sandbox(b'{"templateID": "code-interpreter-v1", "timeout": 99999}', 1800)
    assert isinstance(spec, e2b.NewSandbox) and spec.timeout_s == 1800  # clamped to the session TTL
    assert e2b.parse_new_sandbox(b"", 1800) == e2b.NewSandbox(e2b.DEFAULT_TEMPLATE, 300)
    huge = b"1" + b"0" * 400  # an integer no float holds
    assert e2b.parse_timeout(b'{"timeout": ' + huge + b"}", 1800) == 1800
    for body, code in [
        (b'{"timeout": -' + huge + b"}", 400),
        (b'{"timeout": NaN}', 400),
        (b"[]", 400),
        (b"{", 400),
        (b'{"templateID": "my-gpu-image"}', 404),
        (b'{"timeout": "long"}', 400),
        (b'{"timeout": -1}', 400),
        (b'{"metadata": {"a": 1}}', 400),
        (b'{"envVars": {"1BAD": "x"}}', 400),
    ]:
        refused = e2b.parse_new_sandbox(body, 1800)
        assert isinstance(refused, e2b.ApiError) and refused.code == code, body
        assert json.loads(refused.body())["code"] == code


def test_cell_validation() -> None:
    assert interpreter.parse_cell(
        b'{"code": "1", "context_id": null, "language": null}'
    ) == interpreter.Cell("1", "default", {})
    assert isinstance(interpreter.parse_cell(b'{"code": "1", "language": "r"}'), e2b.ApiError)
    assert isinstance(interpreter.parse_cell(b'{"code": 1}'), e2b.ApiError)
    missing = interpreter.parse_cell(b'{"code": "1", "context_id": "../x"}')
    assert isinstance(missing, e2b.ApiError) and missing.code == 404
    for language in (b'["python"]', b'{"a": 1}'):
        cell = interpreter.parse_cell(b'{"code": "1", "language": ' + language + b"}")
        assert isinstance(cell, e2b.ApiError) and cell.code == 400, language
        context = interpreter.parse_new_context(b'{"language": ' + language + b"}")
        assert isinstance(context, e2b.ApiError) and context.code == 400, language


@pytest.mark.parametrize(
    ("path", "jailed"),
    [
        ("/home/user/a.txt", "a.txt"),
        ("a/b.txt", "a/b.txt"),
        ("/home/user/x/../y", "y"),
        ("/tmp/z", "/tmp/z"),
    ],
)
def test_paths_map_home_onto_the_working_directory(path: str, jailed: str) -> None:
    assert interpreter.jail_path(path) == jailed
    assert interpreter.e2b_path(jailed) == (
        path if path.startswith("/tmp") else "/home/user/" + jailed
    )


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "/home/user", "/home/user/../../etc/x", "", "a\x00"]
)
def test_paths_outside_are_refused(path: str) -> None:
    assert isinstance(interpreter.jail_path(path), e2b.ApiError)


def test_multipart_and_octet_stream_uploads() -> None:
    body = (
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="/home/user/a.txt"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\nhello\r\n--B--\r\n"
    )
    assert interpreter.uploaded_files("multipart/form-data; boundary=B", body, None) == [
        ("/home/user/a.txt", b"hello")
    ]
    assert interpreter.uploaded_files("application/octet-stream", b"\x00\x01", "b.bin") == [
        ("b.bin", b"\x00\x01")
    ]
    assert isinstance(interpreter.uploaded_files("text/plain", b"x", "a"), e2b.ApiError)
    assert isinstance(
        interpreter.uploaded_files("multipart/form-data; boundary=B", b"junk", None), e2b.ApiError
    )


def _result(**fields: object) -> ExecuteResult:
    return ExecuteResult.model_validate({"id": "x", "status": "ok", **fields})


def test_cell_lines_main_result_and_figures() -> None:
    result = _result(
        stdout="hi\n'done'\n",
        display=[{"image/png": "iVBORw0K"}, {"text/plain": "'done'"}],
    )
    lines = interpreter.cell_lines(result, 3, 7)
    assert lines[0] == {"type": "number_of_executions", "execution_count": 3}
    assert lines[1] == {"type": "stdout", "text": "hi\n", "timestamp": 7}
    assert lines[2] == {"type": "result", "is_main_result": False, "png": "iVBORw0K"}
    assert lines[3] == {"type": "result", "is_main_result": True, "text": "done"}
    assert len(lines) == 4


def test_cell_lines_main_result_with_rich_representations() -> None:
    value = {
        "text/plain": "   a\n0  1",
        "text/html": "<table></table>",
        "text/latex": "$a$",
        "application/json": '{"a": [1]}',
    }
    result = _result(stdout="   a\n0  1\n", display=[value])
    [_, main] = interpreter.cell_lines(result, 1, 7)
    assert main == {
        "type": "result",
        "is_main_result": True,
        "text": "   a\n0  1",
        "html": "<table></table>",
        "latex": "$a$",
        "json": {"a": [1]},
    }


def test_cell_lines_error_and_failures() -> None:
    traceback = [
        "Traceback (most recent call last):\n",
        '  File "<cell>", line 2, in <module>\n',
        "ValueError: bad\n",
    ]
    failed = _result(
        status="error",
        stderr="warn\n" + "".join(traceback),
        error={"ename": "ValueError", "evalue": "bad", "traceback": traceback},
    )
    lines = interpreter.cell_lines(failed, 1, 0, "print('warn')\nraise ValueError('bad')")
    assert {"type": "stderr", "text": "warn\n", "timestamp": 0} in lines
    assert lines[-1] == {
        "type": "error",
        "name": "ValueError",
        "value": "bad",
        "traceback": "-" * 75
        + "ValueError                                Traceback (most recent call last)"
        + "Cell In[1], line 2\n      1 print('warn')\n----> 2 raise ValueError('bad')\n"
        + "ValueError: bad",
    }
    timeout = interpreter.cell_lines(_result(status="timeout", stderr="killed at 30 s"), 2, 0)
    assert timeout[-1]["name"] == "TimeoutError"
    assert all(line["type"] != "stderr" for line in timeout)
    assert interpreter.encode_lines(lines).count(b"\n") == len(lines)


def test_nemo_body_detection() -> None:
    assert nemo.is_nemo_body(b'{"generated_code": "1", "timeout": 1}')
    assert not nemo.is_nemo_body(b'{"code": "x = \\"generated_code\\""}')
    assert not nemo.is_nemo_body(b'{"code": "1", "generated_code": "2"}')
    assert not nemo.is_nemo_body(b'{"generated_code": ')


def test_nemo_requests_and_answers() -> None:
    call = nemo.parse_call(
        b'{"generated_code": "x", "timeout": 100, "language": "ipython"}', "s", 30
    )
    assert call == nemo.NemoCall("x", 30.0, True, "", 1000)
    refused = nemo.parse_call(b'{"generated_code": "x", "language": "ipython"}', None, 30)
    assert isinstance(refused, dict) and "X-Session-ID" in refused["stderr"]
    assert isinstance(
        nemo.parse_call(b'{"generated_code": "x", "language": "shell"}', None, 30), dict
    )
    too_long = nemo.parse_call(b'{"generated_code": "x"}', "s" * 257, 30)
    assert isinstance(too_long, dict) and "X-Session-ID longer" in too_long["stderr"]
    stateless = nemo.parse_call(b'{"generated_code": "x", "language": "python"}', None, 30)
    assert isinstance(stateless, nemo.NemoCall) and not stateless.stateful
    assert nemo.to_answer(_result(status="error", stderr="E"), stateless)["process_status"] == (
        "completed"
    )
    assert isinstance(call, nemo.NemoCall)
    assert nemo.to_answer(_result(stdout="a" * 1005), call)["stdout"] == "a" * 1000 + "<output cut>"
    assert nemo.to_answer(_result(status="error", stderr="E"), call)["process_status"] == "error"
    timed_out = nemo.to_answer(_result(status="timeout"), call)
    assert timed_out == {
        "process_status": "timeout",
        "stdout": "",
        "stderr": "Execution timed out after 30 seconds\n",
        "new_session_created": False,
    }


HOSTILE_NEMO = [
    b'{"generated_code": "print(1)\\udc80", "language": "python"}',
    b'{"generated_code": "print(1)", "language": "python", "std_input": "\\udc80"}',
    b'{"generated_code": "print(1)", "language": ["python"]}',
    b'{"generated_code": "print(1)", "language": {"a": 1}}',
    b'{"generated_code": "print(1)", "language": "python", "timeout": 1' + b"0" * 400 + b"}",
    b'{"generated_code": "print(1)", "language": "python", "timeout": -1' + b"0" * 400 + b"}",
    b'{"generated_code": "print(1)", "language": "python", "timeout": NaN}',
]
HOSTILE_OPEN_INSTRUCT = [
    b'{"code": "print(1)\\udc80"}',
    b'{"code": "print(1)", "timeout": 1' + b"0" * 400 + b"}",
    b'{"code": "print(1)", "timeout": Infinity}',
]


@pytest.mark.parametrize("body", HOSTILE_NEMO, ids=range(len(HOSTILE_NEMO)))
def test_nemo_refuses_unencodable_text_odd_languages_and_huge_numbers(body: bytes) -> None:
    refused = nemo.parse_call(body, None, 30)
    assert isinstance(refused, dict) and refused["process_status"] == "error", refused


@pytest.mark.parametrize("body", HOSTILE_OPEN_INSTRUCT, ids=range(len(HOSTILE_OPEN_INSTRUCT)))
def test_open_instruct_refuses_unencodable_code_and_huge_numbers(body: bytes) -> None:
    refused = openinstruct.parse_call(body, 30)
    assert isinstance(refused, dict) and refused["success"] is False, refused


def test_open_instruct_clamps_the_timeout() -> None:
    assert openinstruct.parse_call(b'{"code": "1", "timeout": 100}', 30) == (
        openinstruct.ToolCall("1", 30.0)
    )


def test_mcp_tool_timeouts_are_finite_and_clamped() -> None:
    from sandbox_service.api.compat import mcp_content

    def limit(timeout: float) -> float:
        return mcp_content.tool_timeout(timeout, 10.0, 60.0)

    assert limit(float("nan")) == 10.0
    assert (limit(float("inf")), limit(float("-inf")), limit(5.0)) == (60.0, 0.1, 5.0)


def test_mcp_tool_content() -> None:
    from sandbox_service.api.compat import mcp_content

    ok = _result(stdout="42\n", display=[{"text/plain": "42"}, {"image/png": "iVBOR"}])
    assert mcp_content.tool_text(ok) == "42\n"
    assert mcp_content.tool_images(ok) == ["iVBOR"]
    assert not mcp_content.is_error(ok)
    timed_out = _result(status="timeout", stdout="partial")
    assert mcp_content.tool_text(timed_out) == "partial\n[status: timeout]\n"
    assert mcp_content.is_error(timed_out)
    assert mcp_content.tool_text(_result()) == "[no output]\n"
