"""The languages other than Python: how each one's program is compiled and run in the jail (no
I/O but looking up where the host's JDK lies).

Every step is an ordinary execution of the slot's executor: a short Python program that `exec`s
the tool (or, for Java's compile, runs javac and packs its classes into one archive), so every
language has the jail, seccomp policy, cgroup limits and statuses of a Python program, and the
run's exit code, signal, time and memory are the tool's own.

    language     source       compile step (cached per tenant)          run
    cpp          main.cpp     g++ -O2 -std=gnu++17 -> a binary          the binary
    java         Main.java    javac -> the classes in one jar           java -ea -cp <jar> Main
    javascript   main.js      none                                      node main.js
    bash         main.sh      none                                      bash main.sh

Java: the source file is named after its public top-level class (Main when there is none, as
SandboxFusion names it); the JVM gets a heap of three quarters of the run's memory, the serial
collector and two JIT threads, so that it stays inside the cgroup's memory and pids limits
(threads count as processes) whatever the host's size, and exits on its first
OutOfMemoryError (status `memory_limit`: outcome_of). The jars among the program's files and
javatuples, where the host has it, are on the class path (MultiPL-E's Java prompts import
javatuples, SandboxFusion ships it).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import signal
from dataclasses import dataclass, replace

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Status

ARTIFACT_NAME = ".rl-sandbox-main"
"""Where the compile step's output (C++'s binary, Java's jar) lies in the working directory
while the program runs (a program's files may not overwrite it: it is written last)."""

GXX = "/usr/bin/g++"
GXX_FLAGS = ("-O2", "-std=gnu++17", "-pipe")
"""code-judge's `g++ -O2`, with a fixed standard so that a cached binary means one thing."""

JAVA_HOMES = ("/usr/lib/jvm/default-java", "/usr/lib/jvm/java-*-openjdk-*")
"""Where Debian's JDK lies (default-java where the default-jdk package made it, else the newest
versioned one, whatever the architecture); used through its real path: the jail has no
/etc/alternatives."""
JAVATUPLES = "/usr/share/java/javatuples.jar"
"""Debian's libjavatuples-java."""
JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:CICompilerCount=2",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Xshare:auto",
    "-Xlog:all=warning:stderr",
)
"""One GC thread and two JIT threads (the JVM would size both by the host's cores, each a pid of
the cgroup); no hsperfdata file in /tmp; the first OutOfMemoryError ends the JVM; the JVM's own
warnings (a thread it could not start) on stderr, never in the program's stdout."""
JAVAC_FLAGS = ("-XX:TieredStopAtLevel=1",)
"""javac is short-lived: the C1 compiler alone starts it sooner."""
JAVA_OOM_EXIT = 3
"""The JVM's exit code under -XX:+ExitOnOutOfMemoryError."""
JAVA_OOM_MESSAGE = "Terminating due to java.lang.OutOfMemoryError"
"""What the JVM prints (to stdout) when -XX:+ExitOnOutOfMemoryError ends it."""
NODE_OOM_MESSAGE = "JavaScript heap out of memory"
"""What V8 prints to stderr before it aborts on a full heap."""
HEAP_FULL_FRACTION = 0.9
"""A run whose peak memory reached this fraction of its heap's limit filled its heap."""

NODE = "/usr/bin/node"
BASH = "/bin/bash"

COMPILE_MAX_PROCESSES = 32
"""g++ runs cc1plus, as, collect2 and ld; javac is a JVM with its own threads."""
RUN_MIN_PROCESSES = {"java": 32, "javascript": 16}
"""A JVM or node starts with a dozen threads or so (GC, JIT, libuv's pool, V8's platform): a
program of these languages has at least this many pids, whatever the request's default."""

_PUBLIC_CLASS = re.compile(r"^\s*public\s+(?:(?:final|abstract|strictfp)\s+)*class\s+(\w+)", re.M)


@dataclass(frozen=True, slots=True)
class Toolchain:
    """How one language's program is compiled (or not) and run."""

    language: str
    source_name: str
    compile_argv: tuple[str, ...] | None
    """The compiler's command line; None: the language has no compile step."""
    run_argv: tuple[str, ...]
    digest: tuple[str, ...] = ()
    """What besides the source decides the compile's output (compiler and flags)."""


@functools.cache
def java_home() -> str:
    """The JDK's real directory on this host ("" when there is none)."""
    for pattern in JAVA_HOMES:
        for candidate in sorted(glob.glob(pattern), reverse=True):
            real = os.path.realpath(candidate)
            if os.path.exists(os.path.join(real, "bin", "javac")):
                return real
    return ""


@functools.cache
def _has_javatuples() -> bool:
    return os.path.exists(JAVATUPLES)


def missing_tool(chain: Toolchain) -> str | None:
    """What the host lacks to run the toolchain (a worker host without the JDK, say), or None."""
    for argv in (chain.compile_argv, chain.run_argv):
        if argv and argv[0].startswith("/") and not os.access(argv[0], os.X_OK):
            return f"{chain.language}: this worker host has no {argv[0]}"
    return None


def java_main_class(source: str) -> str:
    """The class a Java source's file is named after and whose main runs: its first public
    top-level class, else Main."""
    match = _PUBLIC_CLASS.search(source)
    return match.group(1) if match else "Main"


def heap_mb(memory_mb: int) -> int:
    """The JVM's -Xmx and V8's old space: three quarters of the run's memory (the rest:
    metaspace, code, stacks, young generation)."""
    return max(8, memory_mb * 3 // 4)


def _java_class_path(spec: ExecutionSpec, has_javatuples: bool, *entries: str) -> str:
    """The class path: the entries, each jar among the program's files (as SandboxFusion puts
    them), javatuples."""
    jars = sorted(path for path in spec.files if path.endswith(".jar"))
    return ":".join([*entries, *jars, *([JAVATUPLES] if has_javatuples else [])])


def toolchain(language: str, spec: ExecutionSpec) -> Toolchain:
    """The toolchain of a non-Python program (ValueError for a language that has none)."""
    if language == "cpp":
        argv = (GXX, *GXX_FLAGS, "-o", ARTIFACT_NAME, "main.cpp")
        return Toolchain("cpp", "main.cpp", argv, (f"./{ARTIFACT_NAME}",), (GXX, *GXX_FLAGS))
    if language == "java":
        home = java_home()
        main = java_main_class(spec.code)
        tuples = _has_javatuples()
        heap = f"-J-Xmx{heap_mb(spec.limits.memory_mb)}m"
        javac = (
            f"{home}/bin/javac",
            *(f"-J{flag}" for flag in (*JVM_FLAGS, *JAVAC_FLAGS)),
            heap,
            "-encoding",
            "UTF-8",
            "-cp",
            _java_class_path(spec, tuples, "."),
            "-d",
            ".rl-sandbox-classes",
            f"{main}.java",
        )
        java = (
            f"{home}/bin/java",
            *JVM_FLAGS,
            f"-Xmx{heap_mb(spec.limits.memory_mb)}m",
            "-ea",
            "-cp",
            _java_class_path(spec, tuples, ARTIFACT_NAME, "."),
            main,
        )
        # The heap flag is the run's, not the compile's output: it stays out of the digest.
        return Toolchain("java", f"{main}.java", javac, java, (home, *JVM_FLAGS, str(tuples)))
    if language == "javascript":
        return Toolchain("javascript", "main.js", None, (NODE, *node_flags(spec), "main.js"))
    if language == "bash":
        return Toolchain("bash", "main.sh", None, (BASH, "main.sh"))
    raise ValueError(f"no toolchain for language {language!r}")


def node_flags(spec: ExecutionSpec) -> tuple[str, ...]:
    """V8's old space at three quarters of the run's memory (a JavaScript out-of-memory is then
    V8's own fatal error, not the cgroup's kill halfway through a garbage collection)."""
    return (f"--max-old-space-size={heap_mb(spec.limits.memory_mb)}",)


def exec_program(argv: tuple[str, ...]) -> str:
    """A Python program that replaces itself with argv (the run's outcome is the tool's)."""
    return f"import os\nos.execv({argv[0]!r}, {list(argv)!r})\n"


def java_compile_program(argv: tuple[str, ...]) -> str:
    """Run javac, then pack the classes it wrote into the one file the cache keeps (a jar is a
    zip); exit with javac's code. javac's messages go to the step's stderr as they come."""
    return (
        "import os, subprocess, sys, zipfile\n"
        f"code = subprocess.run({list(argv)!r}).returncode\n"
        "if code == 0:\n"
        f"    with zipfile.ZipFile({ARTIFACT_NAME!r}, 'w') as jar:\n"
        "        for folder, _, names in os.walk('.rl-sandbox-classes'):\n"
        "            for name in names:\n"
        "                path = os.path.join(folder, name)\n"
        "                jar.write(path, os.path.relpath(path, '.rl-sandbox-classes'))\n"
        "sys.exit(code)\n"
    )


def compile_program(chain: Toolchain) -> str:
    """The compile step's program."""
    assert chain.compile_argv is not None
    if chain.language == "java":
        return java_compile_program(chain.compile_argv)
    return exec_program(chain.compile_argv)


def run_program(chain: Toolchain) -> str:
    """The run step's program (a binary is made executable first: a fetched file is not)."""
    if chain.language == "cpp":
        return f"import os\nos.chmod({ARTIFACT_NAME!r}, 0o700)\n" + exec_program(chain.run_argv)
    return exec_program(chain.run_argv)


def run_spec(spec: ExecutionSpec, chain: Toolchain, artifact: bytes | None) -> ExecutionSpec:
    """The run step: the tool with the program's stdin, files and limits (a floor of pids for
    runtimes that start threads of their own)."""
    files = {**spec.files, chain.source_name: spec.code.encode("utf-8", "surrogateescape")}
    if artifact is not None:
        files[ARTIFACT_NAME] = artifact
    floor = RUN_MIN_PROCESSES.get(chain.language, 1)
    limits = replace(spec.limits, max_processes=max(spec.limits.max_processes, floor))
    return replace(spec, code=run_program(chain), files=files, limits=limits)


def compile_spec(spec: ExecutionSpec, chain: Toolchain, timeout_s: float) -> ExecutionSpec:
    """The compile step: the source and the program's files, the run's memory, the compile's
    time, the compiler's processes."""
    limits = replace(
        spec.limits,
        timeout_s=timeout_s,
        cpu_time_s=None,
        max_processes=max(spec.limits.max_processes, COMPILE_MAX_PROCESSES),
    )
    return ExecutionSpec(
        code=compile_program(chain),
        files={**spec.files, chain.source_name: spec.code.encode("utf-8", "surrogateescape")},
        fetch_files=(ARTIFACT_NAME,),
        limits=limits,
        execution_id=spec.execution_id,
    )


def outcome_of(language: str, result: ExecutionResult, memory_mb: int) -> ExecutionResult:
    """A run whose runtime ended on its own out-of-memory error with its heap full is
    `memory_limit`, as the cgroup's kill would be: the JVM's OutOfMemoryError (exit 3 under
    -XX:+ExitOnOutOfMemoryError), V8's fatal heap error (SIGABRT). A program that only prints
    the message and exits so, without having filled the heap, keeps its own status."""
    filled = (result.peak_memory_mb or 0.0) >= heap_mb(memory_mb) * HEAP_FULL_FRACTION
    if language == "java":
        ended = result.status is Status.ERROR and result.exit_code == JAVA_OOM_EXIT
        said = JAVA_OOM_MESSAGE in result.stdout[-512:] + result.stderr[-512:]
    elif language == "javascript":
        ended = result.status is Status.KILLED and result.signal == signal.SIGABRT
        said = NODE_OOM_MESSAGE in result.stderr
    else:
        return result
    return replace(result, status=Status.MEMORY_LIMIT) if ended and said and filled else result
