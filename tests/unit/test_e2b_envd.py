"""The pure parts of E2B's envd RPC, results and tracebacks (api/compat/e2b_envd.py,
e2b_traceback.py, e2b_interpreter.py's results), and e2b_inside.py's ops run here, outside a
jail, on a temporary directory."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from sandbox_service.api.compat import e2b_envd as envd
from sandbox_service.api.compat import e2b_interpreter as interpreter
from sandbox_service.api.compat.e2b_envd import RpcError
from sandbox_service.api.compat.e2b_traceback import ipython_traceback

# --- tracebacks: the expected strings are IPython 9.15's (NoColor) items joined with "" --------

RULE = "-" * 75


def _python_traceback(source: str) -> tuple[str, str, list[str]]:
    import traceback

    try:
        exec(compile(source, "<cell>", "exec"), {})
    except Exception as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        return type(exc).__name__, str(exc), traceback.format_exception(type(exc), exc, tb)
    raise AssertionError("the cell did not fail")


IPYTHON_CASES = [
    (
        "def f():\n    return 1 / 0\nf()",
        RULE + "ZeroDivisionError                         Traceback (most recent call last)"
        "Cell In[7], line 3\n      1 def f():\n      2     return 1 / 0\n----> 3 f()\n"
        "Cell In[7], line 2, in f()\n      1 def f():\n----> 2     return 1 / 0\n"
        "ZeroDivisionError: division by zero",
    ),
    (
        "\n".join(f"a{i} = {i}" for i in range(1, 8))
        + "\nb = 1/0\n"
        + "\n".join(f"c{i} = {i}" for i in range(9, 13)),
        RULE + "ZeroDivisionError                         Traceback (most recent call last)"
        "Cell In[7], line 8\n      6 a6 = 6\n      7 a7 = 7\n----> 8 b = 1/0\n      9 c9 = 9\n"
        "     10 c10 = 10\nZeroDivisionError: division by zero",
    ),
    (
        "def f(x, y=2, *a, **k):\n    a = 1\n    b = 2\n    c = 3\n    d = 4\n    e = 5\n"
        "    g = 6\n    return x / 0\n    h = 1\n    i = 2\n\nf(1)",
        RULE + "ZeroDivisionError                         Traceback (most recent call last)"
        "Cell In[7], line 12\n      9     h = 1\n     10     i = 2\n---> 12 f(1)\n"
        "Cell In[7], line 8, in f(x, y, *a, **k)\n      6 e = 5\n      7 g = 6\n"
        "----> 8 return x / 0\n      9 h = 1\n     10 i = 2\nZeroDivisionError: division by zero",
    ),
    (
        "x = [1,\n  2]\nfor i in range(3):\n    y = (1 +\n      i)\n\n    # comment\n"
        "    print(\n     1/0)\nz=1\nw=2",
        RULE + "ZeroDivisionError                         Traceback (most recent call last)"
        "Cell In[7], line 9\n      4     y = (1 +\n      5       i)\n      7     # comment\n"
        "      8     print(\n----> 9      1/0)\n     10 z=1\n     11 w=2\n"
        "ZeroDivisionError: division by zero",
    ),
    (
        "class A:\n    def m(self):\n        return {}['k']\nA().m()",
        RULE + "KeyError                                  Traceback (most recent call last)"
        "Cell In[7], line 4\n      2     def m(self):\n      3         return {}['k']\n"
        "----> 4 A().m()\nCell In[7], line 3, in A.m(self)\n      2 def m(self):\n"
        "----> 3     return {}['k']\nKeyError: 'k'",
    ),
]


@pytest.mark.parametrize(("source", "expected"), IPYTHON_CASES)
def test_tracebacks_as_ipython_shows_them(source: str, expected: str) -> None:
    name, value, lines = _python_traceback(source)
    assert ipython_traceback(name, value, lines, source, 7) == expected


def test_traceback_of_an_earlier_cells_function_and_a_syntax_error() -> None:
    lines = [
        "Traceback (most recent call last):\n",
        '  File "<cell>", line 1, in <module>\n',
        '  File "<cell>", line 2, in g\n',
        "ValueError: v\n",
    ]
    shown = ipython_traceback("ValueError", "v", lines, "g()", 4)
    assert "Cell In[4], line 1\n----> 1 g()\nCell In[?], line 2, in g()\nValueError: v" in shown
    syntax = [
        "Traceback (most recent call last):\n",
        '  File "/usr/lib/python3.12/ast.py", line 52, in parse\n',
        "    return compile(source, filename, mode, flags,\n",
        '  File "<cell>", line 1\n',
        "    !ls\n",
        "    ^\n",
        "SyntaxError: invalid syntax\n",
    ]
    assert ipython_traceback("SyntaxError", "invalid syntax", syntax, "!ls", 2) == (
        "  Cell In[2], line 1\n    !ls\n    ^\nSyntaxError: invalid syntax"
    )


# --- results ------------------------------------------------------------------------------------


def test_text_loses_either_quote_as_e2b_renders_it() -> None:
    assert interpreter.plain_text("'done'") == "done"
    assert interpreter.plain_text('"it\'s"') == "it's"
    assert interpreter.plain_text("42") == "42"
    assert interpreter.plain_text("'a' + 'b'") == "a' + 'b"  # E2B's rule, exactly


def test_results_by_mime_type() -> None:
    item = {
        "text/plain": "<table>",
        "text/html": "<b>x</b>",
        "text/markdown": "**x**",
        "text/latex": "$x$",
        "application/json": '{"a": 1}',
        "image/svg+xml": "<svg/>",
        "image/png": "iVBORw0K",
        "application/x-other": "o",
    }
    assert interpreter.result_line(item, is_main=True) == {
        "type": "result",
        "is_main_result": True,
        "text": "<table>",
        "html": "<b>x</b>",
        "markdown": "**x**",
        "latex": "$x$",
        "json": {"a": 1},
        "svg": "<svg/>",
        "png": "iVBORw0K",
        "extra": {"application/x-other": "o"},
    }


def test_the_main_result_is_the_printed_last_expression() -> None:
    from trainer_client.wire import ExecuteResult

    result = ExecuteResult.model_validate(
        {
            "id": "x",
            "status": "ok",
            "stdout": "hi\nframe\n",
            "display": [{"image/png": "iVBORw0K"}, {"text/plain": "frame", "text/html": "<i/>"}],
        }
    )
    lines = interpreter.cell_lines(result, 1, 0, "frame")
    assert lines[1] == {"type": "stdout", "text": "hi\n", "timestamp": 0}
    assert [line["is_main_result"] for line in lines[2:]] == [False, True]
    assert lines[3]["html"] == "<i/>"


# --- Connect framing and requests ---------------------------------------------------------------


def test_envelopes() -> None:
    framed = envd.envelope({"event": {"start": {"pid": 7}}})
    flags, length = struct.unpack(">BI", framed[:5])
    assert flags == 0 and json.loads(framed[5 : 5 + length]) == {"event": {"start": {"pid": 7}}}
    assert envd.first_message(framed) == {"event": {"start": {"pid": 7}}}
    assert envd.end_stream()[0] == envd.END_STREAM
    error = envd.end_stream(RpcError("not_found", "gone"))
    assert json.loads(error[5:]) == {"error": {"code": "not_found", "message": "gone"}}
    for bad in (b"", b"\x00\x00\x00\x00\x09{}", b"\x01\x00\x00\x00\x02{}"):
        assert isinstance(envd.first_message(bad), RpcError)


def test_filesystem_requests() -> None:
    assert envd.filesystem_op("ListDir", {"path": "dir", "depth": 2}) == {
        "op": "list",
        "path": "/home/user/dir",
        "depth": 2,
    }
    assert envd.filesystem_op("Stat", {"path": "/tmp/../home/user/x"}) == {
        "op": "stat",
        "path": "/home/user/x",
    }
    assert envd.filesystem_op("Move", {"source": "a", "destination": "/tmp/b"}) == {
        "op": "move",
        "source": "/home/user/a",
        "destination": "/tmp/b",
    }
    for method, message in (
        ("ListDir", {"path": "x", "depth": -1}),
        ("Stat", {"path": ""}),
        ("Stat", {"path": "a\x00b"}),
        ("Move", {"source": "a"}),
    ):
        refused = envd.filesystem_op(method, message)
        assert isinstance(refused, RpcError) and refused.code == "invalid_argument", message
    unknown = envd.filesystem_op("WatchDir", {"path": "x"})
    assert isinstance(unknown, RpcError) and unknown.code == "unimplemented"


def test_start_requests() -> None:
    command = envd.parse_start(
        {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "ls -la"], "envs": {"A": "1"}}}
    )
    assert isinstance(command, envd.Command)
    assert command.script() == "ls -la" and command.cwd == "/home/user"
    other = envd.parse_start({"process": {"cmd": "python3", "args": ["-c", "print('x y')"]}})
    assert (
        isinstance(other, envd.Command)
        and other.script() == "python3 -c 'print('\"'\"'x y'\"'\"')'"
    )
    pty = envd.parse_start({"process": {"cmd": "/bin/bash"}, "pty": {"size": {"rows": 1}}})
    assert isinstance(pty, RpcError) and pty.code == "unimplemented"
    for bad in ({}, {"process": {"cmd": ""}}, {"process": {"cmd": "ls", "args": [1]}}):
        assert isinstance(envd.parse_start(bad), RpcError), bad
    assert envd.pid_of({"process": {"pid": 12}}) == 12
    assert isinstance(envd.pid_of({"process": {"tag": "t"}}), RpcError)


def test_end_events() -> None:
    assert envd.end_event(3)["event"]["end"] == {
        "exitCode": 3,
        "exited": True,
        "status": "exit status 3",
    }
    assert envd.end_event(-1, "signal: killed")["event"]["end"] == {
        "exitCode": -1,
        "exited": False,
        "status": "signal: killed",
    }


# --- e2b_inside.py's ops, here -------------------------------------------------------------------


def _inside(namespace: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """An op of e2b_inside.py as imported here (so that a test can point it elsewhere)."""
    from sandbox_service.api.compat import e2b_inside

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        e2b_inside.ARGS.clear()
        e2b_inside.ARGS.update(args)
        e2b_inside.NS = namespace
        e2b_inside.main()
    answer = envd.parse_answer(out.getvalue())
    assert answer is not None, out.getvalue()
    return answer


def _op(namespace: dict[str, Any], args: dict[str, Any]) -> dict[str, Any] | None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(envd.op_cell(args), namespace)
    return envd.parse_answer(out.getvalue())


def test_inside_filesystem_ops(tmp_path: Path) -> None:
    ns: dict[str, Any] = {"__name__": "__main__"}
    base = str(tmp_path)
    assert _op(ns, {"op": "mkdir", "path": f"{base}/d/e"})["entry"]["type"] == "FILE_TYPE_DIRECTORY"  # type: ignore[index]
    assert _op(ns, {"op": "mkdir", "path": f"{base}/d/e"})["error"]["code"] == "already_exists"  # type: ignore[index]
    (tmp_path / "d" / "f.txt").write_text("hello")
    listed = _op(ns, {"op": "list", "path": f"{base}/d", "depth": 2})
    assert listed is not None
    assert sorted(e["path"] for e in listed["entries"]) == [f"{base}/d/e", f"{base}/d/f.txt"]
    entry = _op(ns, {"op": "stat", "path": f"{base}/d/f.txt"})["entry"]  # type: ignore[index]
    assert entry["size"] == "5" and entry["permissions"].startswith("-rw")
    moved = _op(ns, {"op": "move", "source": f"{base}/d/f.txt", "destination": f"{base}/g/h"})
    assert moved is not None and moved["entry"]["path"] == f"{base}/g/h"
    assert _op(ns, {"op": "remove", "path": f"{base}/d"}) == {}
    assert _op(ns, {"op": "stat", "path": f"{base}/d"})["error"]["code"] == "not_found"  # type: ignore[index]
    assert set(ns) == {"__name__", "__builtins__"}  # the user's namespace is untouched


def test_inside_contexts_keep_their_variables_apart() -> None:
    import sys

    ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        ns["x"] = 1
        _op(ns, envd.context_op("c1"))
        assert "x" not in ns
        ns["y"] = 2
        _op(ns, envd.context_op("default"))
        assert ns["x"] == 1 and "y" not in ns
        _op(ns, envd.context_op("c1"))
        assert ns["y"] == 2
        _op(ns, envd.context_op("c1", reset=True))  # restart: c1's variables are gone
        assert "y" not in ns
        ns["z"] = 3
        _op(ns, envd.context_op("c1", drop=True))  # removed: the default's are back
        assert ns["x"] == 1 and "z" not in ns
    finally:
        sys.modules.pop("_rlsb_e2b", None)


def test_inside_commands_outlive_their_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from sandbox_service.api.compat import e2b_inside

    monkeypatch.setattr(e2b_inside, "COMMANDS_DIR", str(tmp_path / "commands"))
    ns: dict[str, Any] = {"__name__": "__main__"}
    home = {"HOME": str(tmp_path)}  # the host's login profile is not the jail's (which has none)
    spawn = {"op": "spawn", "cwd": str(tmp_path), "max_bytes": 1024, "info": {}, "wait": 5}
    poll = {"op": "poll", "errAt": 0, "wait": 5, "max_bytes": 1024}
    try:
        quick = _inside(ns, {**spawn, "cmd": "echo $A; pwd; exit 4", "envs": {"A": "a", **home}})
        assert quick["exitCode"] == 4
        assert base64.b64decode(quick["out"]) == f"a\n{tmp_path}\n".encode()
        cmd = "read line; echo got $line; sleep 30"
        slow = _inside(ns, {**spawn, "cmd": cmd, "envs": home, "stdin": True, "wait": 0.1})
        pid = slow["pid"]
        assert slow["exitCode"] is None
        assert [p["pid"] for p in _inside(ns, {"op": "processes"})["processes"]] == [pid]
        line = base64.b64encode(b"hi\n").decode()
        assert _inside(ns, {"op": "stdin", "pid": pid, "data": line}) == {}
        polled = _inside(ns, {**poll, "pid": pid, "outAt": 0})
        assert base64.b64decode(polled["out"]) == b"got hi\n" and polled["exitCode"] is None
        assert _inside(ns, {"op": "signal", "pid": pid, "signal": 9}) == {}
        ended = _inside(ns, {**poll, "pid": pid, "outAt": polled["outAt"]})
        assert ended["exitCode"] == -9
        gone = _inside(ns, {**poll, "pid": pid, "outAt": 0})
        assert gone["error"]["code"] == "not_found"
        assert _inside(ns, {"op": "processes"}) == {"processes": []}
    finally:
        sys.modules.pop("_rlsb_e2b", None)


def test_a_function_of_an_earlier_cell_is_shown_from_that_cell() -> None:
    lines = [
        "Traceback (most recent call last):\n",
        '  File "<cell>", line 1, in <module>\n',
        '  File "<cell>", line 3, in g\n',
        "ValueError: v\n",
    ]
    earlier = [(3, "x = 1"), (2, "import os\ndef g():\n    raise ValueError('v')")]
    assert ipython_traceback("ValueError", "v", lines, "g()", 4, earlier) == (
        RULE + "ValueError                                Traceback (most recent call last)"
        "Cell In[4], line 1\n----> 1 g()\n"
        "Cell In[2], line 3, in g()\n      2 def g():\n----> 3     raise ValueError('v')\n"
        "ValueError: v"
    )
