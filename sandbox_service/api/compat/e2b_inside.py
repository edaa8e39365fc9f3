"""What an E2B sandbox's envd calls run inside the sandbox's own session interpreter.

Never imported by the service: e2b_envd.op_cell sends this file's source in a cell of the
sandbox's session, which makes it a module of the interpreter once (named after its hash) and
calls its `run` with the call and the cell's namespace, so the call runs in the sandbox's jail,
as the program's uid, under its limits, and never touches the user's variables (but to switch
contexts). The answer is one
line on stdout that starts with MARK; the sandbox's own code could forge it, so the API
validates what it reads (e2b_envd.parse_answer). Commands are processes the interpreter starts
and keeps in its state module (the cells of an E2B sandbox keep the processes they leave), their
output in files that `poll` reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
import types
from datetime import UTC, datetime
from typing import Any

MARK = "\x1erlsb-e2b:"
MAX_ENTRIES = 10000
"""Entries one ListDir answers at most (the cell's stdout is capped)."""
CONTEXT_KEYS = ("__name__", "__builtins__")
"""What a fresh context's namespace holds, as a fresh `__main__`."""
STATE = "_rlsb_e2b"
"""The module that keeps the contexts' namespaces and the commands from cell to cell."""

ARGS: dict[str, Any] = {}
"""The call being answered."""
NS: dict[str, Any] = {}
"""The namespace of the cell that runs the call: the session's (the current context's)."""


def _answer(value: dict[str, Any], stream: Any = None) -> None:
    out = stream or sys.stdout
    out.write(MARK + json.dumps(value) + "\n")
    out.flush()


def _entry(path: str) -> dict[str, Any]:
    """envd's EntryInfo of `path` (lstat: a link is described as its target, flagged)."""
    import grp
    import pwd

    info = os.lstat(path)
    is_link = stat.S_ISLNK(info.st_mode)
    target = None
    if is_link:
        target = os.readlink(path)
        with contextlib.suppress(OSError):
            info = os.stat(path)
    kind = "FILE_TYPE_DIRECTORY" if stat.S_ISDIR(info.st_mode) else "FILE_TYPE_FILE"
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    modified = datetime.fromtimestamp(info.st_mtime, UTC).isoformat().replace("+00:00", "Z")
    entry: dict[str, Any] = {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "type": kind,
        "path": path,
        "size": str(info.st_size),
        "mode": stat.S_IMODE(info.st_mode) | (0o20000000000 if kind.endswith("DIRECTORY") else 0),
        "permissions": stat.filemode(info.st_mode),
        "owner": owner,
        "group": group,
        "modifiedTime": modified,
        "isSymlink": is_link,
    }
    if target is not None:
        entry["symlinkTarget"] = target
    return entry


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _os_error(exc: OSError, path: str) -> dict[str, Any]:
    import errno

    codes = {
        errno.ENOENT: "not_found",
        errno.EEXIST: "already_exists",
        errno.EACCES: "permission_denied",
        errno.EPERM: "permission_denied",
        errno.EROFS: "permission_denied",
        errno.ENOTDIR: "invalid_argument",
        errno.EISDIR: "invalid_argument",
        errno.ENOTEMPTY: "failed_precondition",
        errno.ENOSPC: "resource_exhausted",
        errno.ENAMETOOLONG: "invalid_argument",
        errno.ELOOP: "invalid_argument",
        errno.EINVAL: "invalid_argument",
        errno.EXDEV: "invalid_argument",
        errno.EBUSY: "failed_precondition",
    }
    reason = exc.strerror or str(exc)
    return _error(codes.get(exc.errno or 0, "internal"), f"{path}: {reason}")


def list_dir(path: str, depth: int) -> dict[str, Any]:
    if not os.path.isdir(path):
        if os.path.lexists(path):
            return _error("invalid_argument", f"path is not a directory: {path}")
        return _error("not_found", f"directory not found: {path}")
    entries: list[dict[str, Any]] = []
    level = [path]
    for _ in range(max(depth, 1)):
        below: list[str] = []
        for directory in level:
            try:
                names = sorted(os.listdir(directory))
            except OSError as exc:
                return _os_error(exc, directory)
            for name in names:
                full = os.path.join(directory, name)
                try:
                    entries.append(_entry(full))
                except OSError:
                    continue
                if len(entries) >= MAX_ENTRIES:
                    return {"entries": entries}
                if os.path.isdir(full) and not os.path.islink(full):
                    below.append(full)
        level = below
    return {"entries": entries}


def stat_path(path: str) -> dict[str, Any]:
    try:
        return {"entry": _entry(path)}
    except OSError as exc:
        return _os_error(exc, path)


def make_dir(path: str) -> dict[str, Any]:
    if os.path.lexists(path):
        return _error("already_exists", f"directory already exists: {path}")
    try:
        os.makedirs(path)
        return {"entry": _entry(path)}
    except OSError as exc:
        return _os_error(exc, path)


def remove(path: str) -> dict[str, Any]:
    import shutil

    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError as exc:
        return _os_error(exc, path)
    return {}


def move(source: str, destination: str) -> dict[str, Any]:
    try:
        parent = os.path.dirname(destination)
        if parent:
            os.makedirs(parent, exist_ok=True)
        os.rename(source, destination)
        return {"entry": _entry(destination)}
    except OSError as exc:
        return _os_error(exc, source)


def switch_context(target: str, reset: bool, drop: bool) -> dict[str, Any]:
    """Make `target` the namespace the session's cells run in (`reset`: forget `target`'s
    variables instead; `drop`: and the default context's is current again). Each context's
    namespace is kept aside while another's runs."""
    state = _state()
    spaces: dict[str, dict[str, Any]] = state.__dict__["spaces"]
    current: str = state.__dict__["current"]
    fresh = {key: NS[key] for key in CONTEXT_KEYS if key in NS}
    if reset:
        spaces.pop(target, {})
        if target == current:
            NS.clear()
            NS.update(spaces.pop("default", {}) or fresh if drop else fresh)
            if drop:
                state.__dict__["current"] = "default"
        return {}
    if target != current:
        spaces[current] = dict(NS)
        NS.clear()
        NS.update(spaces.pop(target, {}) or fresh)
        state.__dict__["current"] = target
    return {}


COMMANDS_DIR = "/tmp/.rlsb-e2b"
"""Where commands' output files and stdin pipes live (the jail's /tmp: charged to the sandbox)."""


def _state() -> types.ModuleType:
    """The interpreter's E2B state, kept from cell to cell in a module of its own."""
    state = sys.modules.get(STATE)
    if state is None:
        state = sys.modules[STATE] = types.ModuleType(STATE)
        state.__dict__.update(spaces={}, current="default", commands={}, spawned=0)
    return state


def spawn(args: dict[str, Any]) -> dict[str, Any]:
    """Start a command in the sandbox: bash in a session of its own, its output into files,
    its stdin a pipe kept here (or empty); then the first poll of it."""
    state = _state()
    os.makedirs(COMMANDS_DIR, mode=0o700, exist_ok=True)
    state.__dict__["spawned"] += 1
    base = f"{COMMANDS_DIR}/{state.__dict__['spawned']}"
    env = {**os.environ, "HOME": "/home/user"}  # E2B's home: the link to the working directory
    if args.get("cwd"):
        env["PWD"] = args["cwd"]  # bash's `pwd` then names /home/user, not the link's target
    env.update(args.get("envs") or {})
    stdin_write: int | None = None
    stdin: Any = subprocess.DEVNULL
    if args.get("stdin"):
        os.mkfifo(base + ".in", 0o600)
        stdin = os.open(base + ".in", os.O_RDONLY | os.O_NONBLOCK)
        stdin_write = os.open(base + ".in", os.O_WRONLY | os.O_NONBLOCK)
        os.set_blocking(stdin, True)
    try:
        with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
            process = subprocess.Popen(
                ["/bin/bash", "-l", "-c", args["cmd"]],
                cwd=args.get("cwd") or None,
                env=env,
                stdin=stdin,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
    except OSError as exc:
        if stdin_write is not None:
            os.close(stdin_write)
        return _os_error(exc, str(args.get("cwd") or args["cmd"]))
    finally:
        if isinstance(stdin, int) and stdin != subprocess.DEVNULL:
            os.close(stdin)
    state.__dict__["commands"][process.pid] = {
        "process": process,
        "base": base,
        "stdin": stdin_write,
        "info": args.get("info") or {},
    }
    return poll(process.pid, 0, 0, float(args.get("wait") or 0), int(args["max_bytes"]))


def _read(path: str, at: int, most: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(at)
            return f.read(most)
    except OSError:
        return b""


def poll(pid: int, out_at: int, err_at: int, wait_s: float, most: int) -> dict[str, Any]:
    """A command's output since the offsets given (-1: from its end now, for `connect`) and its
    exit code once it ended; waits up to `wait_s` for it to end or print."""
    import base64

    command = _state().__dict__["commands"].get(pid)
    if command is None:
        return _error("not_found", f"process with pid {pid} not found")
    process, base = command["process"], command["base"]
    if out_at < 0 or err_at < 0:
        out_at, err_at = _size(base + ".out"), _size(base + ".err")
    deadline = time.monotonic() + wait_s
    while process.poll() is None and time.monotonic() < deadline:
        if _size(base + ".out") > out_at or _size(base + ".err") > err_at:
            time.sleep(0.05)  # let a burst of output come in one answer
            break
        time.sleep(0.02)
    code = process.poll()
    out = _read(base + ".out", out_at, most)
    err = _read(base + ".err", err_at, most)
    out_at, err_at = out_at + len(out), err_at + len(err)
    more = _size(base + ".out") > out_at or _size(base + ".err") > err_at
    answer: dict[str, Any] = {
        "pid": pid,
        "out": base64.b64encode(out).decode(),
        "err": base64.b64encode(err).decode(),
        "outAt": out_at,
        "errAt": err_at,
        "more": more,
        "exitCode": code,
    }
    if code is not None and not more:
        _forget(pid)
    return answer


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _forget(pid: int) -> None:
    command = _state().__dict__["commands"].pop(pid, None)
    if command is None:
        return
    if command["stdin"] is not None:
        with contextlib.suppress(OSError):
            os.close(command["stdin"])
    for suffix in (".out", ".err", ".in"):
        with contextlib.suppress(OSError):
            os.unlink(command["base"] + suffix)


def list_commands() -> dict[str, Any]:
    commands = _state().__dict__["commands"]
    running = [
        {**command["info"], "pid": pid}
        for pid, command in commands.items()
        if command["process"].poll() is None
    ]
    return {"processes": running}


def send_signal(pid: int, number: int) -> dict[str, Any]:
    command = _state().__dict__["commands"].get(pid)
    if command is None or command["process"].poll() is not None:
        return _error("not_found", f"process with pid {pid} not found")
    with contextlib.suppress(OSError):
        os.killpg(pid, number)
    return {}


def send_stdin(pid: int, data: str | None) -> dict[str, Any]:
    """Write to a command's stdin (`data`: base64), or close it (`data` None)."""
    import base64

    command = _state().__dict__["commands"].get(pid)
    if command is None or command["process"].poll() is not None:
        return _error("not_found", f"process with pid {pid} not found")
    if command["stdin"] is None:
        return _error("failed_precondition", "the command was started without stdin=True")
    if data is None:
        os.close(command["stdin"])
        command["stdin"] = None
        return {}
    payload = base64.b64decode(data)
    try:
        written = os.write(command["stdin"], payload)
    except BlockingIOError:
        written = 0
    except OSError as exc:
        return _os_error(exc, "stdin")
    if written < len(payload):
        return _error("resource_exhausted", "the command's stdin is full (it reads no more)")
    return {}


def main() -> None:
    op = ARGS.get("op")
    if op == "spawn":
        answer = spawn(ARGS)
    elif op == "poll":
        most = int(ARGS["max_bytes"])
        answer = poll(ARGS["pid"], ARGS["outAt"], ARGS["errAt"], float(ARGS["wait"]), most)
    elif op == "processes":
        answer = list_commands()
    elif op == "signal":
        answer = send_signal(int(ARGS["pid"]), int(ARGS["signal"]))
    elif op == "stdin":
        answer = send_stdin(int(ARGS["pid"]), ARGS.get("data"))
    elif op == "list":
        answer = list_dir(ARGS["path"], int(ARGS.get("depth") or 1))
    elif op == "stat":
        answer = stat_path(ARGS["path"])
    elif op == "mkdir":
        answer = make_dir(ARGS["path"])
    elif op == "remove":
        answer = remove(ARGS["path"])
    elif op == "move":
        answer = move(ARGS["source"], ARGS["destination"])
    elif op == "context":
        answer = switch_context(ARGS["context"], bool(ARGS.get("reset")), bool(ARGS.get("drop")))
    else:
        answer = _error("unimplemented", f"unknown op {op!r}")
    _answer(answer)


def run(args: str, namespace: dict[str, Any]) -> None:
    """Answer one call (`args`: its JSON) from a cell whose namespace is `namespace`."""
    global ARGS, NS
    ARGS, NS = json.loads(args), namespace
    try:
        main()
    finally:
        ARGS, NS = {}, {}
