"""Java, JavaScript and bash through the real service: /execute, SandboxFusion's /run_code and
code-judge's /run, honest and hostile programs, with the statuses each wire reports."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.compat.conftest import post_ok

JAVA_ECHO = (
    "import java.util.*;\npublic class Main { public static void main(String[] a) {"
    " System.out.print(new Scanner(System.in).next()); } }\n"
)
JS_ECHO = "process.stdout.write(require('fs').readFileSync(0, 'utf8').trim())"
BASH_ECHO = 'read x; printf "%s" "$x"'

JAVA_OOM = (
    "import java.util.*;\npublic class Main { public static void main(String[] a) {"
    " List<long[]> l = new ArrayList<>(); while (true) l.add(new long[1 << 20]); } }\n"
)
JS_OOM = "const a = []; while (true) a.push(new Array(1e6).fill(1.5));"


async def execute(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    result: dict[str, Any] = await post_ok(http, "/execute", body)
    return result


@pytest.mark.parametrize(
    ("language", "code"), [("java", JAVA_ECHO), ("javascript", JS_ECHO), ("bash", BASH_ECHO)]
)
async def test_execute_runs_each_language(
    http: httpx.AsyncClient, language: str, code: str
) -> None:
    result = await execute(http, code=code, language=language, stdin="hello\n")
    assert (result["status"], result["stdout"], result["exit_code"]) == ("ok", "hello", 0), result
    assert (result["compile"] is not None) == (language == "java")


@pytest.mark.parametrize(
    ("language", "code", "status"),
    [
        ("java", JAVA_OOM, "memory_limit"),
        ("javascript", JS_OOM, "memory_limit"),
        ("bash", "x=a; while :; do x=$x$x; done", "memory_limit"),
        (
            "java",
            "public class Main { public static void main(String[] a) { for(;;); } }",
            "timeout",
        ),
        ("javascript", "for (;;) {}", "timeout"),
        ("bash", "while :; do :; done", "timeout"),
        ("bash", "kill -9 $$", "killed"),
        ("javascript", "process.kill(process.pid, 'SIGSEGV')", "killed"),
    ],
)
async def test_execute_holds_hostile_programs_with_their_status(
    http: httpx.AsyncClient, language: str, code: str, status: str
) -> None:
    timeout = 2 if status == "timeout" else 20
    result = await execute(http, code=code, language=language, timeout=timeout, memory_mb=256)
    assert result["status"] == status, result


async def test_execute_refuses_a_session_in_another_language(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/execute", json={"code": "echo", "language": "bash", "session_id": "s1"}
    )
    assert response.status_code == 422 and "sessions run Python" in response.text


@pytest.mark.parametrize(
    ("language", "code"), [("java", JAVA_ECHO), ("nodejs", JS_ECHO), ("bash", BASH_ECHO)]
)
async def test_run_code_reports_as_sandboxfusion(
    http: httpx.AsyncClient, language: str, code: str
) -> None:
    body = {"language": language, "code": code, "stdin": "hi"}
    answer = await post_ok(http, "/run_code", body)
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "hi", answer
    assert answer["run_result"]["status"] == "Finished"
    if language == "java":
        assert answer["compile_result"]["status"] == "Finished"
        assert answer["compile_result"]["return_code"] == 0
    else:
        assert answer["compile_result"] is None


async def test_run_code_failures_as_sandboxfusion(http: httpx.AsyncClient) -> None:
    broken = {"language": "java", "code": "public class Main { int x = ; }"}
    answer = await post_ok(http, "/run_code", broken)
    assert answer["status"] == "Failed" and answer["run_result"] is None
    assert answer["compile_result"]["return_code"] == 1
    assert "Main.java:1: error" in answer["compile_result"]["stderr"]
    slow = {"language": "nodejs", "code": "for (;;) {}", "run_timeout": 1}
    answer = await post_ok(http, "/run_code", slow)
    assert answer["status"] == "Failed"
    assert (answer["run_result"]["status"], answer["run_result"]["return_code"]) == (
        "TimeLimitExceeded",
        None,
    )
    exits = {"language": "bash", "code": "echo out; exit 3"}
    answer = await post_ok(http, "/run_code", exits)
    assert answer["status"] == "Failed" and answer["run_result"]["return_code"] == 3
    assert answer["run_result"]["stdout"] == "out\n"
    unsupported = await post_ok(http, "/run_code", {"language": "rust", "code": "fn main() {}"})
    assert unsupported["status"] == "SandboxError" and "'rust'" in unsupported["message"]


@pytest.mark.parametrize(
    ("type_", "solution", "expected", "outcome"),
    [
        ("java", JAVA_ECHO, "a", (True, True, "")),
        ("java", JAVA_ECHO, "b", (False, True, "")),
        ("java", "public class Main { int x = ; }", "a", (False, False, "")),
        ("javascript", JS_ECHO, "a", (True, True, "")),
        ("javascript", "for (;;) {}", "a", (False, False, "worker_timeout")),
        ("bash", BASH_ECHO, "a", (True, True, "")),
        ("bash", "exit 1", "a", (False, False, "")),
    ],
)
async def test_code_judge_types(
    http: httpx.AsyncClient,
    type_: str,
    solution: str,
    expected: str,
    outcome: tuple[bool, bool, str],
) -> None:
    body = {"type": type_, "solution": solution, "input": "a", "expected_output": expected}
    result = await post_ok(http, "/run", body)
    assert (result["success"], result["run_success"], result["reason"]) == outcome, result
    if "int x = ;" in solution:
        assert result["cost"] == 0 and "Main.java:1: error" in result["stderr"]
