"""The zygote's protocol: the framing, typed messages, their JSON encoding, and bounded,
validated parsing.

The one module of the in-jail package the worker imports (as sandbox_service.jail.inside.protocol);
inside the jail it is a sibling of the zygote's modules. Both sides decode every message through
`from_wire`, which checks its whole shape and raises ProtocolError otherwise: nothing of a message
is used before it was validated.

Frames on the worker's control socket: a 4-byte big-endian length, then a JSON object whose
"op" names the message. Who trusts what: the worker and the zygote trust each other's frames
only after validation; a session's interpreter runs the program, so what it sends (CellDone) is
the program's to forge and carries nothing the kernel can tell instead (see docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import os
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

MAX_FRAME_BYTES = 64 << 20
"""Largest control frame; fetched files are budgeted to fit under it (see FetchBudget)."""
MAX_CELL_FRAME_BYTES = 4096
"""Largest frame a session's interpreter may send: a cell's report is a few dozen bytes."""
MAX_PATH_CHARS = 1024
MAX_FETCH_PATHS = 4096
"""Most paths one request may ask to fetch (the API's bound must not be larger)."""
PATH_ROOTS = ("/home/sandbox", "/tmp", "/mnt")
"""The jail's writable directories an absolute path may name (the first is the working
directory, where relative paths resolve); the peer-compatible routes send such paths."""
MEMBERS_DIR_IN_JAIL = "/opt/rl-sandbox/members"
"""The zygote's own tmpfs (mode 0700), where a session member's scratch mounts are held while
another member runs (inside/scratch.py); the policy mounts it."""
MIN_TIMEOUT_S = 0.001
"""The shortest program limit the jail accepts; the worker raises a shorter one to it."""
MAX_OUTPUTS_BYTES = 8 << 20
"""Largest rich-outputs report (displays and error) a run may leave for the zygote."""
DISPLAY_MIME_TYPES = (
    *("text/plain", "image/png", "text/html", "text/markdown", "application/json"),
    *("text/latex", "image/svg+xml"),
)
HEADER = struct.Struct(">I")
MAX_MEMBER = 1 << 30
"""Largest interpreter number of a session jail (they count up from 0 as forks are made)."""
MAX_SEED = 2**32 - 1
"""Largest seed: numpy's legacy global generator takes 32 bits."""


INTERPRETER_GONE = "the session's interpreter is gone"
"""setup_error of a cell for a forked interpreter that no longer exists (a sibling's cell or
the memory limit ended it): the worker rebuilds that session from its records."""


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol."""


# --- validation helpers -------------------------------------------------------------------------


def _obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: expected an object")
    return value


def _int(obj: dict[str, Any], key: str, low: int, high: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError(f"{key}: expected an integer in [{low}, {high}]")
    return value


def _opt_int(obj: dict[str, Any], key: str, low: int, high: int) -> int | None:
    return None if obj.get(key) is None else _int(obj, key, low, high)


def _float(obj: dict[str, Any], key: str, low: float, high: float) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"{key}: expected a number")
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise ProtocolError(f"{key}: expected a number in [{low}, {high}]")
    return value


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"{key}: expected a boolean")
    return value


def _text(value: object, what: str, max_chars: int) -> str:
    if not isinstance(value, str) or len(value) > max_chars:
        raise ProtocolError(f"{what}: expected a string of at most {max_chars} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"{what}: not encodable as UTF-8") from exc
    return value


def _opt_text(obj: dict[str, Any], key: str, max_chars: int) -> str | None:
    value = obj.get(key)
    return None if value is None else _text(value, key, max_chars)


def root_of(path: str) -> tuple[str, str]:
    """The writable directory a path is under, and the path relative to it."""
    for root in PATH_ROOTS:
        if path.startswith(root + "/"):
            return root, path[len(root) + 1 :]
    return PATH_ROOTS[0], path


def checked_path(value: object) -> str:
    """A path relative to the working directory, or absolute inside one of PATH_ROOTS;
    encodable, without '', '.' or '..' components."""
    path = _text(value, "path", MAX_PATH_CHARS)
    parts = root_of(path)[1].split("/")
    if not path or root_of(path)[1].startswith("/") or "\x00" in path:
        raise ProtocolError("path: expected a non-empty relative path")
    if any(part in ("", ".", "..") for part in parts):
        raise ProtocolError("path: empty, '.' or '..' component")
    return path


def _paths(value: object, key: str, max_items: int) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > max_items:
        raise ProtocolError(f"{key}: expected a list of at most {max_items} paths")
    return tuple(checked_path(p) for p in value)


def _blobs(value: object, key: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for path, b64 in _obj(value, key).items():
        if not isinstance(b64, str):
            raise ProtocolError(f"{key}: expected base64 strings")
        try:
            out[checked_path(path)] = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ProtocolError(f"{key}: invalid base64") from exc
    return out


def _b64(blobs: dict[str, bytes]) -> dict[str, str]:
    return {path: base64.b64encode(data).decode() for path, data in blobs.items()}


def _reasons(value: object, key: str) -> dict[str, str]:
    return {checked_path(p): _text(r, key, 256) for p, r in _obj(value, key).items()}


def _op(obj: dict[str, Any], expected: str) -> None:
    if obj.get("op") != expected:
        raise ProtocolError(f"expected a {expected!r} message, got op {obj.get('op')!r}")


# --- frames -------------------------------------------------------------------------------------


def encode_frame(message: dict[str, Any]) -> bytes:
    """One frame: the length header and the JSON body."""
    # Non-ASCII text as UTF-8 (at most 4 bytes a character), not as \\u escapes (6-12).
    try:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: only escapes can carry it
        body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a frame's body."""
    try:
        return _obj(json.loads(body), "frame")
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc


class FrameBuffer:
    """Frames from bytes that arrive in pieces, at most `max_bytes` each (non-blocking reads)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data = bytearray()

    def feed(self, data: bytes) -> None:
        """Add received bytes; ProtocolError once they cannot be a frame under the bound."""
        self._data += data
        if len(self._data) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._data)
            if length > self.max_bytes:
                raise ProtocolError(f"frame of {length} bytes exceeds {self.max_bytes}")

    def pop(self) -> dict[str, Any] | None:
        """The next whole frame's object, or None while it is incomplete."""
        if len(self._data) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._data)
        end = HEADER.size + length
        if len(self._data) < end:
            return None
        body = bytes(self._data[HEADER.size : end])
        del self._data[:end]
        return decode_body(body)


# --- messages -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """zygote -> worker, once: preloaded and waiting for `serve`."""

    preload_s: float
    immortal_objects: int

    def to_wire(self) -> dict[str, Any]:
        return {"op": "ready", "preload_s": self.preload_s, "immortal": self.immortal_objects}

    @classmethod
    def from_wire(cls, value: object) -> Ready:
        obj = _obj(value, "ready")
        _op(obj, "ready")
        return cls(_float(obj, "preload_s", 0, 1e6), _int(obj, "immortal", 0, 1 << 40))


@dataclass(frozen=True, slots=True)
class Control:
    """worker -> zygote: `serve` (it is in the slot's cgroups now) or `exit`."""

    op: str

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op}

    @classmethod
    def from_wire(cls, value: object) -> Control:
        op = _obj(value, "control").get("op")
        if op not in ("serve", "exit"):
            raise ProtocolError(f"unknown control op {op!r}")
        return cls(op)


@dataclass(frozen=True, slots=True)
class RunLimits:
    """The limits the zygote applies itself (memory, processes and CPU share are cgroups')."""

    timeout_s: float
    cpu_time_s: int
    max_file_size_mb: int
    max_open_files: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "timeout_s": self.timeout_s,
            "cpu_time_s": self.cpu_time_s,
            "max_file_size_mb": self.max_file_size_mb,
            "max_open_files": self.max_open_files,
        }

    @classmethod
    def from_wire(cls, value: object) -> RunLimits:
        obj = _obj(value, "limits")
        return cls(
            timeout_s=_float(obj, "timeout_s", MIN_TIMEOUT_S, 86400),
            cpu_time_s=_int(obj, "cpu_time_s", 1, 86400),
            max_file_size_mb=_int(obj, "max_file_size_mb", 0, 1 << 20),
            max_open_files=_int(obj, "max_open_files", 16, 1 << 20),
        )


@dataclass(frozen=True, slots=True)
class FetchBudget:
    """What one run may return in files, together: a count and a byte total (before base64)."""

    max_files: int = 64
    max_bytes: int = 16 << 20

    def to_wire(self) -> dict[str, Any]:
        return {"max_files": self.max_files, "max_bytes": self.max_bytes}

    @classmethod
    def from_wire(cls, value: object) -> FetchBudget:
        obj = _obj(value, "fetch_budget")
        # 3/4 of a frame: base64 inflates by 4/3, and the reply carries more than files.
        max_bytes = _int(obj, "max_bytes", 0, MAX_FRAME_BYTES * 3 // 4 - (1 << 20))
        return cls(_int(obj, "max_files", 0, 4096), max_bytes)


@dataclass(frozen=True, slots=True)
class RunRequest:
    """worker -> zygote: run one program (or cell). Its code, stdin, stdout and stderr travel as
    four descriptors (SCM_RIGHTS) on the frame's first byte."""

    limits: RunLimits
    files: dict[str, bytes] = field(default_factory=dict)
    fetch: tuple[str, ...] = ()
    fetch_budget: FetchBudget = field(default_factory=FetchBudget)
    seed: int | None = None
    """Seeds the preloaded random generators before the program (None: fresh entropy)."""
    member: int = 0
    """Session mode: which interpreter of the jail runs the cell (0: the session's own; the
    others are its forks, see ForkMembers)."""
    keep_processes: bool = False
    """Session mode: the processes the cell leaves keep running (otherwise killed at its end)."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "op": "run",
            "limits": self.limits.to_wire(),
            "files": _b64(self.files),
            "fetch": list(self.fetch),
            "fetch_budget": self.fetch_budget.to_wire(),
            "seed": self.seed,
            "member": self.member,
            "keep": self.keep_processes,
        }

    @classmethod
    def from_wire(cls, value: object) -> RunRequest:
        obj = _obj(value, "run")
        _op(obj, "run")
        return cls(
            limits=RunLimits.from_wire(obj.get("limits")),
            files=_blobs(obj.get("files", {}), "files"),
            fetch=_paths(obj.get("fetch", []), "fetch", MAX_FETCH_PATHS),
            fetch_budget=FetchBudget.from_wire(obj.get("fetch_budget", {})),
            seed=_opt_int(obj, "seed", 0, MAX_SEED),
            member=_int(obj, "member", 0, MAX_MEMBER) if "member" in obj else 0,
            keep_processes=obj.get("keep") is True,
        )


@dataclass(frozen=True, slots=True)
class ForkMembers:
    """worker -> zygote (session mode): fork interpreter `member` n times; answered Forked."""

    member: int
    n: int

    def to_wire(self) -> dict[str, Any]:
        return {"op": "fork", "member": self.member, "n": self.n}

    @classmethod
    def from_wire(cls, value: object) -> ForkMembers:
        obj = _obj(value, "fork")
        _op(obj, "fork")
        return cls(_int(obj, "member", 0, MAX_MEMBER), _int(obj, "n", 1, 4096))


@dataclass(frozen=True, slots=True)
class Forked:
    """zygote -> worker: the new interpreters' member numbers, or why there are none."""

    members: tuple[int, ...]
    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"op": "forked", "members": list(self.members), "error": self.error}

    @classmethod
    def from_wire(cls, value: object) -> Forked:
        obj = _obj(value, "forked")
        _op(obj, "forked")
        members = obj.get("members")
        if not isinstance(members, list) or len(members) > 4096:
            raise ProtocolError("members: expected a list")
        keys = tuple(_int({"m": m}, "m", 1, MAX_MEMBER) for m in members)
        return cls(keys, _opt_text(obj, "error", 4096))


@dataclass(frozen=True, slots=True)
class Fetched:
    """The files fetched after a run, and why the others are not there."""

    files: dict[str, bytes] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)
    """Path -> why it was not returned (a symlink, not a regular file, over the budget)."""

    @property
    def over_budget(self) -> tuple[str, ...]:
        """The paths left out because the run's fetch budget was spent."""
        return tuple(p for p, why in self.errors.items() if why.startswith(OVER_BUDGET))

    def to_wire(self) -> dict[str, Any]:
        return {"files": _b64(self.files), "missing": list(self.missing), "errors": self.errors}

    @classmethod
    def from_wire(cls, value: object) -> Fetched:
        obj = _obj(value, "fetched")
        return cls(
            files=_blobs(obj.get("files", {}), "files"),
            missing=_paths(obj.get("missing", []), "missing", MAX_FETCH_PATHS),
            errors=_reasons(obj.get("errors", {}), "errors"),
        )


OVER_BUDGET = "over the fetch budget"


@dataclass(frozen=True, slots=True)
class Outputs:
    """A run's rich outputs: displays (mime -> data) in order, and the uncaught exception
    ({ename, evalue, traceback: [lines]}). Written by the program's own process after it ran,
    so the program's to forge: parsed under MAX_OUTPUTS_BYTES and validated item by item; what
    is not valid (a mime type not offered, an image/png that is not strict base64 of a PNG, a
    malformed error) is dropped, and `dropped` says what and why (appended to stderr)."""

    display: tuple[dict[str, str], ...] = ()
    error: dict[str, Any] | None = None
    dropped: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"display": list(self.display), "error": self.error, "dropped": list(self.dropped)}

    @classmethod
    def from_wire(cls, value: object) -> Outputs:
        obj = _obj(value, "outputs")
        items = obj.get("display", [])
        dropped: list[str] = []
        if not isinstance(items, list):
            items, dropped = [], ["display: not a list"]
        if len(items) > MAX_DISPLAY_ITEMS:
            dropped.append(
                f"display: {len(items) - MAX_DISPLAY_ITEMS} items over {MAX_DISPLAY_ITEMS}"
            )
            items = items[:MAX_DISPLAY_ITEMS]
        display = []
        for index, item in enumerate(items):
            bundle, why = _display_bundle(item)
            if why is not None:
                dropped.append(f"display[{index}]: {why}")
            if bundle:
                display.append(bundle)
        error = obj.get("error")
        if error is not None:
            try:
                error = _error_of(error)
            except ProtocolError as exc:
                error, dropped = None, [*dropped, f"error: {exc}"]
        old = obj.get("dropped", [])
        if isinstance(old, list):
            dropped = [_text(note, "dropped", 512) for note in old[:MAX_DROPPED_NOTES]] + dropped
        return cls(tuple(display), error, tuple(dropped[:MAX_DROPPED_NOTES]))


MAX_DISPLAY_ITEMS = 1024
MAX_DROPPED_NOTES = 16
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_problem(value: object) -> str | None:
    """Why `value` is not an image/png display value (strict base64 of a PNG), or None."""
    if not isinstance(value, str):
        return "image/png is not a string"
    if len(value) > MAX_OUTPUTS_BYTES:
        return f"image/png over {MAX_OUTPUTS_BYTES} characters"
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return "image/png is not strict base64"
    if not data.startswith(PNG_SIGNATURE):
        return "image/png does not hold a PNG (no PNG signature)"
    return None


def _display_bundle(item: object) -> tuple[dict[str, str], str | None]:
    """The valid part of one display item, and why the rest was dropped (None: nothing was)."""
    if not isinstance(item, dict) or not item:
        return {}, "not a non-empty object"
    bundle: dict[str, str] = {}
    problems: list[str] = []
    for mime, value in item.items():
        if mime not in DISPLAY_MIME_TYPES:
            problems.append(
                f"mime type {str(mime)[:64]!r} not one of {', '.join(DISPLAY_MIME_TYPES)}"
            )
            continue
        problem = png_problem(value) if mime == "image/png" else None
        if problem is None:
            try:
                bundle[mime] = _text(value, mime, MAX_OUTPUTS_BYTES)
            except ProtocolError as exc:
                problem = str(exc)
        if problem is not None:
            problems.append(problem)
    return bundle, "; ".join(problems) or None


def _error_of(value: object) -> dict[str, Any]:
    error = _obj(value, "error")
    lines = error.get("traceback")
    if not isinstance(lines, list) or len(lines) > 4096:
        raise ProtocolError("error.traceback: expected a list of lines")
    return {
        "ename": _text(error.get("ename"), "ename", 4096),
        "evalue": _text(error.get("evalue"), "evalue", MAX_OUTPUTS_BYTES),
        "traceback": [_text(line, "traceback", MAX_OUTPUTS_BYTES) for line in lines],
    }


@dataclass(frozen=True, slots=True)
class RunReply:
    """zygote -> worker: how one run ended. Exit status, signal and CPU time come from the
    kernel (wait status and rusage of the program's process, or its CPU clock in a session),
    never from anything the program wrote."""

    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    fetched: Fetched = field(default_factory=Fetched)
    warmed: bool = False
    """The program ran in a standby that had done the idle-time warm-up."""
    cpu_limit_reached: bool = False
    """The program's process had used its CPU-time limit when it ended (the kernel's count),
    so that a SIGXCPU it got was the limit's and not one it sent itself."""
    session_alive: bool = False
    """Session mode: the interpreter survived this cell and keeps its state."""
    setup_error: str | None = None
    """The run could not be set up (the program did not run): a sandbox_error."""
    program_error: str | None = None
    """The program broke the session's protocol (the interpreter was discarded): an error."""
    outputs: Outputs = field(default_factory=Outputs)
    """The run's rich outputs (see Outputs): the program's own, like its stdout."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "op": "reply",
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "wall_time_s": self.wall_time_s,
            "cpu_time_s": self.cpu_time_s,
            "fetched": self.fetched.to_wire(),
            "warmed": self.warmed,
            "cpu_limit_reached": self.cpu_limit_reached,
            "session_alive": self.session_alive,
            "setup_error": self.setup_error,
            "program_error": self.program_error,
            "outputs": self.outputs.to_wire(),
        }

    @classmethod
    def from_wire(cls, value: object) -> RunReply:
        obj = _obj(value, "reply")
        _op(obj, "reply")
        return cls(
            exit_code=_opt_int(obj, "exit_code", 0, 255),
            signal=_opt_int(obj, "signal", 1, 64),
            timed_out=_bool(obj, "timed_out"),
            wall_time_s=_float(obj, "wall_time_s", 0, 1e6),
            cpu_time_s=_float(obj, "cpu_time_s", 0, 1e6),
            fetched=Fetched.from_wire(obj.get("fetched", {})),
            warmed=_bool(obj, "warmed"),
            cpu_limit_reached=_bool(obj, "cpu_limit_reached"),
            session_alive=_bool(obj, "session_alive"),
            setup_error=_opt_text(obj, "setup_error", 4096),
            program_error=_opt_text(obj, "program_error", 4096),
            outputs=Outputs.from_wire(obj.get("outputs", {})),
        )


@dataclass(frozen=True, slots=True)
class CellDone:
    """session interpreter -> zygote: the cell ended with this status. Written by the process
    that ran the cell, so the program can forge it: it carries only what the program decides
    anyway (its status), parsed under MAX_CELL_FRAME_BYTES and the cell's deadline."""

    exit_code: int

    def to_wire(self) -> dict[str, Any]:
        return {"op": "done", "exit_code": self.exit_code}

    @classmethod
    def from_wire(cls, value: object) -> CellDone:
        obj = _obj(value, "done")
        _op(obj, "done")
        return cls(_int(obj, "exit_code", 0, 255))


def reply_frame(reply: RunReply) -> tuple[RunReply, bytes]:
    """The frame of `reply`, and the reply it carries: what does not fit under MAX_FRAME_BYTES
    is left out, and said in `outputs.dropped` (appended to stderr). In this order: the rich
    outputs, then the fetched files' contents, then the fetch report itself. A reply always
    fits: a run's answer never ends the jail, whatever the program wrote or the request asked."""
    try:
        return reply, encode_frame(reply.to_wire())
    except ProtocolError:
        pass
    note = f"the run's answer did not fit the jail's {MAX_FRAME_BYTES}-byte control frame"
    outputs, fetched = reply.outputs, reply.fetched
    steps = [
        (
            Outputs(error=outputs.error, dropped=(*outputs.dropped, f"display: {note}")),
            fetched,
        ),
        (
            Outputs(dropped=(*outputs.dropped, f"display and error: {note}")),
            Fetched(missing=fetched.missing, errors={**fetched.errors, **_left_out(fetched, note)}),
        ),
        (Outputs(dropped=(*outputs.dropped, f"display, error and fetch_files: {note}")), Fetched()),
    ]
    for outputs, fetched in steps:
        smaller = dataclasses.replace(reply, outputs=outputs, fetched=fetched)
        try:
            return smaller, encode_frame(smaller.to_wire())
        except ProtocolError:
            continue
    raise AssertionError("a reply without outputs and files always fits")  # pragma: no cover


def _left_out(fetched: Fetched, note: str) -> dict[str, str]:
    return {path: f"{OVER_BUDGET} ({note})"[:256] for path in fetched.files}


# --- framing -----------------------------------------------------------------------------


ABORT = "abort"
"""The op of the frame the worker writes during a run to abort it (its client went away). One
that arrives after the run's answer (the two crossed) is read and ignored."""


def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one length-prefixed JSON message, with file descriptors on its first byte."""
    data = encode_frame(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_frame(
    sock: socket.socket, max_fds: int = 0, max_bytes: int = MAX_FRAME_BYTES
) -> tuple[dict[str, Any], list[int]]:
    """Receive one message and the descriptors sent with it; EOFError when the peer is gone,
    ProtocolError for a frame over `max_bytes` or not a JSON object."""
    fds: list[int] = []
    header = HEADER
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, header.size, max_fds)
    else:
        head = sock.recv(header.size)
    if not head:
        raise EOFError("control socket closed")
    try:
        head += _recv_exact(sock, header.size - len(head))
        (length,) = header.unpack(head)
        if length > max_bytes:
            raise ProtocolError(f"frame of {length} bytes exceeds {max_bytes}")
        return decode_body(_recv_exact(sock, length)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("control socket closed mid-frame")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
