"""Java, JavaScript (Node) and bash in real jails (warm and cold): honest programs, compile
errors, the Java build cache, and hostile programs held by the jail's limits with their statuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.jail.compiled import BinaryCache, run_program
from sandbox_service.jail.languages import ARTIFACT_NAME
from tests.jail.conftest import TEST_LIMITS

JAVA_REVERSE = """import java.util.*;
public class Main {
    public static void main(String[] args) {
        Scanner in = new Scanner(System.in);
        System.out.println(new StringBuilder(in.next()).reverse());
    }
}
"""


def java(body: str, name: str = "Main") -> str:
    return (
        "import java.util.*;\n"
        f"public class {name} {{ public static void main(String[] a) throws Exception {{ "
        f"{body} }} }}\n"
    )


@pytest.fixture
def cache(tmp_path: Path) -> BinaryCache:
    return BinaryCache(tmp_path / "builds")


def run(
    executor: JailExecutor,
    cache: BinaryCache,
    language: str,
    source: str,
    stdin: str = "",
    **limits: object,
) -> ExecutionResult:
    spec = ExecutionSpec(code=source, stdin=stdin, limits=replace(TEST_LIMITS, **limits))  # type: ignore[arg-type]
    failures = executor.jail_failures
    result = run_program(language, spec, executor.run, cache, "t1", 30.0)
    assert executor.jail_failures == failures, f"the jail failed under this program: {result}"
    return result


# --- honest programs -----------------------------------------------------------------------


def test_java_compiles_reads_stdin_and_the_build_is_cached(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    first = run(executor, cache, "java", JAVA_REVERSE, stdin="abc\n")
    assert (first.status, first.stdout, first.exit_code) == (Status.OK, "cba\n", 0), first
    assert first.compile is not None and first.compile.status is Status.OK
    assert not first.compile.cached
    again = run(executor, cache, "java", JAVA_REVERSE, stdin="xyz\n")
    assert (again.status, again.stdout) == (Status.OK, "zyx\n")
    assert again.compile is not None and again.compile.cached
    assert ARTIFACT_NAME not in again.files


def test_java_runs_the_public_class_with_assertions_and_javatuples(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    source = (
        "import org.javatuples.*;\n"
        'class Problem { static Pair<Integer, String> f() { return Pair.with(1, "one"); } }\n'
        "public class Solution { public static void main(String[] a) {\n"
        "    assert Problem.f().getValue0() == 1; System.out.println(Problem.f()); } }\n"
    )
    result = run(executor, cache, "java", source)
    assert (result.status, result.stdout) == (Status.OK, "[1, one]\n"), result
    failing = run(executor, cache, "java", java('assert 1 == 2 : "wrong";'))
    assert failing.status is Status.ERROR and "AssertionError: wrong" in failing.stderr


def test_java_compile_errors_are_errors_that_never_ran(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    result = run(executor, cache, "java", "public class Main { void f() { int x = ; } }\n")
    assert result.status is Status.ERROR and result.wall_time == 0
    assert "Main.java:1: error" in result.stderr
    assert result.compile is not None and result.compile.status is Status.ERROR


def test_javascript_reads_stdin_and_has_no_compile_step(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    source = (
        "const s = require('fs').readFileSync(0, 'utf8').trim();"
        "console.log([...s].reverse().join(''))"
    )
    result = run(executor, cache, "javascript", source, stdin="abc\n")
    assert (result.status, result.stdout, result.compile) == (Status.OK, "cba\n", None), result
    thrown = run(executor, cache, "javascript", "throw new Error('boom')")
    assert (thrown.status, thrown.exit_code) == (Status.ERROR, 1)
    assert "Error: boom" in thrown.stderr


def test_bash_runs_with_the_usual_tools_as_the_sandbox_user(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    source = 'read x; echo "got $x" | tr a-z A-Z; id -un; echo err >&2; exit 4'
    result = run(executor, cache, "bash", source, stdin="abc\n")
    assert (result.status, result.exit_code) == (Status.ERROR, 4), result
    assert result.stdout == "GOT ABC\nsandbox\n" and result.stderr == "err\n"


def test_exit_codes_are_the_programs(executor: JailExecutor, cache: BinaryCache) -> None:
    assert run(executor, cache, "java", java("System.exit(5);")).exit_code == 5
    assert run(executor, cache, "javascript", "process.exit(7)").exit_code == 7
    assert run(executor, cache, "bash", "true").status is Status.OK


# --- hostile programs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "source"),
    [
        ("java", java("while (true) {}")),
        ("javascript", "while (true) {}"),
        ("bash", "while :; do :; done"),
    ],
)
def test_endless_loops_time_out(
    executor: JailExecutor, cache: BinaryCache, language: str, source: str
) -> None:
    result = run(executor, cache, language, source, timeout_s=1.5)
    assert result.status is Status.TIMEOUT, result


@pytest.mark.parametrize(
    ("language", "source"),
    [
        (
            "java",
            java("List<long[]> l = new ArrayList<>(); while (true) l.add(new long[1 << 20]);"),
        ),
        ("javascript", "const a = []; while (true) a.push(new Array(1e6).fill(1.5));"),
        ("bash", "x=a; while :; do x=$x$x; done"),
    ],
)
def test_filling_memory_is_memory_limit(
    executor: JailExecutor, cache: BinaryCache, language: str, source: str
) -> None:
    result = run(executor, cache, language, source, memory_mb=256, timeout_s=20.0)
    assert result.status is Status.MEMORY_LIMIT, result


def test_printing_the_jvms_out_of_memory_message_is_not_memory_limit(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    fake = java(
        'System.out.println("Terminating due to java.lang.OutOfMemoryError: Java heap space");'
        "System.exit(3);"
    )
    result = run(executor, cache, "java", fake)
    assert (result.status, result.exit_code) == (Status.ERROR, 3)


@pytest.mark.parametrize(
    ("language", "source"),
    [
        (
            "java",
            java(
                "for (int i = 0; i < 10000; i++) new Thread(() -> { try { Thread.sleep(100000); }"
                " catch (Exception e) {} }).start();"
            ),
        ),
        (
            "javascript",
            "const {Worker} = require('worker_threads');"
            "for (let i = 0; i < 500; i++)"
            " new Worker('setInterval(() => {}, 1000)', {eval: true});",
        ),
        ("bash", ":(){ :|:& };: ; sleep 1"),
    ],
)
def test_thread_and_fork_bombs_are_held_and_the_jail_stays_sound(
    executor: JailExecutor, cache: BinaryCache, language: str, source: str
) -> None:
    result = run(executor, cache, language, source, timeout_s=3.0)
    assert result.status in (Status.ERROR, Status.TIMEOUT, Status.OK), result
    after = run(executor, cache, "bash", "echo fine")
    assert (after.status, after.stdout) == (Status.OK, "fine\n")


def test_no_network_and_a_read_only_system(executor: JailExecutor, cache: BinaryCache) -> None:
    source = (
        "require('http').get('http://1.1.1.1', () => console.log('reached'))"
        ".on('error', e => console.log('no network'));"
        "try { require('fs').writeFileSync('/usr/x', 'y') } catch (e) { console.log(e.code) }"
    )
    result = run(executor, cache, "javascript", source)
    assert result.stdout in ("no network\nEROFS\n", "EROFS\nno network\n"), result
    jdk = run(executor, cache, "bash", "touch /etc/java-17-openjdk/x 2>/dev/null || echo ro")
    assert jdk.stdout == "ro\n"


def test_what_a_hello_world_costs_per_language(executor: JailExecutor, cache: BinaryCache) -> None:
    """Measured, not asserted: `pytest tests/jail/test_languages.py -q -s -k costs`."""
    hello = {
        "java": java('System.out.println("hi");'),
        "javascript": "console.log('hi')",
        "bash": "echo hi",
    }
    for language, source in hello.items():
        first = run(executor, cache, language, source)
        again = run(executor, cache, language, source)
        assert first.stdout == again.stdout == "hi\n"
        compiled = first.compile.wall_time if first.compile is not None else 0.0
        print(
            f"\n{language} {executor.mode}: compile {compiled:.3f} s, run {first.wall_time:.3f} s,"
            f" cached run {again.wall_time:.3f} s, peak {again.peak_memory_mb} MB"
        )
    tasks = {
        "java": java('System.out.println(new java.io.File("/proc/self/task").list().length);'),
        "javascript": "console.log(require('fs').readdirSync('/proc/self/task').length)",
    }
    for language, source in tasks.items():
        counted = run(executor, cache, language, source, memory_mb=64)
        assert counted.status is Status.OK, counted
        print(f"{language}: {counted.stdout.strip()} threads, compiled and ran under 64 MB")


def test_a_jar_among_the_files_is_on_the_java_class_path(
    executor: JailExecutor, cache: BinaryCache
) -> None:
    from sandbox_service.jail.compiled import cache_key
    from sandbox_service.jail.languages import toolchain

    library = 'package lib;\npublic class Greeting { public static String hi() { return "hi"; } }'
    compiled = run(executor, cache, "java", library)
    assert compiled.compile is not None and compiled.compile.status is Status.OK, compiled
    jar = cache.get("t1", cache_key(toolchain("java", ExecutionSpec(code=library)), library))
    assert jar is not None
    program = java("System.out.println(lib.Greeting.hi());")
    spec = ExecutionSpec(code=program, files={"deps/lib.jar": jar}, limits=TEST_LIMITS)
    result = run_program("java", spec, executor.run, cache, "t1", 30.0)
    assert (result.status, result.stdout) == (Status.OK, "hi\n"), result
