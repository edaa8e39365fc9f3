"""envd's Connect RPC (the `commands` and the `files` beyond read and write) onto cells of the
sandbox's session (pure; the I/O is e2b_rpc.py's).

The SDK speaks Connect with the JSON codec (`e2b/envd/client_shared.py`): unary calls are a
plain JSON body answered by JSON (an error: an HTTP status and `{"code", "message"}`); server
streams (`process.Process/Start`, `/Connect`) are envelopes (a flag byte, a 4-byte big-endian
length, the JSON) under `application/connect+json`, the last one flagged END_STREAM and
carrying `{}` or `{"error": {...}}`. Messages follow proto3's JSON mapping (lowerCamelCase,
bytes as base64, int64 as a string).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox_service.api.compat.e2b import HOME, MAX_ENV_VARS, encodable, string_map

INSIDE_SOURCE = (Path(__file__).parent / "e2b_inside.py").read_text()
"""The program each call runs in the sandbox (e2b_inside.py), sent as the code of a cell."""
INSIDE_MODULE = "_rlsb_e2b_ops_" + hashlib.sha256(INSIDE_SOURCE.encode()).hexdigest()[:12]
"""The interpreter's module of e2b_inside.py (a changed source is another module)."""
MARK = "\x1erlsb-e2b:"
"""Starts the answer line of e2b_inside.py."""
END_STREAM = 0x02
MAX_ENVELOPE_BYTES = 1 << 20

FILESYSTEM = "filesystem.Filesystem"
PROCESS = "process.Process"
UNARY_FILESYSTEM = {"ListDir": "list", "Stat": "stat", "MakeDir": "mkdir", "Remove": "remove"}
"""Filesystem methods answered by one op of e2b_inside.py (Move is `move`, with two paths)."""

HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 404,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""The HTTP status of each Connect error code (connectrpc.com/docs/protocol, "Error Codes"), but
`unimplemented`: 404, a route not served, as a server without the method answers (the SDK reads
the code from the body)."""


@dataclass(frozen=True, slots=True)
class RpcError:
    """A Connect error: the SDK maps the code to its exceptions (not_found: NotFoundException,
    invalid_argument: InvalidArgumentException, already_exists: what make_dir answers False to)."""

    code: str
    message: str

    def status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def body(self) -> bytes:
        return json.dumps({"code": self.code, "message": self.message}).encode()

    def wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


# --- framing ------------------------------------------------------------------------------------


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    """One Connect envelope of a JSON message."""
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: RpcError | None = None) -> bytes:
    """The stream's last envelope."""
    return envelope({} if error is None else {"error": error.wire()}, END_STREAM)


def first_message(body: bytes) -> dict[str, Any] | RpcError:
    """The request message of a server-streaming call (one envelope)."""
    if len(body) < 5:
        return RpcError("invalid_argument", "the request is not a Connect envelope")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        return RpcError("invalid_argument", "compressed requests are not served")
    if length > MAX_ENVELOPE_BYTES or len(body) < 5 + length:
        return RpcError("invalid_argument", "the envelope's length does not match its body")
    return json_message(body[5 : 5 + length])


def json_message(raw: bytes) -> dict[str, Any] | RpcError:
    """A unary call's JSON request message."""
    if not raw.strip():
        return {}
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        return RpcError("invalid_argument", "the request is not valid JSON")
    if not isinstance(message, dict):
        return RpcError("invalid_argument", "the request must be a JSON object")
    return message


# --- paths and ops ------------------------------------------------------------------------------


def sandbox_path(value: object, what: str = "path") -> str | RpcError:
    """An absolute, normalized path of the sandbox (relative paths are under the home, as
    envd's); /home/user is the jail's link to its working directory."""
    if not isinstance(value, str) or not value or len(value) > 4096:
        return RpcError("invalid_argument", f"{what} must be a non-empty path")
    if "\x00" in value or not encodable(value):
        return RpcError("invalid_argument", f"{what} is not a valid path")
    absolute = value if value.startswith("/") else f"{HOME}/{value}"
    normal = posixpath.normpath(absolute)
    return "/" + normal.lstrip("/")


def filesystem_op(method: str, message: dict[str, Any]) -> dict[str, Any] | RpcError:
    """The e2b_inside.py arguments of a unary filesystem call."""
    if method == "Move":
        source = sandbox_path(message.get("source"), "source")
        if isinstance(source, RpcError):
            return source
        destination = sandbox_path(message.get("destination"), "destination")
        if isinstance(destination, RpcError):
            return destination
        return {"op": "move", "source": source, "destination": destination}
    op = UNARY_FILESYSTEM.get(method)
    if op is None:
        return RpcError("unimplemented", f"{FILESYSTEM}/{method} is not served")
    path = sandbox_path(message.get("path"))
    if isinstance(path, RpcError):
        return path
    args: dict[str, Any] = {"op": op, "path": path}
    if op == "list":
        depth = message.get("depth", 1)
        if isinstance(depth, str) and depth.isdigit():
            depth = int(depth)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            return RpcError("invalid_argument", "depth must be a non-negative integer")
        args["depth"] = min(max(depth, 1), 16)
    return args


def context_op(context_id: str, reset: bool = False, drop: bool = False) -> dict[str, Any]:
    """The e2b_inside.py arguments that make a context's namespace current (`reset`: empty it;
    `drop`: and make the default context's current again)."""
    return {"op": "context", "context": context_id, "reset": reset or drop, "drop": drop}


def op_cell(args: dict[str, Any]) -> str:
    """The cell that runs e2b_inside.py's `run` with `args` in the session's interpreter: one
    expression whose value is None (nothing displayed) that binds no name of the user's. The
    source travels in every cell (a rebuilt interpreter replays the cells alone) but is
    compiled once per interpreter, into a module named after its hash."""
    name, source = repr(INSIDE_MODULE), repr(INSIDE_SOURCE)
    load = (
        f"(lambda m: (sys.modules.__setitem__({name}, m), "
        f'exec(compile({source}, "<rl-sandbox e2b>", "exec"), m.__dict__), m)[2])'
        f"(types.ModuleType({name}))"
    )
    return (
        f"(lambda sys, types: (sys.modules.get({name}) or {load})"
        f".run({json.dumps(args)!r}, globals()))"
        '(__import__("sys"), __import__("types"))\n'
    )


def parse_answer(text: str) -> dict[str, Any] | None:
    """The answer e2b_inside.py left last in `text`, or None (the op did not finish)."""
    at = text.rfind(MARK)
    if at < 0:
        return None
    line = text[at + len(MARK) :].split("\n", 1)[0]
    try:
        answer = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return answer if isinstance(answer, dict) else None


def answer_error(answer: dict[str, Any]) -> RpcError | None:
    """The error an op answered, if any."""
    error = answer.get("error")
    if not isinstance(error, dict):
        return None
    code = error.get("code")
    message = error.get("message")
    return RpcError(
        code if isinstance(code, str) and code in HTTP_STATUS else "internal",
        message[:1000] if isinstance(message, str) else "the operation failed",
    )


# --- processes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    """A validated `process.Process/Start` request."""

    cmd: str
    args: tuple[str, ...]
    envs: dict[str, str] = field(default_factory=dict)
    cwd: str = HOME
    tag: str | None = None

    def script(self) -> str:
        """The bash script to run: the SDK sends `/bin/bash -l -c <cmd>`; other argv is quoted."""
        if self.cmd in ("/bin/bash", "bash", "/bin/sh", "sh") and self.args[:2] in (
            ("-l", "-c"),
            ("-c",),
        ):
            rest = self.args[self.args.index("-c") + 1 :]
            if len(rest) == 1:
                return rest[0]
        import shlex

        return shlex.join((self.cmd, *self.args))

    def info(self, pid: int) -> dict[str, Any]:
        """The ProcessInfo of `commands.list`."""
        config: dict[str, Any] = {
            "cmd": self.cmd,
            "args": list(self.args),
            "envs": self.envs,
            "cwd": self.cwd,
        }
        info: dict[str, Any] = {"config": config, "pid": pid}
        if self.tag is not None:
            info["tag"] = self.tag
        return info


def parse_start(message: dict[str, Any]) -> Command | RpcError:
    """The command a Start request asks for; a pty is refused as envd refuses what it cannot."""
    if message.get("pty") is not None:
        return RpcError(
            "unimplemented",
            "a pty is not served: commands here run without a terminal (use commands.run)",
        )
    process = message.get("process")
    if not isinstance(process, dict):
        return RpcError("invalid_argument", "process is required")
    cmd = process.get("cmd")
    if not isinstance(cmd, str) or not cmd or not encodable(cmd) or "\x00" in cmd:
        return RpcError("invalid_argument", "process.cmd must be a program")
    args = process.get("args") or []
    if not isinstance(args, list) or not all(
        isinstance(a, str) and encodable(a) and "\x00" not in a for a in args
    ):
        return RpcError("invalid_argument", "process.args must be strings")
    envs = string_map(process.get("envs"), "process.envs", MAX_ENV_VARS)
    if not isinstance(envs, dict):
        return RpcError("invalid_argument", envs.message)
    cwd = process.get("cwd")
    directory = HOME if cwd in (None, "") else sandbox_path(cwd, "cwd")
    if isinstance(directory, RpcError):
        return directory
    tag = message.get("tag")
    return Command(cmd, tuple(args), envs, directory, tag if isinstance(tag, str) and tag else None)


def pid_of(message: dict[str, Any]) -> int | RpcError:
    """The pid a ProcessSelector (`process: {pid}`) names."""
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    if isinstance(pid, str) and pid.isdigit():
        pid = int(pid)
    if isinstance(pid, bool) or not isinstance(pid, int):
        return RpcError("invalid_argument", "process.pid is required (tags are not served)")
    return pid


def start_event(pid: int) -> dict[str, Any]:
    return {"event": {"start": {"pid": pid}}}


def end_event(exit_code: int, signal_status: str | None = None) -> dict[str, Any]:
    """The end event: as envd's, `status` is Go's ProcessState text (`exit status 3`, or
    `signal: killed` with exit code -1)."""
    end: dict[str, Any] = {
        "exitCode": exit_code,
        "exited": signal_status is None,
        "status": signal_status or f"exit status {exit_code}",
    }
    return {"event": {"end": end}}
