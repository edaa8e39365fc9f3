"""What travels through Redis: the job payload, the result and the completion notice (pure).

One request becomes one JobPayload (JSON in the RQ job), which the worker turns into an
ExecutionSpec; the ExecutionResult comes back as a result dict with the fields of the API's
ExecuteResult, stored under its own key and pushed, usually inline, in a completion notice.
Short keys keep the per-job JSON small: it is parsed twice per call on the hot path.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from sandbox_service.execution import (
    CompileOutcome,
    ExecutionResult,
    ExecutionSpec,
    Limits,
    ProgramError,
    Status,
)
from trainer_client.wire import COMPILED_LANGUAGES

if TYPE_CHECKING:
    from sandbox_service.settings import Settings

ResultDict = dict[str, Any]
"""A result in the wire shape of ExecuteResult (files base64-encoded)."""

INLINE_RESULT_MAX_BYTES = 32768
"""Results up to this size ride inside the notice; larger ones are fetched from their key."""


@dataclass(frozen=True, slots=True)
class JobPayload:
    """One admitted execution request, as a worker receives it."""

    code: str
    stdin: str = ""
    timeout_s: float = 10.0
    memory_mb: int = 1024
    files: dict[str, str] = field(default_factory=dict)
    """Relative path -> base64 content."""
    fetch_files: tuple[str, ...] = ()
    session_id: str | None = None
    request_id: str = ""
    reply_to: str = ""
    """Redis list on which the worker pushes the completion notice."""
    admitted_at: float = 0.0
    """Epoch seconds when the API admitted the request (queue_time counts from here)."""
    start_by: float = 0.0
    """Epoch seconds; a worker that dequeues the job later answers queue_timeout, never runs it."""
    attempt: int = 1
    """1 for the first run; 2 when re-run after its worker was lost."""
    end_session: bool = False
    """Not a cell: end the session `session_id` (free its interpreter, forget its cells)."""
    seed: int | None = None
    """Seeds the jail's preloaded random generators (None: fresh entropy)."""
    output_bytes: int = 0
    """The stdout/stderr cap of a job the service itself writes (`/verify`'s checker, whose
    verdict lines must fit whatever `max_output_bytes` is); 0: the host's cap. Never a client's."""
    fork_to: tuple[str, ...] = ()
    """Not a cell: fork the session `session_id` into these new sessions (internal ids)."""
    group: str | None = None
    """The group's internal id (the tenant's scoped label), or None."""
    deadline: float = 0.0
    """Epoch seconds past which the result is no longer wanted (0: none): a worker does not
    start it then, and stops it there (`deadline_exceeded`)."""
    language: str = "python"
    """`python`, or another of SUPPORTED_LANGUAGES (jail/languages.py)."""
    tenant: str = "default"
    """The tenant whose request this is: its compiled binaries are its own."""
    keep_processes: bool = False
    """Session cell: the processes it leaves keep running after it (E2B's background commands);
    otherwise they are killed when it ends. Set by the service's E2B wire, never a client."""

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict stored in the RQ job."""
        wire: dict[str, Any] = {
            "c": self.code,
            "t": self.timeout_s,
            "m": self.memory_mb,
            "rid": self.request_id,
            "re": self.reply_to,
            "at": self.admitted_at,
            "sb": self.start_by,
        }
        if self.stdin:
            wire["i"] = self.stdin
        if self.files:
            wire["f"] = self.files
        if self.fetch_files:
            wire["ff"] = list(self.fetch_files)
        if self.session_id is not None:
            wire["s"] = self.session_id
        if self.attempt != 1:
            wire["n"] = self.attempt
        if self.end_session:
            wire["e"] = 1
        if self.seed is not None:
            wire["sd"] = self.seed
        if self.output_bytes:
            wire["ob"] = self.output_bytes
        if self.fork_to:
            wire["fk"] = list(self.fork_to)
        if self.group is not None:
            wire["g"] = self.group
        if self.deadline:
            wire["dl"] = self.deadline
        if self.language != "python":
            wire["lg"] = self.language
            wire["tn"] = self.tenant
        if self.keep_processes:
            wire["kp"] = 1
        return wire

    @staticmethod
    def reply_to_of(wire: object) -> str:
        """The reply list of a wire payload that may be malformed (so that even a job that
        cannot be decoded is answered, not dropped); "" when there is none."""
        reply_to = wire.get("re", "") if isinstance(wire, dict) else ""
        return reply_to if isinstance(reply_to, str) else ""

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> JobPayload:
        """Inverse of to_wire."""
        return cls(
            code=wire["c"],
            stdin=wire.get("i", ""),
            timeout_s=float(wire["t"]),
            memory_mb=int(wire["m"]),
            files=dict(wire.get("f", {})),
            fetch_files=tuple(wire.get("ff", ())),
            session_id=wire.get("s"),
            request_id=wire.get("rid", ""),
            reply_to=wire.get("re", ""),
            admitted_at=float(wire.get("at", 0.0)),
            start_by=float(wire.get("sb", 0.0)),
            attempt=int(wire.get("n", 1)),
            end_session=bool(wire.get("e", 0)),
            seed=None if wire.get("sd") is None else int(wire["sd"]),
            output_bytes=int(wire.get("ob", 0)),
            fork_to=tuple(str(child) for child in wire.get("fk", ())),
            group=wire.get("g"),
            deadline=float(wire.get("dl", 0.0)),
            language=str(wire.get("lg", "python")),
            tenant=str(wire.get("tn", "default")),
            keep_processes=bool(wire.get("kp", 0)),
        )

    def budget_timeout_s(self, max_timeout_s: float) -> float:
        """Program seconds the worker's budget covers: a session cell may first replay its
        session's earlier cells (each under the cell's own limit), so it gets the server's most."""
        return max(self.timeout_s, max_timeout_s) if self.session_id is not None else self.timeout_s

    def compile_budget_s(self, settings: Settings) -> float:
        """Seconds a compiled program may compile before it runs (0 for Python)."""
        return settings.compile_timeout_s if self.language in COMPILED_LANGUAGES else 0.0

    def worker_budget_s(self, settings: Settings) -> float:
        """How long a worker may hold this job (RQ's job timeout)."""
        program_s = self.budget_timeout_s(settings.max_timeout) + self.compile_budget_s(settings)
        return settings.job_timeout_s(program_s)

    def api_wait_s(self, settings: Settings) -> float:
        """How long the API waits for this job's result before answering sandbox_error."""
        program_s = self.budget_timeout_s(settings.max_timeout) + self.compile_budget_s(settings)
        return settings.api_wait_s(program_s)

    def retried(self, now: float, queue_deadline_s: float) -> JobPayload:
        """The payload of the second attempt, with a fresh queue deadline (never past the
        request's own deadline)."""
        start_by = now + queue_deadline_s
        if self.deadline:
            start_by = min(start_by, self.deadline)
        return replace(self, attempt=self.attempt + 1, start_by=start_by)

    def past_deadline(self, now: float) -> bool:
        """Whether the request's own deadline has passed."""
        return bool(self.deadline) and now >= self.deadline

    def to_spec(self, execution_id: str, limits: Limits) -> ExecutionSpec:
        """The ExecutionSpec a worker hands its executor; `limits` carries the host's caps."""
        return ExecutionSpec(
            code=self.code,
            stdin=self.stdin,
            files={path: base64.b64decode(data) for path, data in self.files.items()},
            fetch_files=self.fetch_files,
            limits=_call_limits(
                limits, self.timeout_s, self.memory_mb, self.output_bytes or limits.max_output_bytes
            ),
            execution_id=execution_id,
            seed=self.seed,
            keep_processes=self.keep_processes,
        )


@functools.lru_cache(maxsize=256)
def _call_limits(limits: Limits, timeout_s: float, memory_mb: int, max_output_bytes: int) -> Limits:
    """The host's limits with a call's own (cached: a batch's calls mostly share them)."""
    return replace(
        limits, timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes
    )


NO_SESSION = "no such session"
"""stderr of a fork job (status error) whose session does not exist (deleted, expired, never
made)."""


CHUNK_SEP = "."
"""Separates a chunk's job id from an item's index in the item's execution id (job ids are hex)."""


def item_id(chunk_id: str, index: int) -> str:
    """The execution id of item `index` of the chunk job `chunk_id`."""
    return f"{chunk_id}{CHUNK_SEP}{index}"


def job_of(execution_id: str) -> str:
    """The RQ job that carries an execution: its chunk's job, or itself."""
    return execution_id.partition(CHUNK_SEP)[0]


def chunk_to_wire(items: tuple[JobPayload, ...], budgets_s: tuple[float, ...]) -> dict[str, Any]:
    """The JSON-ready dict of a chunk job: several calls run in turn by one worker, each with
    its own worker budget (seconds); `re` lets even an undecodable chunk be answered."""
    return {"k": [item.to_wire() for item in items], "b": list(budgets_s), "re": items[0].reply_to}


def chunk_from_wire(
    wire: object, dequeued_at: float | None = None
) -> list[tuple[JobPayload, float]] | None:
    """(payload, budget) of each item of a chunk's wire dict, or None when it is not a chunk.
    `dequeued_at`: when a worker took the chunk; an item it took in time is never late
    (its start-by time becomes infinite)."""
    if not isinstance(wire, dict) or "k" not in wire:
        return None
    items = wire["k"]
    if dequeued_at is not None:
        items = [
            {**item, "sb": math.inf} if dequeued_at <= float(item.get("sb", 0.0)) else item
            for item in items
        ]
    return [
        (JobPayload.from_wire(item), float(budget))
        for item, budget in zip(items, wire["b"], strict=True)
    ]


WIRE_NAMES = {"execution_id": "id"}
"""ExecutionResult fields whose ExecuteResult name differs; every other field keeps its name."""
INTERNAL_FIELDS = ("ended",)
"""ExecutionResult fields that are not ExecuteResult fields (on the wire only when set)."""
_RESULT_FIELDS = tuple(f.name for f in fields(ExecutionResult))


def result_to_wire(result: ExecutionResult, execution_id: str | None = None) -> ResultDict:
    """An ExecutionResult in the wire shape of ExecuteResult, field by field (the record is the
    one definition of a result; tests/unit/test_result_fields.py checks the wire model agrees).
    Bytes are encoded here, once."""
    wire: ResultDict = {}
    for name in _RESULT_FIELDS:
        value = getattr(result, name)
        if name == "files":
            value = {path: base64.b64encode(data).decode() for path, data in value.items()}
        elif name == "display":
            value = list(value)
        elif name == "error" and value is not None:
            value = _error_to_wire(value)
        elif name == "compile" and value is not None:
            value = _compile_to_wire(value)
        elif name == "status":
            value = str(value)
        elif name in INTERNAL_FIELDS and value is None:
            continue
        wire[WIRE_NAMES.get(name, name)] = value
    if execution_id is not None:
        wire["id"] = execution_id
    return wire


def _compile_to_wire(outcome: CompileOutcome) -> dict[str, Any]:
    return {
        "status": str(outcome.status),
        "exit_code": outcome.exit_code,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "wall_time": outcome.wall_time,
        "cached": outcome.cached,
    }


def _error_to_wire(error: ProgramError) -> dict[str, Any]:
    return {"ename": error.ename, "evalue": error.evalue, "traceback": list(error.traceback)}


def failure_result(
    status: Status, message: str, execution_id: str, queue_time: float = 0.0
) -> ResultDict:
    """The wire result of work that never ran or whose infrastructure failed."""
    failed = replace(ExecutionResult.failure(status, message), queue_time=max(0.0, queue_time))
    return result_to_wire(failed, execution_id)


def encode_result(result: ResultDict) -> str:
    """The JSON stored under the result key."""
    return json.dumps(result, separators=(",", ":"))


def encode_notice(execution_id: str, result_json: str) -> str:
    """The completion notice: the job id, with the result inline unless it is large."""
    if len(result_json) <= INLINE_RESULT_MAX_BYTES:
        return f'{{"id":{json.dumps(execution_id)},"r":{result_json}}}'
    return json.dumps({"id": execution_id})


def decode_notice(raw: bytes | str) -> tuple[str, ResultDict | None]:
    """(job id, result or None when it must be fetched from its key)."""
    notice = json.loads(raw)
    return str(notice["id"]), notice.get("r")
