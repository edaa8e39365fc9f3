"""C++ programs: compiled by g++ in the jail, then run in the jail, with a per-host binary cache.

Both steps are ordinary executions of the slot's executor (warm or cold), so a C++ program has
the jail, seccomp policy, cgroup limits and statuses of a Python one. Each step is a two-line
Python program that `exec`s what should run: the compiler (its helpers cc1plus, as and ld are
its child processes, under the same limits), then the binary (replacing the interpreter, so the
binary's exit code, signal, time and memory are the run's).

The compile step has its own wall-clock limit (`cpp_compile_timeout_s`) and the run's memory.
A compiled binary comes back as a fetched file and is kept on the host, named by the digest of
the compiler, its flags and the source, under a folder of the tenant's own: a source compiled
for one API key is never run from another key's cache (a binary is the compile's output, and a
compile can read what a tenant put in its own jail). Compile errors are results (status
`error`, the compiler's messages in stderr and in `compile`), as code-judge reports them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sandbox_service.execution import (
    CompileOutcome,
    ExecutionResult,
    ExecutionSpec,
    Status,
)

SOURCE_NAME = "main.cpp"
BINARY_NAME = ".rl-sandbox-main"
"""Where the binary lies in the working directory while it runs (a program's files may not
overwrite it: it is written last)."""
COMPILER = "/usr/bin/g++"
FLAGS = ("-O2", "-std=gnu++17", "-pipe")
"""code-judge's `g++ -O2`, with a fixed standard so that a cached binary means one thing."""
COMPILE_MAX_PROCESSES = 16
"""g++ runs cc1plus, as, collect2 and ld: a few processes at a time."""

COMPILE_PROGRAM = (
    "import os\n"
    f"os.execv({COMPILER!r}, ['g++', *{list(FLAGS)!r}, '-o', {BINARY_NAME!r}, {SOURCE_NAME!r}])\n"
)
RUN_PROGRAM = f"import os\nos.chmod({BINARY_NAME!r}, 0o700)\nos.execv({BINARY_NAME!r}, ['main'])\n"

Run = Callable[[ExecutionSpec], ExecutionResult]
"""The slot's executor (JailExecutor.run with the job's cancellation)."""


@dataclass(frozen=True, slots=True)
class BinaryCache:
    """Compiled binaries of this host: <root>/<tenant digest>/<source digest>, 0700, bounded."""

    root: Path
    max_entries: int = 512

    def path(self, tenant: str, key: str) -> Path:
        folder = hashlib.sha256(tenant.encode()).hexdigest()[:32]
        return self.root / folder / key

    def usable(self) -> bool:
        """Whether the root is this user's own private folder (made so if missing): a folder
        in a shared /tmp that another user made, or a link, is not used (nothing is cached)."""
        with contextlib.suppress(FileExistsError):
            self.root.mkdir(mode=0o700, parents=True)
        try:
            st = os.lstat(self.root)
        except OSError:
            return False
        private = stat.S_IMODE(st.st_mode) & 0o077 == 0
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and private

    def get(self, tenant: str, key: str) -> bytes | None:
        """The binary, or None when this tenant has not compiled this source on this host."""
        if not self.usable():
            return None
        path = self.path(tenant, key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return data

    def put(self, tenant: str, key: str, binary: bytes) -> None:
        """Keep a binary (atomically: workers of the host share the cache); evict the oldest."""
        if not self.usable():
            return
        path = self.path(tenant, key)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(binary)
            os.replace(partial, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            return
        self._evict(path.parent)

    def _evict(self, folder: Path) -> None:
        entries = []
        for entry in folder.iterdir():
            with contextlib.suppress(OSError):
                entries.append((entry.stat().st_mtime, entry))
        for _, entry in sorted(entries)[: max(0, len(entries) - self.max_entries)]:
            with contextlib.suppress(OSError):
                entry.unlink()


def default_cache() -> BinaryCache:
    """The host's cache under the temporary directory (one per host user)."""
    return BinaryCache(Path(tempfile.gettempdir()) / f"rl-sandbox-cpp-{os.getuid()}")


def cache_key(source: str, files: dict[str, bytes] | None = None) -> str:
    """The digest that names a source's binary: compiler, flags, source and the input files
    (a header among them changes the binary)."""
    digest = hashlib.sha256()
    for part in (COMPILER, *FLAGS, source):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for path, data in sorted((files or {}).items()):
        digest.update(f"{len(path)}:{path}:{len(data)}:".encode("utf-8", "surrogatepass") + data)
    return digest.hexdigest()


def compile_spec(spec: ExecutionSpec, timeout_s: float) -> ExecutionSpec:
    """The compile step of a C++ program: its source and files (headers), the run's memory, the
    compile's time."""
    limits = replace(
        spec.limits,
        timeout_s=timeout_s,
        cpu_time_s=None,
        max_processes=max(spec.limits.max_processes, COMPILE_MAX_PROCESSES),
    )
    return ExecutionSpec(
        code=COMPILE_PROGRAM,
        files={**spec.files, SOURCE_NAME: spec.code.encode("utf-8", "surrogateescape")},
        fetch_files=(BINARY_NAME,),
        limits=limits,
        execution_id=spec.execution_id,
    )


def run_spec(spec: ExecutionSpec, binary: bytes) -> ExecutionSpec:
    """The run step: the binary with the program's stdin, files and limits."""
    return replace(spec, code=RUN_PROGRAM, files={**spec.files, BINARY_NAME: binary})


def compile_outcome(result: ExecutionResult, cached: bool = False) -> CompileOutcome:
    """What the compile step did (its status as a run's: ok, error, timeout, memory_limit...)."""
    return CompileOutcome(
        status=result.status,
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        wall_time=result.wall_time,
        cached=cached,
    )


def not_compiled(
    spec: ExecutionSpec, compiled: ExecutionResult, timeout_s: float
) -> ExecutionResult:
    """The result of a program that did not compile: an `error` that never ran (wall_time 0),
    the compiler's messages as its stderr (what code-judge reports); `killed` when cancelled."""
    if compiled.status is Status.ERROR:
        note = ""
    elif compiled.status is Status.OK:
        note = "rl-sandbox: the compiler made no binary\n"
    elif compiled.status is Status.TIMEOUT:
        note = f"rl-sandbox: compilation exceeded its limit of {timeout_s:g} s\n"
    else:
        note = f"rl-sandbox: compilation ended with status {compiled.status}\n"
    return ExecutionResult(
        status=Status.KILLED if compiled.status is Status.KILLED else Status.ERROR,
        exit_code=compiled.exit_code,
        stderr=compiled.stderr + note,
        stderr_truncated=compiled.stderr_truncated,
        execution_id=spec.execution_id,
        compile=compile_outcome(compiled),
    )


def run_cpp(
    spec: ExecutionSpec, run: Run, cache: BinaryCache, tenant: str, compile_timeout_s: float
) -> ExecutionResult:
    """Compile (or find in the cache) and run one C++ program."""
    key = cache_key(spec.code, spec.files)
    binary = cache.get(tenant, key)
    if binary is not None:
        outcome = CompileOutcome(status=Status.OK, exit_code=0, cached=True)
    else:
        compiled = run(compile_spec(spec, compile_timeout_s))
        binary = compiled.files.get(BINARY_NAME)
        if compiled.status is not Status.OK or binary is None:
            if compiled.status is Status.SANDBOX_ERROR:
                return replace(compiled, execution_id=spec.execution_id)
            return not_compiled(spec, compiled, compile_timeout_s)
        cache.put(tenant, key, binary)
        outcome = compile_outcome(compiled)
    result = run(run_spec(spec, binary))
    return replace(result, compile=outcome)
