"""Wire models of the HTTP API (docs/api.md): pydantic, shared by the client and the service.

The one definition of the request and result schemas and of the status enum. It lives in the
client package because the client installs alone (Python 3.10+, httpx and pydantic only); the
service imports it from here.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = [
    "INFRASTRUCTURE_STATUSES",
    "BatchRequest",
    "BatchResponse",
    "ExecuteRequest",
    "ExecuteResult",
    "ForkRequest",
    "ForkResponse",
    "GroupCancelled",
    "Status",
    "VerifyItem",
    "VerifyResponse",
    "VerifyResult",
    "validate_relative_path",
]


class Status(str, enum.Enum):
    """Outcome of one execution, as named by the API spec.

    A str enum that works on Python 3.10 (enum.StrEnum is 3.11+): members compare equal to their
    values, and str() and format() give the value, as StrEnum's do.
    """

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    KILLED = "killed"
    QUEUE_TIMEOUT = "queue_timeout"
    SANDBOX_ERROR = "sandbox_error"
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)


SEED_BOUND = 2**32
"""Seeds are integers in [0, SEED_BOUND): numpy's legacy global generator takes no more."""
INFRASTRUCTURE_STATUSES = frozenset(
    {Status.QUEUE_TIMEOUT, Status.SANDBOX_ERROR, Status.CANCELLED, Status.DEADLINE_EXCEEDED}
)
"""Statuses that say what became of the call in the service, never what the program did: the
program did not run, or was stopped from outside, so its output says nothing of the model."""

GROUP_PATTERN = r"^[A-Za-z0-9._:/-]{1,128}$"
"""A group label: 1 to 128 characters of letters, digits and `._:/-` (API.md, Groups)."""
MAX_DEADLINE_S = 86400.0
"""The largest `deadline_s` (a day): a deadline is finite, and past a day it bounds nothing."""

SUPPORTED_LANGUAGES = ("python", "cpp", "java", "javascript", "bash")
"""Every `language` of /execute (javascript: Node; java: a public class, or Main, with main)."""
COMPILED_LANGUAGES = ("cpp", "java")
"""Languages compiled in the jail before they run: their results carry `compile`."""
JAIL_WRITABLE_ROOTS = ("/home/sandbox", "/tmp", "/mnt")
"""The jail's working directory and the other writable directories that absolute paths may name
on the peer-compatible routes (see ABSOLUTE_PATHS)."""
ABSOLUTE_PATHS = "absolute_paths"
"""Validation context key: True lets `files`/`fetch_files` name absolute paths inside
JAIL_WRITABLE_ROOTS, as SandboxFusion's clients do; /execute never sets it."""
MIN_TIMEOUT_S = 0.001
"""The shortest time limit of a program on every route: the jail refuses a shorter one (a run
cannot even start in less; such a request is refused with a 422, not run)."""
MAX_PATH_CHARS = 1024
"""Longest path in `files` or `fetch_files`, in characters (the server's max_path_bytes may
bound its UTF-8 bytes lower)."""
MAX_VERIFY_TEXT_CHARS = 65536
"""Longest `answer` or `reference` of a verify item."""
WIRE_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)
"""Every request model: unknown fields refused, and NaN, Infinity and -Infinity (or 1e999, which
parses as Infinity) refused in every number field, so no limit is ever compared with a NaN."""


def shown(text: str, limit: int = 64) -> str:
    """repr() of `text`, cut to about `limit` characters: an error message never echoes a field
    in full."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def validate_text(value: str, what: str) -> str:
    """Accept text that can be encoded as UTF-8 (JSON lets a lone surrogate through)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{what} is not valid Unicode (a lone surrogate)") from exc
    return value


def validate_relative_path(path: str) -> str:
    """Accept a relative path inside the working directory; reject absolute paths and `..`."""
    if len(path) > MAX_PATH_CHARS:
        raise ValueError(f"path {shown(path)} is longer than {MAX_PATH_CHARS} characters")
    validate_text(path, "a path")
    if not path or path.startswith("/") or "\x00" in path or "\\" in path:
        raise ValueError(f"path {shown(path)} must be a non-empty relative path")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"path {shown(path)} must not contain empty, '.' or '..' components")
    return path


def validate_jail_path(path: str) -> str:
    """A relative path, or an absolute one inside one of the jail's writable directories."""
    if len(path) > MAX_PATH_CHARS:  # the whole path, its root included, as the jail counts it
        raise ValueError(f"path {shown(path)} is longer than {MAX_PATH_CHARS} characters")
    for root in JAIL_WRITABLE_ROOTS:
        if path.startswith(root + "/"):
            validate_relative_path(path[len(root) + 1 :])
            return path
    if path.startswith("/"):
        raise ValueError(
            f"path {shown(path)} is outside the jail's writable directories "
            f"({', '.join(JAIL_WRITABLE_ROOTS)})"
        )
    return validate_relative_path(path)


def _path_rule(info: ValidationInfo) -> Callable[[str], str]:
    allowed = isinstance(info.context, dict) and info.context.get(ABSOLUTE_PATHS) is True
    return validate_jail_path if allowed else validate_relative_path


class ExecuteRequest(BaseModel):
    """One program to run."""

    model_config = WIRE_CONFIG

    code: str
    language: str = "python"
    stdin: str = ""
    timeout: Annotated[float, Field(ge=MIN_TIMEOUT_S)] = 10.0
    memory_mb: Annotated[int, Field(ge=16)] = 1024
    session_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    files: dict[str, str] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)
    seed: Annotated[int, Field(ge=0, lt=SEED_BOUND, strict=True)] | None = None
    """Seeds the generators the jail preloads (random, numpy.random's global state, sympy's,
    mpmath's through random) at the start of the run or cell; null: fresh entropy per run."""
    group: Annotated[str, Field(pattern=GROUP_PATTERN)] | None = None
    """A label of the caller's choosing (a rollout, a GRPO group, a step): the whole group can be
    cancelled at once (POST /groups/{group}/cancel)."""
    deadline_s: Annotated[float, Field(gt=0, le=MAX_DEADLINE_S, allow_inf_nan=False)] | None = None
    """Seconds from admission after which the result is no longer wanted: not started then, or
    stopped, it answers `deadline_exceeded`."""

    @field_validator("code", "stdin", "session_id")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        return None if value is None else validate_text(value, "the text")

    @field_validator("language")
    @classmethod
    def _supported_language(cls, value: str) -> str:
        if value not in SUPPORTED_LANGUAGES:
            raise ValueError(
                f"language {shown(value)} is not supported; "
                f"supported: {', '.join(SUPPORTED_LANGUAGES)}"
            )
        return value

    @field_validator("files")
    @classmethod
    def _files_are_relative_base64(
        cls, value: dict[str, str], info: ValidationInfo
    ) -> dict[str, str]:
        check_path = _path_rule(info)
        for path, content in value.items():
            check_path(path)
            try:
                base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"files[{shown(path)}] is not valid base64") from exc
        return value

    @field_validator("fetch_files")
    @classmethod
    def _fetch_files_are_relative(cls, value: list[str], info: ValidationInfo) -> list[str]:
        check_path = _path_rule(info)
        for path in value:
            check_path(path)
        return value


class ProgramError(BaseModel):
    """An uncaught exception, in Jupyter's terms."""

    ename: str
    """Its class name, e.g. "ZeroDivisionError"."""
    evalue: str
    """str() of it."""
    traceback: list[str]
    """The lines Python printed to stderr for it."""


def _png_or_none(value: object) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if data.startswith(b"\x89PNG\r\n\x1a\n") else None


class CompileResult(BaseModel):
    """A compiled language's compile step (`cpp`, `java`): g++ or javac in the jail, or the
    cache."""

    status: Status
    """ok, error (the compiler refused the source), timeout, memory_limit or killed."""
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    """The compiler's messages."""
    wall_time: float = 0.0
    cached: bool = False
    """The binary came from the host's cache of this API key's compiled sources."""


class ExecuteResult(BaseModel):
    """What happened to one execution."""

    id: str
    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    """True when stdout was cut: its head and tail are kept around an omission marker."""
    stderr_truncated: bool = False
    """True when stderr was cut, as stdout."""
    stdout_bytes: int = 0
    """Bytes the program wrote to stdout, before any cut."""
    stderr_bytes: int = 0
    """Bytes the program wrote to stderr, before any cut."""
    wall_time: float = 0.0
    cpu_time: float = 0.0
    peak_memory_mb: float | None = None
    queue_time: float = 0.0
    files: dict[str, str] = Field(default_factory=dict)
    restored: bool = False
    """True when the session was rebuilt by replaying its earlier cells before this one ran."""
    display: list[dict[str, str]] = Field(default_factory=list)
    """Rich outputs in the order produced: each matplotlib figure open at the end of the run (or
    shown with plt.show()) as {"image/png": base64}; in a session, the last expression's value as
    {"text/plain": repr} (also printed) with its rich representations beside it (text/html,
    text/markdown, application/json as JSON text, text/latex, image/svg+xml, image/png). Empty
    when there are none."""
    error: ProgramError | None = None
    """The uncaught exception that ended the program or session cell; null when none did."""
    compile: CompileResult | None = None
    """`language` `cpp` or `java`: its compile step; null for the others. A source that does
    not compile is status `error` with the compiler's messages in `stderr` (and here), and
    never ran."""

    def images(self) -> list[bytes]:
        """The PNG images among the displays (matplotlib figures), decoded, in order; a value
        that is not strict base64 of a PNG is left out (never raises)."""
        decoded = (_png_or_none(item.get("image/png")) for item in self.display)
        return [image for image in decoded if image is not None]

    def fetched_files(self) -> dict[str, bytes]:
        """The `fetch_files` that existed after the run, decoded: path -> bytes."""
        return {path: base64.b64decode(data) for path, data in self.files.items()}


class GroupCancelled(BaseModel):
    """The answer of POST /groups/{group}/cancel."""

    group: str
    cancelled: int
    """Calls of the group that were queued or running and are now answered `cancelled`."""
    sessions: int = 0
    """Sessions of the group that were ended."""


class BatchRequest(BaseModel):
    """Several programs, run in parallel across workers."""

    model_config = WIRE_CONFIG

    requests: list[ExecuteRequest] = Field(min_length=1)


class BatchResponse(BaseModel):
    """Results in the order of the requests."""

    results: list[ExecuteResult]


class ForkRequest(BaseModel):
    """How many copies of a session to make (POST /sessions/{session_id}/fork)."""

    model_config = ConfigDict(extra="forbid")

    n: Annotated[int, Field(ge=1)]
    """New sessions to make, 1 to the server's `max_fork_n` (default 64)."""


class ForkResponse(BaseModel):
    """The new sessions, each a copy of the parent as it was when the fork ran."""

    session_ids: list[str]


VerdictName = Literal["correct", "incorrect", "timeout", "invalid"]
UNJUDGED_REASONS = frozenset({"queue_timeout", "sandbox_error"})
"""Reasons of an `invalid` verdict that mean the service could not judge the item: retry it."""


VERIFY_STARTUP_S = 10.0
"""Allowance per verification job for importing the checker in the jail (sympy is preloaded;
math-verify and its LaTeX grammar take about a second on a busy core)."""
VERIFY_ITEM_SLACK_S = 0.5
"""Allowance per item beyond its limit: the fork, the kill, the reap."""
VERIFY_MAX_ITEMS_PER_JOB = 32
"""Most items one job judges: more amortise the import, fewer spread over workers."""


def verify_job_timeout_s(num_items: int, item_timeout_s: float) -> float:
    """The program limit of a verification job of num_items items: the server kills it there,
    and a client sizes its read timeout by its slowest job."""
    return VERIFY_STARTUP_S + num_items * (item_timeout_s + VERIFY_ITEM_SLACK_S)


class VerifyItem(BaseModel):
    """One final answer and the reference it should equal (POST /verify)."""

    model_config = WIRE_CONFIG

    answer: Annotated[str, Field(max_length=MAX_VERIFY_TEXT_CHARS)]
    """The extracted final answer (e.g. the content of the last `\\boxed{}`), LaTeX or plain."""
    reference: Annotated[str, Field(max_length=MAX_VERIFY_TEXT_CHARS)]
    """The ground truth."""

    @field_validator("answer", "reference")
    @classmethod
    def _encodable(cls, value: str) -> str:
        return validate_text(value, "the text")


class VerifyRequest(BaseModel):
    """Answers to check, each under its own time limit."""

    model_config = WIRE_CONFIG

    items: list[VerifyItem] = Field(min_length=1)
    timeout: Annotated[float, Field(ge=MIN_TIMEOUT_S)] = 5.0
    """Seconds one item's check may take; past it the item is `timeout` (its check is killed)."""
    rel_tol: Annotated[float, Field(ge=0, lt=1)] = 1e-6
    """Relative tolerance for non-integer numbers; an integer reference must match exactly."""


class VerifyResult(BaseModel):
    """The judgement of one item (docs/service.md, "Answer verification")."""

    verdict: VerdictName
    reason: str
    """Why, as a code (see docs/service.md); `queue_timeout` and `sandbox_error` mean the
    service could not judge the item: retry it."""
    detail: str = ""
    time: float = 0.0
    """Seconds the check took in its worker."""

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"

    @property
    def judged(self) -> bool:
        """False for `queue_timeout` and `sandbox_error`: the service did not judge the item."""
        return self.reason not in UNJUDGED_REASONS


class VerifyResponse(BaseModel):
    """Verdicts in the order of the items."""

    results: list[VerifyResult]
