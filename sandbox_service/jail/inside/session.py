"""A session jail's loop: cells sent to the running member's interpreter, supervised like a run,
forks and switches between members.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import socket
import time
from typing import Any

from . import protocol
from .family import MAX_MEMBERS, _drain, _Family, _Member
from .files import _fetch_files, _write_files
from .member import FORK, session_interpreter
from .outputs import take_outputs
from .process import (
    _MAX_SETUP_ERROR_CHARS,
    _as_program,
    _cpu_of_process,
    _kill_all_but,
    _kill_everyone_else,
    _reap_all,
    cpu_limit_reached,
)
from .protocol import ABORT, recv_frame, send_frame
from .serve import _consume_abort


def _start_interpreter(sock: socket.socket) -> _Member:
    channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        sock.close()
        channel.close()
        session_interpreter(theirs)
    theirs.close()
    return _Member(pid, os.pidfd_open(pid), channel)


def _serve_fork(sock: socket.socket, family: _Family, message: dict[str, Any]) -> None:
    """Answer a fork request: the new members' keys, or why there are none."""
    try:
        request = protocol.ForkMembers.from_wire(message)
        if request.member not in family.members or family.members[request.member].dead():
            raise RuntimeError(protocol.INTERPRETER_GONE)
        if len(family.members) + request.n > MAX_MEMBERS:
            raise RuntimeError(f"more than {MAX_MEMBERS} interpreters in one jail")
        reply = protocol.Forked(members=tuple(family.fork(request.member, request.n)))
    except (protocol.ProtocolError, RuntimeError, OSError) as exc:
        reply = protocol.Forked(members=(), error=str(exc))
    send_frame(sock, reply.to_wire())


def serve_session(sock: socket.socket) -> None:
    """Run cells in persistent interpreters until told to exit, or until a cell kills the last.

    Notebook semantics: an interpreter (its namespace, its threads) lives from cell to cell;
    processes a cell started are killed when the cell ends. A cell that times out, whose
    interpreter dies, or that breaks the channel's protocol ends its interpreter (and the jail
    with the last one) after its answer: the worker then rebuilds that session elsewhere by
    replaying its recorded cells. Forks (`fork` requests) add interpreters: see _Family.
    """
    family = _Family(_start_interpreter(sock))
    while True:
        try:
            message, fds = recv_frame(sock, max_fds=4)
        except EOFError:
            break
        op = message.get("op")
        if op in ("exit", ABORT, FORK, "drop"):
            for fd in fds:
                os.close(fd)
            if op == "exit":
                break
            if op == FORK:
                _serve_fork(sock, family, message)
            elif op == "drop":
                key = message.get("member")
                if isinstance(key, int) and key in family.members and len(family.members) > 1:
                    family.drop(key)
            continue  # an abort crossed the end of its cell on the wire: that cell is answered
        try:
            request = protocol.RunRequest.from_wire(message)
            if len(fds) != 4:
                raise protocol.ProtocolError(f"{len(fds)} descriptors, expected 4")
        except protocol.ProtocolError as exc:
            for fd in fds:
                os.close(fd)
            why = f"malformed request: {exc}"[:_MAX_SETUP_ERROR_CHARS]
            send_frame(sock, protocol.RunReply(setup_error=why).to_wire())
            continue
        family.end_dumpable()
        member = family.members.get(request.member)
        if member is None or member.dead():
            for fd in fds:
                os.close(fd)
            family.drop(request.member)
            gone = protocol.RunReply(setup_error=protocol.INTERPRETER_GONE)
            send_frame(sock, gone.to_wire())
            if not family.members:
                break
            continue
        try:
            family.switch_to(request.member)
        except (OSError, RuntimeError, ValueError) as exc:
            # Its files could not be put back, or processes outlived SIGKILL: this member's
            # session (all of them, for the latter) is rebuilt from its records.
            for fd in fds:
                os.close(fd)
            family.drop(request.member)
            send_frame(sock, protocol.RunReply(setup_error=protocol.INTERPRETER_GONE).to_wire())
            if isinstance(exc, RuntimeError) or not family.members:
                break
            continue
        failure = _as_program(_write_files, request.files) if request.files else None
        if failure is not None:
            for fd in fds:
                os.close(fd)
            reply = protocol.RunReply(
                setup_error=f"could not write input files: {failure}"[:_MAX_SETUP_ERROR_CHARS],
                session_alive=True,
            )
            send_frame(sock, reply.to_wire())
            continue
        pid, channel = member.pid, member.channel
        _drain(channel)
        started = time.monotonic()
        cpu_before = _cpu_of_process(pid)
        cell = {
            "op": "cell",
            "limits": request.limits.to_wire(),
            "seed": request.seed,
            "moved": member.moved,
        }
        member.moved = False
        send_frame(channel, cell, fds)
        for fd in fds:
            os.close(fd)
        reply = _supervise_cell(
            pid, member.pidfd, channel, sock, started + request.limits.timeout_s, cpu_before
        )
        # The interpreter's soft limit is its CPU so far (rounded up) plus the cell's budget.
        reached = cpu_limit_reached(reply.cpu_time_s, request.limits.cpu_time_s)
        reply = dataclasses.replace(reply, cpu_limit_reached=reached)
        if reply.session_alive:
            try:
                # E2B's sandboxes keep what a cell started (a lone interpreter: the switch
                # between forks kills every other process anyway); dead orphans are reaped.
                kept = request.keep_processes and len(family.members) == 1
                extra = _reap_all(block=False) if kept else _kill_all_but(*family.pids())
                reply = dataclasses.replace(reply, cpu_time_s=reply.cpu_time_s + extra)
            except RuntimeError:
                reply = dataclasses.replace(reply, session_alive=False)
        ending = not reply.session_alive and len(family.members) == 1
        if not reply.session_alive and not ending:
            family.drop(request.member)  # the others are stopped: what runs is this member's
            try:
                reply = dataclasses.replace(
                    reply, cpu_time_s=reply.cpu_time_s + _kill_all_but(*family.pids())
                )
            except RuntimeError:
                ending = True
        if ending:
            cpu = reply.cpu_time_s + _kill_everyone_else()
            reply = dataclasses.replace(reply, cpu_time_s=cpu)
        reply = dataclasses.replace(
            reply,
            wall_time_s=time.monotonic() - started,
            fetched=_fetch_files(request.fetch, request.fetch_budget),
            outputs=take_outputs(),
        )
        sock.sendall(protocol.reply_frame(reply)[1])
        if ending:
            return
    _kill_everyone_else()


def _supervise_cell(
    pid: int,
    pidfd: int,
    channel: socket.socket,
    sock: socket.socket,
    deadline: float,
    cpu_before: float,
) -> protocol.RunReply:
    """Wait for the cell's report, the interpreter's death, the deadline or an abort.

    The report is read without blocking, bounded and validated (the cell can write anything
    to the channel, or half a frame and stop): only a whole, valid CellDone ends the cell
    normally; anything else ends the session with a clear error.
    """
    frames = protocol.FrameBuffer(protocol.MAX_CELL_FRAME_BYTES)
    watched = [channel.fileno(), pidfd, sock.fileno()]
    while True:
        remaining = deadline - time.monotonic()
        ready = select.select(watched, [], [], remaining)[0] if remaining > 0 else []
        if channel.fileno() in ready:
            try:
                data = channel.recv(1 << 12, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                watched.remove(channel.fileno())  # the interpreter is going: its pidfd tells how
                continue
            try:
                frames.feed(data)
                message = frames.pop()
                done = None if message is None else protocol.CellDone.from_wire(message)
            except protocol.ProtocolError as exc:
                return _end_interpreter(pid, cpu_before, f"the cell broke its channel: {exc}")
            if done is None:
                continue
            cpu = max(_cpu_of_process(pid) - cpu_before, 0.0)
            return protocol.RunReply(exit_code=done.exit_code, cpu_time_s=cpu, session_alive=True)
        if pidfd in ready:
            _, status, usage = os.wait4(pid, 0)
            cpu = max(usage.ru_utime + usage.ru_stime - cpu_before, 0.0)
            if os.WIFSIGNALED(status):
                return protocol.RunReply(signal=os.WTERMSIG(status), cpu_time_s=cpu)
            return protocol.RunReply(exit_code=os.WEXITSTATUS(status), cpu_time_s=cpu)
        # Out of time, or the worker wrote during a cell (an abort, or it went away).
        if sock.fileno() in ready:
            _consume_abort(sock)
        cpu = max(_cpu_of_process(pid) - cpu_before, 0.0)
        return protocol.RunReply(signal=signal.SIGKILL, timed_out=True, cpu_time_s=cpu)


def _end_interpreter(pid: int, cpu_before: float, why: str) -> protocol.RunReply:
    cpu = max(_cpu_of_process(pid) - cpu_before, 0.0)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return protocol.RunReply(exit_code=1, cpu_time_s=cpu, program_error=why)
