"""The 422 answer: FastAPI's shape (`{"detail": [errors]}`), safe for any input the client sent.

A validation error echoes the offending input, and JSON lets a client send text that UTF-8
cannot encode (a lone surrogate such as the escape \\udc80): rendered as is, the error itself
failed to encode and the client got a 500. Such characters are written as their escapes.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response


def encodable(value: Any) -> Any:
    """`value` (JSON-like) with every string made encodable: unencodable characters escaped."""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {encodable(key): encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(item) for item in value]
    return value


async def invalid_request(request: Request, exc: Exception) -> Response:
    """422 with the validation errors, as FastAPI's default handler, but always encodable."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": encodable(jsonable_encoder(exc.errors()))}, status_code=422)
