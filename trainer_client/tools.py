"""Tool calling for rollout loops: the tool's schema, parsing model output, rendering results.

Pure functions (no I/O) except `execute_tool_call`, which awaits any object with the client's
`execute`. Formats follow the rStar2-Agent release: Hermes/Qwen `<tool_call>{json}</tool_call>`
blocks in, "Tool call success" / "Tool call failure" text out, cut in the middle as VERL does.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from trainer_client.errors import InvalidRequestError
from trainer_client.wire import ExecuteResult, Status

PYTHON_TOOL_NAME = "python_code_with_standard_io"
JUPYTER_TOOL_NAME = "jupyter_code"

_PYTHON_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PYTHON_TOOL_NAME,
        "description": (
            "Execute Python code with standard input and capture standard output. This function "
            "takes a Python code string and an input string, provides the input string through "
            "standard input (stdin) to the code, and captures and returns any output produced "
            "through standard output (stdout). If the executed code raises an exception, the "
            "error message will be captured and returned instead."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": (
                        "A string containing Python code to be executed. The code can read from "
                        "standard input using the input() function."
                    ),
                },
                "input": {
                    "type": "string",
                    "description": (
                        "A string that will be provided as standard input to the code when it "
                        "calls input()."
                    ),
                },
            },
            "required": ["code", "input"],
        },
    },
}


_JUPYTER_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": JUPYTER_TOOL_NAME,
        "description": "Execute python code in a Jupyter notebook cell and return result",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "The python code to execute in a single cell",
                },
            },
            "required": ["code"],
        },
    },
}


def python_tool_schema() -> dict[str, Any]:
    """The OpenAI-style function schema of `python_code_with_standard_io`, for the prompt."""
    return copy.deepcopy(_PYTHON_TOOL_SCHEMA)


def jupyter_tool_schema() -> dict[str, Any]:
    """The schema of the stateful `jupyter_code` tool (rStar2-Agent's jupyter tool config).

    Each call is a notebook cell of the trajectory's session: variables and imports persist,
    the last expression's value is shown. Run it with `execute_tool_call(..., session_id=...)`.
    """
    return copy.deepcopy(_JUPYTER_TOOL_SCHEMA)


# --- parsing ------------------------------------------------------------------------------------

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(_OPEN) + r"(.*?)" + re.escape(_CLOSE), re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One `<tool_call>` block of model output: a call, or why it could not be read."""

    name: str | None
    """The function named; None when the block could not be parsed that far."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """The arguments object (a JSON-encoded string of an object is decoded too)."""
    raw: str = ""
    """The text between the tags, as the model wrote it."""
    error: str | None = None
    """Why the block is not a valid call; the model must be told (see format_parse_error)."""

    @property
    def ok(self) -> bool:
        """True when the block parsed into a name and an arguments object."""
        return self.error is None


def _parse_block(raw: str, *, strict_json: bool) -> ToolCall:
    try:
        obj = json.loads(raw, strict=strict_json)
    except json.JSONDecodeError as exc:
        return ToolCall(None, raw=raw, error=str(exc))
    if not isinstance(obj, dict):
        return ToolCall(None, raw=raw, error=f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, raw=raw, error="missing or non-string 'name'")
    if "arguments" not in obj:
        return ToolCall(name, raw=raw, error="missing 'arguments'")
    arguments = obj["arguments"]
    if isinstance(arguments, str):
        # Some chat templates double-encode the arguments; the intent is unambiguous.
        try:
            arguments = json.loads(arguments, strict=strict_json)
        except json.JSONDecodeError as exc:
            return ToolCall(name, raw=raw, error=f"'arguments' is a string but not JSON: {exc}")
    if not isinstance(arguments, dict):
        kind = type(arguments).__name__
        return ToolCall(name, raw=raw, error=f"'arguments' must be a JSON object, got {kind}")
    return ToolCall(name, arguments, raw=raw)


def parse_tool_calls(text: str, *, strict_json: bool = False) -> list[ToolCall]:
    """Every `<tool_call>{json}</tool_call>` block of `text`, in order; none is ever dropped.

    A block that is not valid JSON, lacks `name`/`arguments`, or is left open at the end of the
    text comes back as a ToolCall with `error` set. `strict_json=False` accepts raw newlines and
    tabs inside JSON strings (models often write code that way); True matches json.loads.
    """
    calls: list[ToolCall] = []
    end = 0
    for match in _BLOCK.finditer(text):
        calls.append(_parse_block(match.group(1), strict_json=strict_json))
        end = match.end()
    tail = text.find(_OPEN, end)
    if tail != -1:
        raw = text[tail + len(_OPEN) :]
        calls.append(ToolCall(None, raw=raw, error=f"unterminated {_OPEN} block (no {_CLOSE})"))
    return calls


def format_parse_error(call: ToolCall) -> str:
    """The tool response telling the model its block could not be decoded (rStar2 wording)."""
    return f"Failed to decode tool call: {call.error}"


# --- rendering results --------------------------------------------------------------------------

TRUNCATION_MARKER = "...(truncated)..."

# code-judge's `reason` for each of our statuses: "" for a program that just failed, and
# worker_timeout, queue_timeout, internal_error; a MemoryError or a signal was a plain failure.
_RSTAR2_REASONS = {
    Status.ERROR: "",
    Status.TIMEOUT: "worker_timeout",
    Status.MEMORY_LIMIT: "",
    Status.KILLED: "",
    Status.QUEUE_TIMEOUT: "queue_timeout",
    Status.SANDBOX_ERROR: "internal_error",
    Status.CANCELLED: "internal_error",
    Status.DEADLINE_EXCEEDED: "internal_error",
}

ResponseStyle = Literal["rstar2", "status"]


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the first and last max_chars // 2 characters around a marker, as VERL's 'middle'."""
    if max_chars < 2:
        raise ValueError("max_chars must be at least 2")
    if len(text) <= max_chars:
        return text
    keep = max_chars // 2
    return text[:keep] + TRUNCATION_MARKER + text[-keep:]


TOKEN_OMISSION_MARKER = "\n[... {omitted} characters omitted ...]\n"
"""Put between the head and the tail of a response cut to a token budget."""
CountTokens = Callable[[str], int]
"""Any function from text to its length in tokens (e.g. `lambda t: len(tok.encode(t))`)."""


def _head_and_tail(text: str, keep: int) -> str:
    head = keep // 2
    tail = keep - head
    omitted = len(text) - keep
    return text[:head] + TOKEN_OMISSION_MARKER.format(omitted=omitted) + text[len(text) - tail :]


def truncate_to_tokens(text: str, max_tokens: int, count_tokens: CountTokens) -> str:
    """`text` if it fits in `max_tokens`; else its head and tail (half of the characters kept
    each) around a marker naming how many characters were left out, as many kept as fit.

    The count is the caller's tokenizer, called about log2(len(text)) times. When not even
    the marker fits, the longest prefix that fits, without a marker.
    """
    if max_tokens < 0:
        raise ValueError("max_tokens must be at least 0")
    if count_tokens(text) <= max_tokens:
        return text
    low, high = -1, len(text) - 1  # the most characters kept whose cut fits (-1: none)
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(_head_and_tail(text, middle)) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    if low >= 0:
        return _head_and_tail(text, low)
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(text[:middle]) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def failure_reason(result: ExecuteResult, style: ResponseStyle = "rstar2") -> str:
    """The `reason:` of a failed call: code-judge's words (rstar2) or our status name (status)."""
    if style == "status":
        return result.status
    return _RSTAR2_REASONS.get(result.status, result.status)


def format_tool_response(
    result: ExecuteResult,
    *,
    style: ResponseStyle = "rstar2",
    max_chars: int | None = 256,
    mention_images: bool = True,
    max_tokens: int | None = None,
    count_tokens: CountTokens | None = None,
) -> str:
    """The text the model sees for one execution, in the rStar2-Agent release's format.

    `max_chars=256` is the release's (VERL's) default, cut in the middle; None keeps everything.
    `style="status"` names our statuses in `reason:` (timeout, memory_limit, ...) instead of
    code-judge's reasons, which say nothing for a crash, a MemoryError or a signal.
    `mention_images` adds an `images:` line when the run produced figures (a text-only model
    otherwise cannot know that its plot exists); the images themselves are `result.images()`.
    `max_tokens` with `count_tokens` (the policy's tokenizer as a text -> count function) cuts
    the response to that many tokens, head and tail, saying how many characters it left out
    (truncate_to_tokens); with max_chars too, the character cut comes first.
    """
    if max_tokens is not None and count_tokens is None:
        raise ValueError("max_tokens needs count_tokens, the tokenizer that counts them")
    lines = ["Tool call success" if result.status == Status.OK else "Tool call failure"]
    if result.status != Status.OK:
        lines.append(f"reason: {failure_reason(result, style)}")
    if result.stdout:
        lines.append(f"stdout: {result.stdout}")
    if result.stderr:
        lines.append(f"stderr: {result.stderr}")
    images = len(result.images()) if mention_images else 0
    if images:
        lines.append(f"images: {images} produced (image/png)")
    lines.append(f"execution time: {result.wall_time:.2f}s")
    text = "\n".join(lines)
    if max_chars is not None:
        text = truncate_middle(text, max_chars)
    if max_tokens is not None and count_tokens is not None:
        text = truncate_to_tokens(text, max_tokens, count_tokens)
    return text


# --- running a parsed call ----------------------------------------------------------------------


class Executes(Protocol):
    """Anything with SandboxClient.execute's signature (the client, or a test double)."""

    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float = 10.0,
        session_id: str | None = None,
    ) -> ExecuteResult:
        """Run one program (in the session `session_id`, when given)."""
        ...


async def execute_tool_call(
    client: Executes,
    call: ToolCall,
    *,
    timeout: float = 10.0,
    style: ResponseStyle = "rstar2",
    max_chars: int | None = 256,
    session_id: str | None = None,
) -> str:
    """Run one parsed tool call and return the tool-response text for the model.

    `python_code_with_standard_io` runs statelessly; `jupyter_code` runs as a cell of the
    session `session_id` (one per trajectory; end it with the client's end_session), and is
    refused without one. Mistakes of the model (unparseable block, unknown tool, bad arguments,
    a request the service rejects) become text the model is shown, worded as in the rStar2
    release. Failures of the service itself (CallFailedError) are raised: they are not the
    model's fault.
    """
    if call.error is not None:
        return format_parse_error(call)
    tools = (PYTHON_TOOL_NAME, JUPYTER_TOOL_NAME) if session_id else (PYTHON_TOOL_NAME,)
    if call.name not in tools:
        known = " or ".join(repr(name) for name in tools)
        return f"Error when executing tool: unknown tool {call.name!r}; use {known}"
    code, stdin = call.arguments.get("code"), call.arguments.get("input", "")
    if not isinstance(code, str):
        return "Error when executing tool: argument 'code' must be a string"
    if stdin is None:
        stdin = ""
    if not isinstance(stdin, str):
        return "Error when executing tool: argument 'input' must be a string"
    cell_session = session_id if call.name == JUPYTER_TOOL_NAME else None
    try:
        if cell_session is None:
            result = await client.execute(code, stdin=stdin, timeout=timeout)
        else:
            result = await client.execute(code, timeout=timeout, session_id=cell_session)
    except InvalidRequestError as exc:
        return f"Error when executing tool: {exc.detail}"
    return format_tool_response(result, style=style, max_chars=max_chars)
