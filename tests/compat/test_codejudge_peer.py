"""code-judge's own test cases (its tests/test_main.py), as our requests.

The same kinds of submissions to /run and /judge (and their batch twins), checked on the fields
code-judge's tests check, against the real service with its default code-judge limit (10 s):
Python, and C++ (accepted, wrong answer, compile error; its time limit is in
tests/service/test_compat.py, under a shorter limit).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.compat.conftest import WORKERS, post_ok

ECHO = "print(input())"
SLEEP_10 = "from time import sleep\nsleep(10)"
LEFT_CHILD = """
import os, time
from multiprocessing import Process

def child():
    print('child started', flush=True)
    time.sleep(100)

Process(target=child).start()
print('parent', os.getpid(), flush=True)
time.sleep(1)
print('parent done; its child still runs', flush=True)
"""
JUDGE_FIELDS = ["sub_id", "success", "run_success", "cost", "reason"]
RUN_FIELDS = ["sub_id", "success", "run_success", "cost", "stdout", "stderr", "reason"]
ROUTES = ["run", "judge"]


def python(solution: str, stdin: str | None = None, expected: str | None = None) -> dict[str, Any]:
    return {"type": "python", "solution": solution, "input": stdin, "expected_output": expected}


def verdict(result: dict[str, Any]) -> tuple[bool, bool]:
    return result["success"], result["run_success"]


async def test_status_reports_an_empty_queue_and_every_worker(http: httpx.AsyncClient) -> None:
    # The stack is ready with its first worker; the others may still be starting their jails.
    for _ in range(600):
        response = await http.get("/status")
        assert response.status_code == 200
        if response.json()["num_workers"] == WORKERS:
            break
        await asyncio.sleep(0.1)
    assert response.json() == {"queue": 0, "num_workers": WORKERS}


@pytest.mark.parametrize("route", ROUTES)
async def test_a_correct_answer_read_from_stdin(http: httpx.AsyncClient, route: str) -> None:
    result = await post_ok(http, f"/{route}", python(ECHO, "a", "a"))
    assert verdict(result) == (True, True) and result["reason"] == ""
    assert list(result) == (RUN_FIELDS if route == "run" else JUDGE_FIELDS)
    if route == "run":
        assert (result["stdout"], result["stderr"]) == ("a\n", "")


@pytest.mark.parametrize("route", ROUTES)
async def test_a_wrong_answer_ran_fine(http: httpx.AsyncClient, route: str) -> None:
    result = await post_ok(http, f"/{route}", python(ECHO, "a", "b"))
    assert verdict(result) == (False, True) and result["reason"] == ""


@pytest.mark.parametrize("route", ROUTES)
async def test_missing_input_is_a_failed_run(http: httpx.AsyncClient, route: str) -> None:
    result = await post_ok(http, f"/{route}", python(ECHO, "", "a"))
    assert verdict(result) == (False, False) and result["reason"] == ""
    if route == "run":
        assert "EOFError" in result["stderr"]


async def test_timeouts_under_the_default_limit(http: httpx.AsyncClient) -> None:
    """sleep(10) under code-judge's 10 s default, and a child left running (its parent waits
    for it at exit): each is a worker_timeout, and /run's stdout says so as code-judge's does."""
    cases = [(route, code) for route in ROUTES for code in (SLEEP_10, LEFT_CHILD)]
    results = await asyncio.gather(
        *(post_ok(http, f"/{route}", python(code, "a", "a")) for route, code in cases)
    )
    for (route, code), result in zip(cases, results, strict=True):
        assert verdict(result) == (False, False), (route, code, result)
        assert result["reason"] == "worker_timeout", result
        assert result["cost"] >= 10
        if route == "run" and code == SLEEP_10:
            assert result["stdout"].strip() == "Suicide from timeout."
        if route == "run" and code == LEFT_CHILD:
            assert "parent done" in result["stdout"]
            assert result["stdout"].endswith("Suicide from timeout.\n")


@pytest.mark.parametrize("route", ROUTES)
async def test_a_file_written_in_the_working_directory(http: httpx.AsyncClient, route: str) -> None:
    code = "with open('test.txt', 'w') as f:\n    f.write('Hello, world!')\n"
    result = await post_ok(http, f"/{route}", python(code, "", ""))
    assert verdict(result) == (True, True)


@pytest.mark.parametrize("route", ROUTES)
async def test_a_file_written_above_the_working_directory_stays_in_the_jail(
    http: httpx.AsyncClient, route: str
) -> None:
    # code-judge's "jailbreak" case only prints whether it escaped; here it must not.
    code = (
        "import pathlib\nprint(pathlib.Path('.').resolve())\n"
        "with open('../test.txt', 'w') as f:\n    f.write('Hello, world!')\n"
    )
    result = await post_ok(http, f"/{route}", python(code, "", ""))
    assert verdict(result) == (False, False)
    if route == "run":
        assert result["stdout"] == "/home/sandbox\n"
        assert "Error" in result["stderr"]  # PermissionError or read-only file system


CPP_A = '#include <cstdio>\nint main(){printf("a");return 0;}\n'
CPP_SLEEP_3 = '#include <cstdio>\n#include <unistd.h>\nint main(){sleep(3);printf("a");return 0;}\n'


def cpp(solution: str, expected: str) -> dict[str, Any]:
    return {"type": "cpp", "solution": solution, "expected_output": expected}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("solution", "expected", "outcome"),
    [
        (CPP_SLEEP_3, "a", (True, True)),
        (CPP_A, "b", (False, True)),
        ('#include <cstdio>\nint main(){printf("a")xx;return 0;}\n', "b", (False, False)),
    ],
    ids=["cpp", "cpp-fail", "cpp-compile-error"],
)
async def test_cpp(
    http: httpx.AsyncClient, route: str, solution: str, expected: str, outcome: tuple[bool, bool]
) -> None:
    result = await post_ok(http, f"/{route}", cpp(solution, expected))
    assert verdict(result) == outcome


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("batch", ["batch", "long-batch"])
async def test_a_mixed_batch_in_order(http: httpx.AsyncClient, route: str, batch: str) -> None:
    submissions = [
        cpp(CPP_A, "b"),
        python(ECHO, "a", "b"),
        python(ECHO, "a", "a"),
        cpp(CPP_SLEEP_3, "a"),
    ]
    body = {"type": "batch", "submissions": submissions}
    answer = await post_ok(http, f"/{route}/{batch}", body)
    results = answer["results"]
    assert len(results) == 4 and len({r["sub_id"] for r in results}) == 4
    assert [verdict(r) for r in results] == [
        (False, True),
        (False, True),
        (True, True),
        (True, True),
    ]
    assert all(list(r) == (RUN_FIELDS if route == "run" else JUDGE_FIELDS) for r in results)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("batch", ["batch", "long-batch"])
async def test_a_batch_of_alternating_failures(
    http: httpx.AsyncClient, route: str, batch: str
) -> None:
    submissions = [python(ECHO, "", "b"), python(ECHO, "a", "a")] * 3
    answer = await post_ok(http, f"/{route}/{batch}", {"type": "batch", "submissions": submissions})
    assert [verdict(r) for r in answer["results"]] == [(False, False), (True, True)] * 3


async def test_math_and_a_malformed_body(http: httpx.AsyncClient) -> None:
    math = await post_ok(http, "/judge", {"type": "math", "solution": "1+1"})
    assert (math["run_success"], math["reason"]) == (False, "internal_error")
    malformed = await http.post("/judge", json={"type": "ruby", "solution": "x"})
    assert malformed.status_code == 422
    assert malformed.json()["detail"][0]["loc"] == ["body", "type"]
    empty = await http.post("/judge/batch", json={"type": "batch", "submissions": []})
    assert empty.status_code == 422
