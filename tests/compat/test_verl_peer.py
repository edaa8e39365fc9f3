"""verl's sandbox-fusion reward integration cases (tests/utils/reward_score/reward_score/
test_sandbox_fusion_on_cpu.py, with SANDBOX_FUSION_URL at us): the /run_code bodies verl's
check_correctness sends, scored the way verl scores the answers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.compat.conftest import post_ok

ANSWERS = """
import sys
data = sys.stdin.read()
if data == 'input1':
    print('output1\\n', end='')
elif data == 'input2':
    print('output2\\n', end='')
else:
    print('unexpected input', end='')
"""
MIXED = """
import sys, time
data = sys.stdin.read()
if data.startswith('input_timeout_'):
    time.sleep(20)
print(f"output_{data.split('_')[-1]}\\n", end='')
"""


def verl_body(code: str, stdin: str, timeout: float, language: str = "python") -> dict[str, Any]:
    return {
        "compile_timeout": timeout,
        "run_timeout": timeout,
        "code": code,
        "stdin": stdin,
        "memory_limit_MB": 1024,
        "language": language,
        "files": {},
        "fetch_files": [],
    }


def verl_score(response: dict[str, Any], expected: str) -> bool | int:
    """verl's per-case result for an answer (`_process_single_case`)."""
    run = response.get("run_result") or {}
    compiled = response.get("compile_result") or {}
    if response["status"] == "SandboxError":
        return -1
    if response["status"] == "Failed":
        if compiled.get("status") in ("Error", "TimeLimitExceeded") or (
            compiled.get("status") == "Finished" and compiled.get("return_code") != 0
        ):
            return -4
        if run.get("status") == "TimeLimitExceeded":
            return -3
        return -2
    if run.get("status") == "Finished":
        return bool(run["stdout"].rstrip("\n") == expected.rstrip("\n"))
    return -1


async def check(
    http: httpx.AsyncClient,
    code: str,
    cases: list[tuple[str, str]],
    run_timeout: float = 10,
    language: str = "python",
) -> list[bool | int]:
    bodies = [verl_body(code, stdin, run_timeout, language) for stdin, _ in cases]
    responses = await asyncio.gather(*(post_ok(http, "/run_code", body) for body in bodies))
    return [verl_score(r, expected) for r, (_, expected) in zip(responses, cases, strict=True)]


async def test_correct_and_wrong_answers(http: httpx.AsyncClient) -> None:
    cases = [("input1", "output1\n"), ("input2", "output2\n")]
    assert await check(http, ANSWERS, cases) == [True, True]
    assert await check(http, "print('wrong_output\\n', end='')", cases) == [False, False]


async def test_a_runtime_error_and_a_timeout(http: httpx.AsyncClient) -> None:
    failing = "import sys\nprint('About to raise', file=sys.stderr)\nraise ValueError('runtime')"
    assert await check(http, failing, [("input1", "output1\n")]) == [-2]
    sleeping = "import time\ntime.sleep(10)"
    assert await check(http, sleeping, [("input1", "output1\n")], run_timeout=2) == [-3]


async def test_a_hundred_cases_at_once_with_wrong_answers_and_timeouts(
    http: httpx.AsyncClient,
) -> None:
    timeouts, wrong = {5, 30, 60, 90}, {10, 25, 50}
    cases = []
    for i in range(100):
        stdin = f"input_timeout_{i}" if i in timeouts else f"input_{i}"
        cases.append((stdin, f"wrong_output_{i}\n" if i in wrong else f"output_{i}\n"))
    scores = await check(http, MIXED, cases, run_timeout=3)
    expected = [-3 if i in timeouts else i not in wrong for i in range(100)]
    assert scores == expected


async def test_cpp_answers_and_a_compile_error(http: httpx.AsyncClient) -> None:
    # verl's C++ cases: a program echoing its input, and its compile_error case (-4).
    echo = "#include <iostream>\nint main() { std::string s; std::cin >> s; std::cout << s; }"
    assert await check(http, echo, [("a", "a"), ("b", "c")], language="cpp") == [True, False]
    broken = "#include <iostream>\nint main() { std::cout << undefined_var; }"
    assert await check(http, broken, [("a", "a")], language="cpp") == [-4]


JAVA_ECHO = """import java.util.*;
public class Main {
    public static void main(String[] args) {
        Scanner in = new Scanner(System.in);
        System.out.print(in.next());
    }
}
"""


async def test_java_answers_a_compile_error_a_runtime_error_and_a_timeout(
    http: httpx.AsyncClient,
) -> None:
    # A CodeContests-style Java sample: SandboxFusion's `java` (Main.java, javac, java -ea).
    assert await check(http, JAVA_ECHO, [("a", "a"), ("b", "c")], language="java") == [True, False]
    broken = "public class Main { public static void main(String[] a) { int x = ; } }"
    assert await check(http, broken, [("a", "a")], language="java") == [-4]
    throws = "public class Main { public static void main(String[] a) { assert 1 == 2; } }"
    assert await check(http, throws, [("a", "a")], language="java") == [-2]
    loops = "public class Main { public static void main(String[] a) { while (true) {} } }"
    assert await check(http, loops, [("a", "a")], run_timeout=2, language="java") == [-3]


async def test_javascript_answers_a_runtime_error_and_a_timeout(http: httpx.AsyncClient) -> None:
    # A MultiPL-E-style JavaScript sample: SandboxFusion's `nodejs`.
    echo = "process.stdout.write(require('fs').readFileSync(0, 'utf8').trim())"
    cases = [("a", "a"), ("b", "c")]
    assert await check(http, echo, cases, language="nodejs") == [True, False]
    assert await check(http, "throw new Error('x')", [("a", "a")], language="nodejs") == [-2]
    loops = "while (true) {}"
    assert await check(http, loops, [("a", "a")], run_timeout=2, language="nodejs") == [-3]
