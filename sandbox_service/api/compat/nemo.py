"""NeMo-Skills' sandbox wire (nemo_skills/code_execution/sandbox.py, LocalSandbox) mapped onto ours
(pure).

    POST /execute {"generated_code", "timeout", "language", "std_input", "max_output_characters",
                   "traceback_verbosity"} + `X-Session-ID` (required for `ipython`)
    -> {"process_status": "completed" | "error" | "timeout", "stdout", "stderr",
        "new_session_created"}
    DELETE /sessions/{id} + `X-Session-ID` -> 200, or 404 for an unknown session

`ipython` runs as a cell of our session named by `X-Session-ID` (in the caller's tenant);
`python`, `python3` and `pypy3` run as one program with `std_input`, `completed` whatever its exit
code, as NeMo-Skills' server answers. `new_session_created` is always false: our sessions
restore themselves server-side, and a true value makes the client delete the session and replay
its own history on top. `lean4` and `shell` are refused (400, in the same shape).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from sandbox_service.execution import Status
from trainer_client.wire import ExecuteResult

STATEFUL = "ipython"
STATELESS = frozenset({"python", "python3", "pypy3"})
CUT = "<output cut>"
MAX_SESSION_ID_CHARS = 256
"""The longest `X-Session-ID` (our session ids' bound)."""


def is_nemo_body(body: bytes) -> bool:
    """Whether a `POST /execute` body is NeMo-Skills' (a top-level `generated_code`, no `code`);
    a native body never has that key (our request model forbids unknown fields)."""
    if b'"generated_code"' not in body:
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and "generated_code" in parsed and "code" not in parsed


@dataclass(frozen=True, slots=True)
class NemoCall:
    """A validated NeMo-Skills execute request."""

    code: str
    timeout_s: float
    stateful: bool
    stdin: str
    max_output_characters: int


def answer(status: str, stdout: str = "", stderr: str = "") -> dict[str, Any]:
    """A response in NeMo-Skills' shape."""
    return {
        "process_status": status,
        "stdout": stdout,
        "stderr": stderr,
        "new_session_created": False,
    }


def encodable(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (JSON lets a lone surrogate through)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def seconds(value: object) -> float | None:
    """A JSON number as a finite float, or None (not a number, NaN, Infinity, or an integer
    too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        as_float = float(value)
    except OverflowError:
        return None
    return as_float if math.isfinite(as_float) else None


def parse_call(
    body: bytes, session_header: str | None, max_timeout_s: float
) -> NemoCall | dict[str, Any]:
    """The call a body asks for, or the 400 answer that refuses it."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return answer("error", stderr="the body is not valid JSON\n")
    code = data.get("generated_code")
    if not isinstance(code, str) or not encodable(code):
        return answer("error", stderr="generated_code must be a string of valid Unicode\n")
    language = data.get("language", STATEFUL)
    if not isinstance(language, str) or (language != STATEFUL and language not in STATELESS):
        why = f"language {str(language)[:32]!r} is not supported here; use ipython or python\n"
        return answer("error", stderr=why)
    timeout = seconds(data.get("timeout", 10.0))
    if timeout is None:
        return answer("error", stderr="timeout must be a finite number of seconds\n")
    if timeout <= 0:
        return answer("error", stderr="timeout must be greater than 0\n")
    stdin = data.get("std_input", "") or ""
    limit = data.get("max_output_characters", 1000)
    if not isinstance(stdin, str) or not encodable(stdin):
        return answer("error", stderr="std_input must be a string of valid Unicode\n")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        return answer("error", stderr="max_output_characters must be a non-negative integer\n")
    if language == STATEFUL and not session_header:
        return answer("error", stderr="X-Session-ID header required for ipython sessions\n")
    if session_header is not None and len(session_header) > MAX_SESSION_ID_CHARS:
        why = f"X-Session-ID longer than {MAX_SESSION_ID_CHARS} characters\n"
        return answer("error", stderr=why)
    return NemoCall(
        code=code,
        timeout_s=min(timeout, max_timeout_s),
        stateful=language == STATEFUL,
        stdin=stdin,
        max_output_characters=limit,
    )


def _cut(text: str, limit: int) -> str:
    return text[:limit] + CUT if len(text) > limit else text


def to_answer(result: ExecuteResult, call: NemoCall) -> dict[str, Any]:
    """Our result in NeMo-Skills' shape (outputs cut at max_output_characters, as there)."""
    status = Status(result.status)
    limit = call.max_output_characters
    if status is Status.TIMEOUT:
        why = f"Execution timed out after {call.timeout_s:g} seconds\n"
        return answer("timeout", _cut(result.stdout, limit), _cut(result.stderr + why, limit))
    if status is Status.OK or (status is Status.ERROR and not call.stateful):
        return answer("completed", _cut(result.stdout, limit), _cut(result.stderr, limit))
    stderr = result.stderr
    if status not in (Status.OK, Status.ERROR):
        stderr += f"\nthe cell ended with status {status}\n"
    return answer("error", _cut(result.stdout, limit), _cut(stderr, limit))
