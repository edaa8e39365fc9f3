"""Checks of a request against the server's limits, beyond what the wire models check (pure).

Each problem is a FastAPI-style error dict whose `loc` names the field, e.g.
`["body", "requests", 3, "timeout"]` for the fourth item of a batch.
"""

from __future__ import annotations

from typing import Any

from sandbox_service.settings import Settings
from trainer_client.wire import BatchRequest, ExecuteRequest

Problem = dict[str, Any]


def decoded_size(b64: str) -> int:
    """Bytes that a (valid) base64 string decodes to."""
    return len(b64) * 3 // 4 - b64[-2:].count("=")


def check_request(
    request: ExecuteRequest, settings: Settings, loc: tuple[Any, ...]
) -> list[Problem]:
    """Problems of one request; `loc` locates it in the body."""
    problems: list[Problem] = []

    def problem(field: str, message: str, value: Any) -> None:
        problems.append(
            {"type": "value_error", "loc": [*loc, field], "msg": message, "input": value}
        )

    if request.language != "python" and request.session_id is not None:
        problem("session_id", f"sessions run Python; language is {request.language!r}", None)
    code_bytes = len(request.code.encode("utf-8", "surrogatepass"))
    if code_bytes > settings.max_code_bytes:
        problem("code", f"code is {code_bytes} bytes; at most {settings.max_code_bytes}", None)
    if request.timeout > settings.max_timeout:
        problem("timeout", f"timeout must be <= {settings.max_timeout}", request.timeout)
    if request.memory_mb > settings.max_memory_mb:
        problem("memory_mb", f"memory_mb must be <= {settings.max_memory_mb}", request.memory_mb)
    stdin_bytes = utf8_size(request.stdin)
    if stdin_bytes > settings.max_stdin_bytes:
        problem("stdin", f"stdin is {stdin_bytes} bytes; at most {settings.max_stdin_bytes}", None)
    files_bytes = sum(decoded_size(data) for data in request.files.values())
    if files_bytes > settings.max_files_bytes:
        problem(
            "files", f"files total {files_bytes} bytes; at most {settings.max_files_bytes}", None
        )
    if len(request.files) > settings.max_input_files:
        problem("files", f"{len(request.files)} files; at most {settings.max_input_files}", None)
    if len(request.fetch_files) > settings.max_fetch_files:
        message = f"{len(request.fetch_files)} paths; at most {settings.max_fetch_files}"
        problem("fetch_files", message, None)
    for field, paths in (("files", request.files), ("fetch_files", request.fetch_files)):
        longest = max(map(utf8_size, paths), default=0)
        if longest > settings.max_path_bytes:
            message = f"a path of {longest} bytes; at most {settings.max_path_bytes}"
            problem(field, message, None)
    return problems


def utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8 (lone surrogates, refused elsewhere, count as three)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def check_batch(
    batch: BatchRequest, settings: Settings, max_in_flight: int | None = None
) -> list[Problem]:
    """Problems of a batch, each naming the index of its item. `max_in_flight`: the caller's
    tenant's quota of calls in flight; a batch over it could never be admitted (a 429 would be
    retried forever), so it is refused as invalid."""
    most = settings.max_batch if max_in_flight is None else min(settings.max_batch, max_in_flight)
    if len(batch.requests) > most:
        why = "" if most == settings.max_batch else " for this key (its quota of calls in flight)"
        return [
            {
                "type": "too_long",
                "loc": ["body", "requests"],
                "msg": f"a batch holds at most {most} requests{why}",
                "input": None,
            }
        ]
    problems: list[Problem] = []
    for index, request in enumerate(batch.requests):
        problems.extend(check_request(request, settings, ("body", "requests", index)))
    return problems
