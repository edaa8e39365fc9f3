"""The E2B code interpreter's cells and contexts, and envd's files, mapped onto ours (pure; the
routing, keys and control plane are e2b.py's)."""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from sandbox_service.api.compat.e2b import (
    CONTEXT_ID,
    DEFAULT_CONTEXT,
    HOME,
    JAIL_ROOTS,
    LANGUAGES,
    MAX_ENV_VARS,
    ApiError,
    encodable,
    json_object,
    string_map,
)
from sandbox_service.api.compat.e2b_traceback import ipython_traceback
from sandbox_service.execution import Status
from trainer_client.wire import ExecuteResult

# --- the code interpreter -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cell:
    """A validated `POST /execute` body of the code interpreter."""

    code: str
    context_id: str
    env_vars: dict[str, str]


def parse_cell(raw: bytes) -> Cell | ApiError:
    """The cell a `POST /execute` body asks for."""
    body = json_object(raw)
    if isinstance(body, ApiError):
        return body
    code = body.get("code")
    if not isinstance(code, str) or not encodable(code):
        return ApiError(400, "code must be a string")
    language = body.get("language")
    context_id = body.get("context_id")
    if language is not None and context_id is not None:
        return ApiError(400, "give context_id or language, not both")
    if language is not None and (not isinstance(language, str) or language not in LANGUAGES):
        return ApiError(400, f"language {str(language)[:32]!r} is not supported; only python")
    if context_id is None:
        context_id = DEFAULT_CONTEXT
    if not isinstance(context_id, str) or not CONTEXT_ID.fullmatch(context_id):
        return ApiError(404, "no such context")
    env_vars = string_map(body.get("env_vars"), "env_vars", MAX_ENV_VARS)
    if isinstance(env_vars, ApiError):
        return env_vars
    if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in env_vars):
        return ApiError(400, "env_vars names must be identifiers")
    return Cell(code, context_id, env_vars)


def env_cell(env_vars: Mapping[str, str]) -> str:
    """A cell that sets environment variables in a context's interpreter (before a cell that
    asked for them; like E2B's per-call `envs`, they are set with Python code)."""
    values = json.dumps(dict(env_vars))
    return (
        "import os as _e2b_os, json as _e2b_json\n"
        f"_e2b_os.environ.update(_e2b_json.loads({values!r}))\n"
        "del _e2b_os, _e2b_json\n"
    )


def parse_new_context(raw: bytes) -> tuple[str, str] | ApiError:
    """(language, cwd) of a `POST /contexts` body."""
    body = json_object(raw)
    if isinstance(body, ApiError):
        return body
    language = body.get("language") or "python"
    if not isinstance(language, str) or language not in LANGUAGES:
        return ApiError(400, f"language {str(language)[:32]!r} is not supported; only python")
    cwd = body.get("cwd") or HOME
    if cwd != HOME and not (isinstance(cwd, str) and cwd.rstrip("/") == HOME):
        return ApiError(400, f"cwd must be {HOME}, the sandbox's working directory")
    return "python", HOME


def context_body(context_id: str) -> dict[str, str]:
    """A context as the SDK reads it."""
    return {"id": context_id, "language": "python", "cwd": HOME}


def new_context_id() -> str:
    """A fresh context id."""
    return secrets.token_hex(8)


def cell_lines(
    result: ExecuteResult,
    execution_count: int,
    now_ns: int,
    source: str = "",
    earlier: Sequence[tuple[int, str]] = (),
) -> list[dict[str, Any]]:
    """The stream lines of one finished cell, before `end_of_execution`: its count, stdout and
    stderr (one chunk each, as brittle consumers expect), results (displays; the last
    expression as the main result, taken off stdout where the session printed it) and the
    error, its traceback as IPython's (`source`: the cell's code)."""
    lines: list[dict[str, Any]] = [
        {"type": "number_of_executions", "execution_count": execution_count}
    ]
    status = Status(result.status)
    stdout, stderr = result.stdout, result.stderr
    main = _main_result(result) if status is Status.OK else -1
    if main >= 0:
        stdout = stdout.removesuffix(result.display[main]["text/plain"] + "\n")
    if result.error is not None:
        stderr = stderr.removesuffix("".join(result.error.traceback))
    if stdout:
        lines.append({"type": "stdout", "text": stdout, "timestamp": now_ns})
    if stderr and status in (Status.OK, Status.ERROR):
        lines.append({"type": "stderr", "text": stderr, "timestamp": now_ns})
    for index, item in enumerate(result.display):
        lines.append(result_line(item, is_main=index == main))
    error = _error_line(result, source, execution_count, earlier)
    if error is not None:
        lines.append(error)
    return lines


def _main_result(result: ExecuteResult) -> int:
    """The index of the last expression's display: the last one with text that the session
    printed last (a figure or an explicit display is not printed), or -1."""
    for index in range(len(result.display) - 1, -1, -1):
        text = result.display[index].get("text/plain")
        if text is not None and result.stdout.endswith(text + "\n"):
            return index
    return -1


MIME_FIELDS = {
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}
"""E2B's result field of each MIME type (`template/server/api/models/result.py`); any other
type goes to `extra`."""


def plain_text(text: str) -> str:
    """E2B's `text`: the repr of a string loses its quotes, single or double."""
    if text and (
        (text.startswith("'") and text.endswith("'"))
        or (text.startswith('"') and text.endswith('"'))
    ):
        return text[1:-1]
    return text


def result_line(item: Mapping[str, str], is_main: bool) -> dict[str, Any]:
    """A `result` line of a display bundle."""
    line: dict[str, Any] = {"type": "result", "is_main_result": is_main}
    extra: dict[str, Any] = {}
    for mime, value in item.items():
        if mime == "text/plain":
            line["text"] = plain_text(value)
        elif mime in MIME_FIELDS:
            line[MIME_FIELDS[mime]] = (
                _json_value(value) if mime.endswith(("json", "data", "chart")) else value
            )
        else:
            extra[mime] = value
    if extra:
        line["extra"] = extra
    return line


def _json_value(value: object) -> object:
    """A JSON bundle's value is an object in Jupyter's messages; the cell machinery may carry it
    as its JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


_FAILURES = {
    Status.TIMEOUT: ("TimeoutError", "the cell ran past the server's time limit"),
    Status.MEMORY_LIMIT: ("MemoryError", "the cell went past its memory limit"),
    Status.KILLED: ("KilledError", "the cell's interpreter was killed"),
    Status.QUEUE_TIMEOUT: ("QueueTimeout", "the cell never ran (the queue was too long)"),
    Status.SANDBOX_ERROR: ("SandboxError", "the sandbox failed to run the cell"),
}


def _error_line(
    result: ExecuteResult, source: str, count: int, earlier: Sequence[tuple[int, str]]
) -> dict[str, Any] | None:
    status = Status(result.status)
    if result.error is not None:
        error = result.error
        shown = ipython_traceback(
            error.ename, error.evalue, error.traceback, source, count, earlier
        )
        return {"type": "error", "name": error.ename, "value": error.evalue, "traceback": shown}
    if status in _FAILURES:
        name, why = _FAILURES[status]
        detail = f"{why}; its variables are those of the cells before it"
        if status in (Status.QUEUE_TIMEOUT, Status.SANDBOX_ERROR) and result.stderr:
            detail = f"{why}: {result.stderr.strip()[:500]}"
        return {"type": "error", "name": name, "value": detail, "traceback": f"{name}: {detail}"}
    if status is Status.ERROR:  # exited without an exception (sys.exit, os._exit)
        value = f"the cell exited with code {result.exit_code}"
        return {"type": "error", "name": "SystemExit", "value": value, "traceback": value}
    return None


KEEPALIVE = b'{"type": "keepalive"}\n'
"""The line sent while a cell runs, so that proxies and the client see a live stream."""
END = b'{"type": "end_of_execution"}\n'
"""The stream's last line."""


def encode_lines(lines: list[dict[str, Any]]) -> bytes:
    """JSON lines, never a blank one (the SDK parses every line)."""
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


# --- envd's files -------------------------------------------------------------------------------


def jail_path(path: str) -> str | ApiError:
    """The jail's path of an E2B path: `/home/user/x` and `x` are `x` in the working directory;
    `/tmp/x` and `/mnt/x` stay; anything else is refused (400), as envd refuses a path its user
    cannot write."""
    if not path or "\x00" in path or "\\" in path or len(path) > 1024 or not encodable(path):
        return ApiError(400, "path must be a non-empty file path")
    absolute = path if path.startswith("/") else f"{HOME}/{path}"
    normal = posixpath.normpath(absolute)
    if normal.startswith(HOME + "/"):
        return normal[len(HOME) + 1 :]
    if any(normal.startswith(root + "/") for root in JAIL_ROOTS):
        return normal
    roots = ", ".join((HOME, *JAIL_ROOTS))
    return ApiError(400, f"path {path[:200]!r} is outside the writable directories ({roots})")


def e2b_path(jailed: str) -> str:
    """The E2B path of a jail path (inverse of jail_path)."""
    return jailed if jailed.startswith("/") else f"{HOME}/{jailed}"


def write_info(jailed: str) -> dict[str, str]:
    """One entry of the list `POST /files` answers."""
    path = e2b_path(jailed)
    return {"name": posixpath.basename(path), "type": "file", "path": path}


def uploaded_files(
    content_type: str, body: bytes, path: str | None
) -> list[tuple[str, bytes]] | ApiError:
    """The (E2B path, bytes) pairs of a `POST /files`: one octet-stream body named by `?path=`,
    or multipart parts named `file` whose filename is the path (when `?path=` is absent)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind in ("application/octet-stream", ""):
        if path is None:
            return ApiError(400, "path is required")
        return [(path, body)]
    if kind != "multipart/form-data":
        return ApiError(400, f"unsupported content type {kind[:64]!r}")
    header = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=HTTP).parsebytes(header + body)
    if not message.is_multipart():
        return ApiError(400, "the multipart body has no parts")
    files: list[tuple[str, bytes]] = []
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") != "file":
            continue
        filename = part.get_filename()
        target = path if path is not None else filename
        if not target:
            return ApiError(400, "each file part needs a filename (its path)")
        payload = part.get_payload(decode=True)
        files.append((target, payload if isinstance(payload, bytes) else b""))
    if not files:
        return ApiError(400, "no part named 'file'")
    if path is not None and len(files) > 1:
        return ApiError(400, "several files with one path")
    return files


def encode_files(files: list[tuple[str, bytes]]) -> dict[str, str]:
    """The `files` of a cell: jail path -> base64."""
    return {path: base64.b64encode(data).decode() for path, data in files}


def decode_file(encoded: str) -> bytes:
    """The bytes of a fetched file (base64 from the worker)."""
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return b""
