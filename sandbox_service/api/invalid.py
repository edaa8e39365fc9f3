"""The 422 answer: FastAPI's shape (`{"detail": [errors]}`), safe and bounded for any input.

A validation error echoes the offending input, and a client can send what JSON cannot carry
back: text that UTF-8 cannot encode (a lone surrogate such as the escape \\udc80), NaN and
Infinity (or 1e999, which parses as Infinity), a body that is not UTF-8 at all (pydantic's
`json_invalid` error holds the raw bytes). Rendered as is, the error itself failed to encode and
the client got a 500. So every value of an error is rendered here by `shown`: strings with their
unencodable characters escaped, non-finite numbers and bytes as text, and everything bounded
(long strings and containers cut, at most MAX_ERRORS errors), so that a 60 MiB field is not
echoed back in full.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

MAX_ERRORS = 100
"""Errors rendered in one answer; the rest are counted in a last one."""
MAX_SHOWN_CHARS = 256
"""Characters of a string (or bytes) echoed back; the rest is summarised."""
MAX_SHOWN_ITEMS = 16
"""Items of a list or object echoed back; the rest are counted."""
MAX_SHOWN_DEPTH = 4
"""Nesting echoed back; deeper values are summarised."""
MAX_SHOWN_INT_BITS = 256
"""Larger integers are summarised (Python refuses to print one of more than 4,300 digits)."""
MAX_MESSAGE_CHARS = 4096
"""Characters of an error's `msg` (ours name limits; pydantic's may list allowed values)."""


def encodable(value: Any) -> Any:
    """`value` (JSON-like) with every string made encodable: unencodable characters escaped."""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {encodable(key): encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(item) for item in value]
    return value


def shown(value: Any, depth: int = 0, max_chars: int = MAX_SHOWN_CHARS) -> Any:
    """A JSON-safe, bounded rendering of any value a request could have carried."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_SHOWN_INT_BITS:
            return f"<an integer of {value.bit_length()} bits>"
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # 'nan', 'inf', '-inf'
    if isinstance(value, str):
        return _cut(encodable(value[: max_chars + 1]), len(value), "characters", max_chars)
    if isinstance(value, bytes | bytearray):
        text = bytes(value[: max_chars + 1]).decode("utf-8", "backslashreplace")
        return _cut(text, len(value), "bytes", max_chars)
    if depth >= MAX_SHOWN_DEPTH:
        return f"<{type(value).__name__}>"
    if isinstance(value, Mapping):
        items = list(value.items())
        out = {str(shown(k, depth + 1)): shown(v, depth + 1) for k, v in items[:MAX_SHOWN_ITEMS]}
        if len(items) > MAX_SHOWN_ITEMS:
            out["..."] = f"{len(items) - MAX_SHOWN_ITEMS} more keys"
        return out
    if isinstance(value, Sequence):
        shown_items = [shown(item, depth + 1) for item in value[:MAX_SHOWN_ITEMS]]
        if len(value) > MAX_SHOWN_ITEMS:
            shown_items.append(f"... {len(value) - MAX_SHOWN_ITEMS} more items")
        return shown_items
    # Anything else (an exception in `ctx`, a decimal): its text, bounded.
    return shown(str(value), depth, max_chars)


def _cut(text: str, length: int, unit: str, max_chars: int) -> str:
    if length <= max_chars:
        return text
    return f"{text[:max_chars]}... ({length} {unit})"


def _error(error: Any) -> Any:
    if not isinstance(error, Mapping):
        return shown(str(error), max_chars=MAX_MESSAGE_CHARS)
    return {
        str(shown(key)): shown(value, 1, MAX_MESSAGE_CHARS if key == "msg" else MAX_SHOWN_CHARS)
        for key, value in error.items()
    }


def rendered_errors(errors: Sequence[Any]) -> list[Any]:
    """The `detail` list of a 422: every error rendered by `shown`, at most MAX_ERRORS of them."""
    detail = [_error(error) for error in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        detail.append(
            {
                "type": "too_many_errors",
                "loc": ["body"],
                "msg": f"{len(errors) - MAX_ERRORS} more errors not shown",
                "input": None,
            }
        )
    return detail


async def invalid_request(request: Request, exc: Exception) -> Response:
    """422 with the validation errors, as FastAPI's default handler, but always renderable."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": rendered_errors(exc.errors())}, status_code=422)
