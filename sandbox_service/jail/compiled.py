"""Programs in C++, Java, JavaScript and bash: compiled in the jail (C++, Java), then run in the
jail, with a per-host cache of compiled outputs. What each language runs: jail/languages.py.

Both steps are ordinary executions of the slot's executor (warm or cold), so these programs have
the jail, seccomp policy, cgroup limits and statuses of a Python one. The compile step has its
own wall-clock limit (`compile_timeout_s`) and the run's memory. A compiled output (C++'s binary,
Java's jar) comes back as a fetched file and is kept on the host, named by the digest of the
language, the compiler, its flags and the source, under a folder of the tenant's own: a source
compiled for one API key is never run from another key's cache (the output is the compile's,
and a compile can read what a tenant put in its own jail). Compile errors are results (status
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
from sandbox_service.jail import languages
from sandbox_service.jail.languages import Toolchain

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
    return BinaryCache(Path(tempfile.gettempdir()) / f"rl-sandbox-builds-{os.getuid()}")


def cache_key(chain: Toolchain, source: str, files: dict[str, bytes] | None = None) -> str:
    """The digest that names a source's compiled output: language, compiler, flags, source and
    the input files (a header among them changes the binary)."""
    digest = hashlib.sha256()
    for part in (chain.language, *chain.digest, source):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for path, data in sorted((files or {}).items()):
        digest.update(f"{len(path)}:{path}:{len(data)}:".encode("utf-8", "surrogatepass") + data)
    return digest.hexdigest()


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
        note = "rl-sandbox: the compiler made no output\n"
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


def run_program(
    language: str,
    spec: ExecutionSpec,
    run: Run,
    cache: BinaryCache,
    tenant: str,
    compile_timeout_s: float,
) -> ExecutionResult:
    """Compile (or find in the cache) and run one program of a language other than Python."""
    chain = languages.toolchain(language, spec)
    missing = languages.missing_tool(chain)
    if missing is not None:  # the host's fault, not the program's
        return ExecutionResult.failure(Status.SANDBOX_ERROR, missing, spec.execution_id)
    artifact: bytes | None = None
    outcome: CompileOutcome | None = None
    if chain.compile_argv is not None:
        key = cache_key(chain, spec.code, spec.files)
        artifact = cache.get(tenant, key)
        if artifact is not None:
            outcome = CompileOutcome(status=Status.OK, exit_code=0, cached=True)
        else:
            compiled = run(languages.compile_spec(spec, chain, compile_timeout_s))
            artifact = compiled.files.get(languages.ARTIFACT_NAME)
            if compiled.status is not Status.OK or artifact is None:
                if compiled.status is Status.SANDBOX_ERROR:
                    return replace(compiled, execution_id=spec.execution_id)
                return not_compiled(spec, compiled, compile_timeout_s)
            cache.put(tenant, key, artifact)
            outcome = compile_outcome(compiled)
    result = run(languages.run_spec(spec, chain, artifact))
    result = languages.outcome_of(language, result, spec.limits.memory_mb)
    return replace(result, compile=outcome)
