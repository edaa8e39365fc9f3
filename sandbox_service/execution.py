"""The typed values that flow from a request to a result inside the service.

ExecutionSpec (what to run, with which limits) -> jail -> ExecutionResult (what happened).
Pure data: no I/O, no pydantic models; the HTTP edge converts from and to the wire models
(trainer_client.wire, whose Status enum is the one both sides use).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer_client.wire import Status as Status


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-execution limits, all enforced from outside the program."""

    timeout_s: float = 10.0
    """Wall-clock limit."""
    memory_mb: int = 1024
    """Memory of the whole process tree (cgroup)."""
    cpu_time_s: float | None = None
    """CPU seconds per process (RLIMIT_CPU); None: derived from the wall-clock limit."""
    max_processes: int = 64
    """Processes and threads of the tree (cgroup pids)."""
    max_output_bytes: int = 65536
    """Cap for stdout and for stderr, each; past it the head and the tail are kept and the
    middle is read and discarded."""
    max_file_size_mb: int = 64
    """Largest single file the program may write (RLIMIT_FSIZE)."""
    max_open_files: int = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""

    def effective_cpu_time_s(self) -> int:
        """CPU budget per process in whole seconds (RLIMIT_CPU granularity)."""
        if self.cpu_time_s is not None:
            return max(1, int(self.cpu_time_s + 0.999))
        return max(1, int(self.timeout_s + 1.999))


@dataclass(frozen=True, slots=True)
class ExecutionSpec:
    """One program to run: code, standard input, input files and limits."""

    code: str
    stdin: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    """Relative path -> content, written into the working directory before the run."""
    fetch_files: tuple[str, ...] = ()
    """Relative paths returned after the run if they exist."""
    limits: Limits = field(default_factory=Limits)
    execution_id: str = ""
    seed: int | None = None
    """Seeds the preloaded random generators at the start (None: fresh entropy)."""
    keep_processes: bool = False
    """Session cell: what it started keeps running after it (a replay never keeps)."""


@dataclass(frozen=True, slots=True)
class RecordedCell:
    """A session cell as kept for replay: its program and its inputs (limits come from the
    cell that triggers the replay)."""

    code: str
    stdin: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    seed: int | None = None
    """The cell's seed, so that a replay draws what the cell drew."""

    @classmethod
    def of(cls, spec: ExecutionSpec) -> RecordedCell:
        """The record of a cell that ran."""
        return cls(code=spec.code, stdin=spec.stdin, files=dict(spec.files), seed=spec.seed)


@dataclass(frozen=True, slots=True)
class ProgramError:
    """The uncaught exception that ended a program or a session cell (Jupyter's `error`)."""

    ename: str
    evalue: str
    traceback: tuple[str, ...] = ()
    """The lines Python printed for it, "Traceback (most recent call last):" first."""


@dataclass(frozen=True, slots=True)
class CompileOutcome:
    """The compile step of a compiled language's program (C++), in the terms of a run."""

    status: Status
    """ok, error (the compiler refused the source), timeout, memory_limit, killed."""
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    """The compiler's messages."""
    wall_time: float = 0.0
    cached: bool = False
    """The binary came from this host's cache: nothing was compiled."""


Display = dict[str, str]
"""One rich output: MIME type -> data (`image/png` base64, `text/plain`)."""


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """What happened to one execution, in the fields of the API's ExecuteResult."""

    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    """Bytes the program wrote to stdout, before any cut (see jail/capture.py)."""
    stderr_bytes: int = 0
    """Bytes the program wrote to stderr, before any cut."""
    wall_time: float = 0.0
    cpu_time: float = 0.0
    peak_memory_mb: float | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    execution_id: str = ""
    """The execution's id (`id` on the wire): also its RQ job id."""
    queue_time: float = 0.0
    """Seconds between admission and the start of the run (set by the worker that ran it)."""
    restored: bool = False
    """A session cell that first rebuilt its session by replaying the earlier cells."""
    ended: bool | None = None
    """Only for the end of a session (DELETE /sessions/{id}): whether the session existed. Not a
    field of the API's ExecuteResult."""
    display: tuple[Display, ...] = ()
    """Rich outputs in the order produced: open figures as image/png, a cell's value."""
    error: ProgramError | None = None
    compile: CompileOutcome | None = None
    """A compiled language's compile step (None for Python)."""

    @classmethod
    def failure(cls, status: Status, message: str, execution_id: str = "") -> ExecutionResult:
        """A result for work that never ran (queue_timeout) or whose infrastructure failed."""
        return cls(status=status, stderr=message, execution_id=execution_id)
