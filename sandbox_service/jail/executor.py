"""The jailed executor of one worker slot, in warm (zygote) or cold (nsjail per run) mode.

Both modes run the same zygote program under the same policy and cgroups; warm keeps one
preloaded zygote and forks from it, cold starts a bare one for every execution. So both give
the same results and differ only in start-up cost.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Status
from sandbox_service.jail import cgroups as cg
from sandbox_service.jail import zygote as zygote_module
from sandbox_service.jail.outcome import RawOutcome, classify
from sandbox_service.jail.policy import JailLayout
from sandbox_service.jail.zygote_jail import JailFailure, ZygoteJail, ZygoteReply
from sandbox_service.settings import ExecutorMode, Settings

log = logging.getLogger(__name__)

STDERR_TAIL_CHARS = 2000


def runtime_dirs(python: str) -> tuple[str, ...]:
    """Directories the jailed interpreter needs: its prefix and its base installation."""
    if python == sys.executable:
        prefixes = {os.path.abspath(sys.prefix), os.path.realpath(sys.base_prefix)}
    else:
        # A foreign interpreter: its installation is two levels above bin/python.
        prefixes = {
            os.path.dirname(os.path.dirname(os.path.abspath(python))),
            os.path.dirname(os.path.dirname(os.path.realpath(python))),
        }
    return tuple(sorted(p for p in prefixes if not p.startswith("/usr")))


def make_layout(settings: Settings, slot: int, mode: ExecutorMode) -> JailLayout:
    """The jail layout of one slot."""
    python = settings.jail_python or sys.executable
    return JailLayout(
        python=python,
        runtime_dirs=runtime_dirs(python),
        zygote_source=os.path.abspath(zygote_module.__file__),
        outside_uid=settings.sandbox_uid_base + slot,
        control_fd=-1,
        workdir_size_mb=settings.workdir_size_mb,
        tmp_size_mb=settings.tmp_size_mb,
        max_file_size_mb=settings.max_file_size_mb,
        max_open_files=settings.max_open_files,
        preload=mode == "warm",
        once=mode == "cold",
        time_limit_s=0 if mode == "warm" else int(settings.max_timeout) + 30,
    )


def to_result(spec: ExecutionSpec, reply: ZygoteReply) -> ExecutionResult:
    """Combine the zygote's report with the captured output into an ExecutionResult."""
    stderr = reply.stderr.text()
    if reply.setup_error:
        return ExecutionResult(
            status=Status.ERROR,
            stderr=reply.setup_error,
            execution_id=spec.execution_id,
        )
    raw = RawOutcome(
        exit_code=reply.exit_code,
        signal=reply.signal,
        timed_out=reply.timed_out,
        oom_killed=reply.usage.oom_killed,
        stderr_tail=stderr[-STDERR_TAIL_CHARS:],
    )
    return ExecutionResult(
        status=classify(raw),
        exit_code=reply.exit_code,
        signal=reply.signal,
        stdout=reply.stdout.text(),
        stderr=stderr,
        stdout_truncated=reply.stdout.truncated,
        stderr_truncated=reply.stderr.truncated,
        wall_time=round(reply.wall_time, 6),
        cpu_time=round(reply.cpu_time, 6),
        peak_memory_mb=reply.usage.peak_memory_mb,
        files=reply.files,
        execution_id=spec.execution_id,
    )


class JailExecutor:
    """One executor slot: a cgroup pair and a zygote jail (kept warm, or one per run)."""

    def __init__(self, settings: Settings, slot: int, mode: ExecutorMode | None = None) -> None:
        self.mode: ExecutorMode = mode or settings.executor_mode
        self._settings = settings
        self._layout = make_layout(settings, slot, self.mode)
        cg.remove_stale(settings.cgroup_parent)
        self._cgroups = cg.SlotCgroups(settings.cgroup_parent, f"slot{slot}-{os.getpid()}")
        self._cgroups.create()
        self._log_path = Path(tempfile.gettempdir()) / f"rl-sandbox-jail-{os.getpid()}-{slot}.log"
        self._jail: ZygoteJail | None = None
        if self.mode == "warm":
            self._jail = self._start_jail()

    def _start_jail(self) -> ZygoteJail:
        jail = ZygoteJail(self._layout, self._cgroups, self._log_path)
        started = time.monotonic()
        jail.start()
        log.info(
            "jail started",
            extra={"mode": self.mode, "seconds": round(time.monotonic() - started, 3)},
        )
        return jail

    def run(self, spec: ExecutionSpec) -> ExecutionResult:
        """Run one execution; a jail failure is a sandbox_error result and a fresh jail."""
        try:
            if self._jail is None or not self._jail.alive():
                self._discard_jail(force=True)
                self._jail = self._start_jail()
            reply = self._jail.run(spec)
        except (JailFailure, OSError) as exc:
            log.warning("jail failure", extra={"error": str(exc)})
            self._discard_jail(force=True)
            return ExecutionResult.failure(
                Status.SANDBOX_ERROR, f"sandbox failure: {exc}", spec.execution_id
            )
        if self.mode == "cold" or self._jail.runs >= self._settings.zygote_max_runs:
            self._discard_jail()
        return to_result(spec, reply)

    def zygote_pid(self) -> int | None:
        """Host pid of the current zygote, if one is running."""
        return self._jail.zygote_pid if self._jail is not None else None

    def _discard_jail(self, force: bool = False) -> None:
        if self._jail is not None:
            self._jail.close(force=force)
            self._jail = None

    def close(self) -> None:
        """Tear the jail and the cgroups down."""
        self._discard_jail()
        self._cgroups.destroy()
