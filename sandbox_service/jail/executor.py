"""The jailed executor of one worker slot, in warm (zygote) or cold (nsjail per run) mode.

Both modes run the same zygote program under the same policy and cgroups; warm keeps one
preloaded zygote and forks from it, cold starts a bare one for every execution. So both give
the same results and differ only in start-up cost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sandbox_service.cancel import Cancel
from sandbox_service.execution import ExecutionResult, ExecutionSpec, ProgramError, Status
from sandbox_service.import_scan import Zygote
from sandbox_service.jail import cgroups as cg
from sandbox_service.jail import matplotlib_cache
from sandbox_service.jail.inside import protocol
from sandbox_service.jail.inside.protocol import FetchBudget
from sandbox_service.jail.outcome import RawOutcome, classify
from sandbox_service.jail.policy import SCRATCH_DIRS, VENV_IN_JAIL, JailLayout
from sandbox_service.jail.zygote_jail import JailFailure, ZygoteJail, ZygoteReply
from sandbox_service.settings import ExecutorMode, Settings

log = logging.getLogger(__name__)

STDERR_TAIL_CHARS = 2000
CLEANUP_WAIT_S = 0.2
"""How long a warm run waits for the last run's files to be freed before replacing a jail
whose memory stays above its baseline (a new jail costs a preload: seconds)."""


class JailRuntimeError(RuntimeError):
    """The interpreter cannot be mounted into the jail."""


def _is_under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def jail_runtime(python: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The interpreter's path inside the jail, and the (host, jail) directories it needs.

    A virtual environment is mounted at VENV_IN_JAIL, wherever it lives on the host (a checkout
    under /tmp or /home must not collide with the jail's own /tmp and working directory); the
    base installation that its interpreter links to is mounted at its own path.
    """
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        env_prefix = os.path.abspath(sys.prefix)
        base = os.path.realpath(sys.base_prefix)
    else:
        # A foreign interpreter: its installation is two levels above bin/python.
        env_prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
        base = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    mounts: list[tuple[str, str]] = []
    python_in_jail = os.path.abspath(python)
    if env_prefix != base:
        mounts.append((env_prefix, VENV_IN_JAIL))
        python_in_jail = os.path.join(VENV_IN_JAIL, os.path.relpath(python_in_jail, env_prefix))
    if not _is_under(base, "/usr"):
        clash = [d for d in SCRATCH_DIRS if _is_under(base, d)]
        if clash:
            raise JailRuntimeError(
                f"the interpreter's installation {base} lies under {clash[0]}, which the jail "
                "replaces with a private directory: install Python elsewhere"
            )
        mounts.append((base, base))
    return python_in_jail, tuple(mounts)


INSIDE_SOURCE = os.path.dirname(os.path.abspath(protocol.__file__))
"""The in-jail program's directory on the host, mounted into every jail."""


def make_layout(settings: Settings, slot: int, mode: ExecutorMode) -> JailLayout:
    """The jail layout of one slot."""
    python = settings.jail_python or sys.executable
    fonts = matplotlib_cache.font_cache(python)
    python_in_jail, runtime_mounts = jail_runtime(python)
    return JailLayout(
        python=python_in_jail,
        runtime_mounts=runtime_mounts,
        inside_source=INSIDE_SOURCE,
        outside_uid=settings.sandbox_uid_base + slot,
        control_fd=-1,
        workdir_size_mb=settings.workdir_size_mb,
        tmp_size_mb=settings.tmp_size_mb,
        max_file_size_mb=settings.max_file_size_mb,
        max_open_files=settings.max_open_files,
        preload=mode == "warm",
        preload_full=settings.preload == "full",
        matplotlib_cache=str(fonts) if fonts else None,
        once=mode == "cold",
        idle_warm_up=settings.idle_warm_up if mode == "warm" else "never",
        start_timeout_s=settings.jail_start_timeout_s,
        time_limit_s=0 if mode == "warm" else int(settings.max_timeout) + 30,
    )


def fetch_note(omitted: dict[str, str] | None) -> str:
    """The line appended to stderr for requested files that exist but were not returned."""
    if not omitted:
        return ""
    listed = "; ".join(f"{path}: {why}" for path, why in sorted(omitted.items()))
    return f"\nrl-sandbox: fetch_files not returned: {listed}\n"


def to_result(spec: ExecutionSpec, reply: ZygoteReply) -> ExecutionResult:
    """Combine the zygote's report with the captured output into an ExecutionResult."""
    stderr = reply.stderr.text()
    if reply.program_error:
        stderr += f"\nrl-sandbox: {reply.program_error}; the session's state is lost\n"
    stderr += fetch_note(reply.files_omitted)
    if reply.outputs_dropped:
        stderr += "\nrl-sandbox: rich outputs dropped: " + "; ".join(reply.outputs_dropped) + "\n"
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
        cpu_limit_reached=reply.cpu_limit_reached,
        peak_memory_mb=reply.usage.peak_memory_mb,
        memory_limit_mb=spec.limits.memory_mb,
        raised_memory_error=(reply.error or {}).get("ename") == "MemoryError",
    )
    return ExecutionResult(
        status=classify(raw),
        exit_code=reply.exit_code,
        signal=reply.signal,
        stdout=reply.stdout.text(),
        stderr=stderr,
        stdout_truncated=reply.stdout.truncated,
        stderr_truncated=reply.stderr.truncated,
        stdout_bytes=reply.stdout.total,
        stderr_bytes=reply.stderr.total,
        wall_time=round(reply.wall_time, 6),
        cpu_time=round(reply.cpu_time, 6),
        peak_memory_mb=reply.usage.peak_memory_mb,
        files=reply.files,
        execution_id=spec.execution_id,
        display=reply.display,
        error=_program_error(reply.error),
    )


def _program_error(error: dict[str, Any] | None) -> ProgramError | None:
    if not error:
        return None
    return ProgramError(
        ename=str(error["ename"]), evalue=str(error["evalue"]), traceback=tuple(error["traceback"])
    )


def apply_cpu_limit(cgroups: cg.SlotCgroups, cores: float | None) -> None:
    """Give a slot's (or a session's) cgroup its CPU limit; without a cpu controller the slot
    runs unlimited, which is logged: the host then shares its CPUs as the scheduler does."""
    try:
        cgroups.set_cpu_limit(cores)
    except (cg.CgroupUnavailable, OSError) as exc:
        log.warning("no CPU limit for a jail", extra={"error": str(exc)})


def fetch_budget(settings: Settings) -> FetchBudget:
    """The fetch budget of every execution (server settings)."""
    return FetchBudget(max_files=settings.max_fetch_files, max_bytes=settings.max_fetch_bytes)


def _sandbox_failure(spec: ExecutionSpec, exc: Exception) -> ExecutionResult:
    return ExecutionResult.failure(
        Status.SANDBOX_ERROR, f"sandbox failure: {exc}", spec.execution_id
    )


class _StartingJail:
    """A jail being started in a background thread (the next one of a slot)."""

    def __init__(self, jail: ZygoteJail) -> None:
        self.jail = jail
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="jail-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.jail.start()
        except BaseException as exc:  # handed to whoever takes the jail
            self.error = exc

    def ready(self) -> bool:
        """Whether the start has finished (well or not)."""
        return not self._thread.is_alive()

    def take(self) -> ZygoteJail:
        """Wait for the start; the started jail, or JailFailure."""
        self._thread.join()
        if self.error is not None:
            raise JailFailure(f"jail did not start: {self.error}") from self.error
        return self.jail


class JailExecutor:
    """One executor slot: two cgroups and a zygote jail (kept warm, or one per run).

    The next jail is started in the background, before it is needed: in cold mode after every
    run, in warm mode when the zygote nears `zygote_max_runs`. Each of the two jails that can
    exist at once has a cgroup of its own.
    """

    def __init__(
        self,
        settings: Settings,
        slot: int,
        mode: ExecutorMode | None = None,
        start_ahead: bool = True,
        zygote: Zygote = "data",
    ) -> None:
        self.mode: ExecutorMode = mode or settings.executor_mode
        self._start_ahead = start_ahead
        """Start the next cold jail after each run (False for a single run: nothing follows)."""
        self._settings = settings
        self._layout = make_layout(settings, slot, self.mode)
        # Which of the slot's zygotes (jail/zygotes.py): the lean one preloads the standard
        # library alone and has nothing to exercise while idle.
        if zygote == "lean":
            self._layout = dataclasses.replace(
                self._layout, preload_zygote=zygote, preload_full=False, idle_warm_up="never"
            )
        else:
            self._layout = dataclasses.replace(self._layout, preload_zygote=zygote)
        variant = "" if zygote == "data" else zygote
        cg.remove_stale(settings.cgroup_parent, wait_s=0.0)  # the supervisor waits at its stop
        self._cgroups = [
            cg.SlotCgroups(settings.cgroup_parent, f"slot{slot}{variant}{tag}-{os.getpid()}")
            for tag in "ab"
        ]
        for cgroups in self._cgroups:
            cgroups.create()
            apply_cpu_limit(cgroups, settings.slot_cpu_cores)
        self._log_path = (
            Path(tempfile.gettempdir()) / f"rl-sandbox-jail-{os.getpid()}-{slot}{variant}.log"
        )
        self._jail: ZygoteJail | None = None
        self._next: _StartingJail | None = None
        self.jail_failures = 0
        """Jails that failed under a run (each was replaced; the run was retried once)."""
        self.warmed_runs = 0
        """Runs that found a standby warmed up while the slot was idle."""
        self.memory_recycles = 0
        """Warm jails replaced because memory stayed charged above their baseline."""
        self.max_runs_recycles = 0
        """Warm jails replaced after zygote_max_runs runs."""
        self.jail_starts = 0
        """Jails started (the first one included; one per run in cold mode)."""
        if self.mode == "warm":
            self._jail = self._start_jail()
        else:
            self._prepare_next()

    def _free_cgroups(self) -> cg.SlotCgroups:
        used = {id(j.cgroups) for j in (self._jail, self._next and self._next.jail) if j}
        return next(c for c in self._cgroups if id(c) not in used)

    def _new_jail(self) -> ZygoteJail:
        self.jail_starts += 1
        return ZygoteJail(
            self._layout, self._free_cgroups(), self._log_path, fetch_budget(self._settings)
        )

    def _start_jail(self) -> ZygoteJail:
        jail = self._new_jail()
        started = time.monotonic()
        jail.start()
        log.info(
            "jail started",
            extra={
                "mode": self.mode,
                "seconds": round(time.monotonic() - started, 3),
                "immortal_objects": jail.immortal_objects,
            },
        )
        return jail

    def _prepare_next(self) -> None:
        if self._next is None:
            self._next = _StartingJail(self._new_jail())

    def _take_jail(self) -> ZygoteJail:
        """The jail to run on: the current one, the one started ahead, or a new one."""
        if self._jail is not None and self._jail.alive() and not self._holds_memory(self._jail):
            return self._jail
        self._discard_jail(force=True)
        if self._next is not None:
            starting, self._next = self._next, None
            self._jail = starting.take()
        else:
            self._jail = self._start_jail()
        return self._jail

    def _holds_memory(self, jail: ZygoteJail) -> bool:
        """Whether a warm jail kept memory a run left behind: it is then replaced."""
        if self.mode != "warm" or jail.runs == 0:
            return False
        slack = self._settings.memory_recycle_slack_mb * cg.MIB
        # The zygote mounts the next run's scratch directories after its answer, which frees
        # the last run's files: a call that comes at once may find them still charged.
        deadline = time.monotonic() + CLEANUP_WAIT_S
        while jail.cgroups.growth_since_baseline_bytes() > slack:
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        else:
            return False
        self.memory_recycles += 1
        log.warning("jail replaced: memory above its baseline after cleanup")
        return True

    def memory_above_baseline_mb(self) -> float | None:
        """Unreclaimable memory of the current jail above its post-preload baseline."""
        if self._jail is None:
            return None
        return self._jail.cgroups.growth_since_baseline_bytes() / cg.MIB

    def cpu_throttling(self) -> cg.CpuThrottling:
        """The slot's CFS counters: both of its cgroups summed (cumulative since the slot was
        created, whichever jail ran, in cold mode too)."""
        counters = [cgroups.cpu_throttling() for cgroups in self._cgroups]
        return cg.CpuThrottling(
            periods=sum(c.periods for c in counters),
            throttled_periods=sum(c.throttled_periods for c in counters),
            throttled_us=sum(c.throttled_us for c in counters),
        )

    def run(self, spec: ExecutionSpec, cancel: Cancel | None = None) -> ExecutionResult:
        """Run one execution on a sound jail.

        A jail that fails is replaced, and the execution runs once more on the fresh one when
        the failure did not already take its time (a jailed program has no effect outside its
        run, so running it again is safe); a second failure is a sandbox_error result.
        """
        try:
            return self._run_once(spec, cancel)
        except (JailFailure, OSError) as exc:
            if not getattr(exc, "retryable", True) or (cancel is not None and cancel.requested):
                return _sandbox_failure(spec, exc)
        try:
            return self._run_once(spec, cancel)
        except (JailFailure, OSError) as exc:
            return _sandbox_failure(spec, exc)

    def _run_once(self, spec: ExecutionSpec, cancel: Cancel | None) -> ExecutionResult:
        try:
            jail = self._take_jail()
            reply = jail.run(spec, cancel)
        except (JailFailure, OSError) as exc:
            self.jail_failures += 1
            log.warning("jail failure: %s", exc, extra={"error": str(exc)})
            self._discard_jail(force=True)
            raise
        self.warmed_runs += reply.warmed
        self._after_run(jail)
        return to_result(spec, reply)

    def _after_run(self, jail: ZygoteJail) -> None:
        if self.mode == "cold":
            self._discard_jail()
            if self._start_ahead:
                self._prepare_next()
            return
        max_runs = self._settings.zygote_max_runs
        if jail.runs >= max_runs * 0.9 or jail.runs >= max_runs - 1:
            self._prepare_next()
        if jail.runs >= max_runs and self._next is not None and self._next.ready():
            self.max_runs_recycles += 1
            self._discard_jail()  # the next run takes the jail started ahead

    def zygote_pid(self) -> int | None:
        """Host pid of the current zygote, if one is running."""
        return self._jail.zygote_pid if self._jail is not None else None

    def _discard_jail(self, force: bool = False) -> None:
        if self._jail is not None:
            self._jail.close(force=force)
            self._jail = None

    def close(self) -> None:
        """Tear the jails and the cgroups down."""
        self._discard_jail()
        if self._next is not None:
            starting, self._next = self._next, None
            with contextlib.suppress(JailFailure):
                starting.take()
            starting.jail.close()
        for cgroups in self._cgroups:
            cgroups.destroy()
        with contextlib.suppress(OSError):
            self._log_path.unlink()  # nsjail's messages; a slot closed in order needs none kept
