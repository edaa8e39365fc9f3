"""What each language compiles and runs (jail/languages.py), without a jail."""

from __future__ import annotations

import signal

import pytest

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Limits, Status
from sandbox_service.jail.compiled import cache_key
from sandbox_service.jail.languages import (
    ARTIFACT_NAME,
    JAVA_OOM_MESSAGE,
    NODE_OOM_MESSAGE,
    compile_spec,
    heap_mb,
    java_main_class,
    outcome_of,
    run_spec,
    toolchain,
)


@pytest.mark.parametrize(
    ("source", "main"),
    [
        ("public class Main { }", "Main"),
        ("class Helper {}\npublic final class Solution {\n}", "Solution"),
        ("class Main {}", "Main"),
        ("  public  class\tX2 {}", "X2"),
        ("// public class Fake\nclass A {}", "Main"),
    ],
)
def test_a_java_file_is_named_after_its_public_class(source: str, main: str) -> None:
    assert java_main_class(source) == main
    assert toolchain("java", ExecutionSpec(code=source)).source_name == f"{main}.java"


def test_the_jvm_and_v8_heaps_follow_the_runs_memory() -> None:
    spec = ExecutionSpec(code="x", limits=Limits(memory_mb=512))
    assert heap_mb(512) == 384
    assert "-Xmx384m" in toolchain("java", spec).run_argv
    assert "--max-old-space-size=384" in toolchain("javascript", spec).run_argv


def test_the_build_cache_key_names_language_source_and_files_not_memory() -> None:
    small = ExecutionSpec(code="public class Main {}", limits=Limits(memory_mb=256))
    large = ExecutionSpec(code="public class Main {}", limits=Limits(memory_mb=2048))
    java_key = cache_key(toolchain("java", small), small.code)
    assert java_key == cache_key(toolchain("java", large), large.code)
    assert java_key != cache_key(toolchain("java", small), small.code, {"lib.jar": b"x"})
    cpp = ExecutionSpec(code="public class Main {}")
    assert java_key != cache_key(toolchain("cpp", cpp), cpp.code)


def test_the_steps_carry_the_source_the_output_and_a_floor_of_pids() -> None:
    spec = ExecutionSpec(code="console.log(1)", limits=Limits(max_processes=4))
    node = run_spec(spec, toolchain("javascript", spec), None)
    assert node.files["main.js"] == b"console.log(1)" and node.limits.max_processes == 16
    java = ExecutionSpec(code="public class Main {}", limits=Limits(max_processes=4))
    chain = toolchain("java", java)
    compiled = compile_spec(java, chain, 7.0)
    assert compiled.fetch_files == (ARTIFACT_NAME,) and compiled.limits.timeout_s == 7.0
    assert compiled.limits.max_processes >= 32
    ran = run_spec(java, chain, b"jar")
    assert ran.files[ARTIFACT_NAME] == b"jar" and ran.limits.max_processes == 32
    with pytest.raises(ValueError, match="rust"):
        toolchain("rust", spec)


def result(**fields: object) -> ExecutionResult:
    return ExecutionResult(**fields)  # type: ignore[arg-type]


def test_a_runtime_out_of_memory_with_its_heap_full_is_memory_limit() -> None:
    full = heap_mb(256)
    jvm = result(status=Status.ERROR, exit_code=3, stdout=JAVA_OOM_MESSAGE, peak_memory_mb=full)
    assert outcome_of("java", jvm, 256).status is Status.MEMORY_LIMIT
    v8 = result(
        status=Status.KILLED, signal=signal.SIGABRT, stderr=NODE_OOM_MESSAGE, peak_memory_mb=full
    )
    assert outcome_of("javascript", v8, 256).status is Status.MEMORY_LIMIT


@pytest.mark.parametrize(
    ("language", "fields"),
    [
        # the message alone, the heap far from full: the program's own doing
        ("java", {"status": Status.ERROR, "exit_code": 3, "stdout": JAVA_OOM_MESSAGE}),
        ("javascript", {"status": Status.KILLED, "signal": 6, "stderr": NODE_OOM_MESSAGE}),
        # a full heap without the runtime's message
        ("java", {"status": Status.ERROR, "exit_code": 3, "peak_memory_mb": 400.0}),
        # another language never
        ("bash", {"status": Status.ERROR, "exit_code": 3, "stdout": JAVA_OOM_MESSAGE}),
    ],
)
def test_what_only_looks_like_an_out_of_memory_keeps_its_status(
    language: str, fields: dict[str, object]
) -> None:
    before = result(**fields)
    assert outcome_of(language, before, 256) == before


def test_a_tool_the_host_lacks_is_named() -> None:
    from sandbox_service.jail.languages import Toolchain, missing_tool

    spec = ExecutionSpec(code="x")
    assert missing_tool(toolchain("bash", spec)) is None
    assert missing_tool(toolchain("java", spec)) is None  # this host has the JDK (make setup)
    absent = Toolchain("java", "Main.java", ("/nonexistent/bin/javac",), ("/nonexistent/java",))
    assert missing_tool(absent) == "java: this worker host has no /nonexistent/bin/javac"
