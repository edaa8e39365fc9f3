"""The HTTP API against the real service: every field, status and error of the spec."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal

import httpx
import pytest

from tests.service.stack import Stack

RESULT_FIELDS = {
    "id", "status", "exit_code", "signal", "stdout", "stderr", "stdout_truncated",
    "stderr_truncated", "stdout_bytes", "stderr_bytes", "wall_time", "cpu_time",
    "peak_memory_mb", "queue_time", "files",
    "restored", "display", "error", "compile",
}  # fmt: skip


def metric(text: str, name: str) -> float:
    """The value of one sample (name with labels, exactly as exposed) in Prometheus text."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def execute(client: httpx.AsyncClient, **body: object) -> dict[str, object]:
    response = await client.post("/execute", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


async def test_print_returns_every_field(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/execute", json={"code": "print(1)"}, headers={"X-Request-ID": "trace-me-1"}
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-me-1"
    result = response.json()
    assert set(result) == RESULT_FIELDS
    assert result["status"] == "ok"
    assert (result["exit_code"], result["signal"]) == (0, None)
    assert (result["stdout"], result["stderr"]) == ("1\n", "")
    assert result["stdout_truncated"] is result["stderr_truncated"] is False
    assert result["wall_time"] > 0 and result["cpu_time"] >= 0 and result["queue_time"] >= 0
    assert result["peak_memory_mb"] is None or result["peak_memory_mb"] > 0
    assert result["files"] == {} and result["restored"] is False
    assert result["compile"] is None  # Python compiles nothing
    assert (result["display"], result["error"]) == ([], None)
    again = await execute(client, code="print(1)")
    assert again["id"] != result["id"]


async def test_request_id_is_generated_when_absent(client: httpx.AsyncClient) -> None:
    response = await client.post("/execute", json={"code": "pass"})
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])


@pytest.mark.parametrize(
    ("body", "status", "exit_code", "sig", "stderr_part"),
    [
        ({"code": "import sys; sys.exit(3)"}, "error", 3, None, ""),
        ({"code": "raise ValueError('boom')"}, "error", 1, None, "ValueError: boom"),
        ({"code": "def f(:\n  pass"}, "error", 1, None, "SyntaxError"),
        ({"code": "while True: pass", "timeout": 1}, "timeout", None, None, ""),
        ({"code": "import time; time.sleep(30)", "timeout": 0.5}, "timeout", None, None, ""),
        ({"code": "x = bytearray(2 * 1024**3)", "memory_mb": 200}, "memory_limit", None, None, ""),
        # A MemoryError that ended the program (an allocation refused at once) is the limit's
        # (API.md); one merely printed far below the limit is the program's error.
        (
            {"code": "import numpy as np; a = np.ones((10**6, 10**6))"},
            "memory_limit", 1, None, "MemoryError",
        ),
        ({"code": "import sys; sys.exit('MemoryError')"}, "error", 1, None, "MemoryError"),
        ({"code": "import os; os.kill(os.getpid(), 9)"}, "killed", None, signal.SIGKILL, ""),
        # A SIGXCPU the program sends itself is not its CPU limit.
        ({"code": "import os; os.kill(os.getpid(), 24)"}, "killed", None, signal.SIGXCPU, ""),
        (
            {"code": "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     "if libc.ptrace(0, 0, 0, 0) == -1:\n"
                     "    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))"},
            "error", 1, None, "PermissionError: [Errno 1] Operation not permitted",
        ),
        ({"code": "import ctypes\nctypes.string_at(0)"}, "killed", None, signal.SIGSEGV, ""),
    ],
    ids=[
        "exit-3", "exception", "syntax-error", "cpu-spin", "sleep", "memory-bomb",
        "memory-error", "printed-memory-error", "kill-self", "self-sigxcpu", "ptrace", "segfault",
    ],
)  # fmt: skip
async def test_program_outcomes_are_200_with_a_status(
    client: httpx.AsyncClient,
    body: dict[str, object],
    status: str,
    exit_code: int | None,
    sig: int | None,
    stderr_part: str,
) -> None:
    result = await execute(client, **body)
    assert result["status"] == status, result
    assert result["exit_code"] == exit_code
    if sig is not None:
        assert result["signal"] == sig
    assert stderr_part in str(result["stderr"])


@pytest.mark.parametrize(
    "code",
    [
        # fork bomb, output floods, daemon, killing everyone: the service stays healthy after each
        "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
        "while True: print('a line of output')",
        "import sys\nwhile True: sys.stdout.write('y' * 65536)",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('bye')",
        "import os, signal\ntry: os.kill(-1, signal.SIGKILL)\nexcept OSError: pass",
    ],
    ids=["fork-bomb", "line-flood", "write-flood", "daemon", "kill-all"],
)
async def test_hostile_programs_leave_the_service_healthy(
    client: httpx.AsyncClient, code: str
) -> None:
    result = await execute(client, code=code, timeout=2)
    assert result["status"] in ("ok", "error", "timeout", "killed"), result
    after = await execute(client, code="print('still healthy')")
    assert (after["status"], after["stdout"]) == ("ok", "still healthy\n")


async def test_stdin_is_fed(client: httpx.AsyncClient) -> None:
    result = await execute(
        client, code="import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="1 2\n3"
    )
    assert result["stdout"] == "6\n"


async def test_output_is_capped_and_flagged_per_stream(client: httpx.AsyncClient) -> None:
    result = await execute(
        client, code="import sys\nprint('x' * 10000)\nsys.stderr.write('e' * 10)"
    )
    assert result["status"] == "ok"
    assert result["stdout_truncated"] is True and len(str(result["stdout"])) == 4096
    assert result["stderr_truncated"] is False and result["stderr"] == "e" * 10


async def test_files_in_and_out(client: httpx.AsyncClient) -> None:
    result = await execute(
        client,
        code="data = open('in/data.txt').read()\nopen('out.txt', 'w').write(data.upper())",
        files={"in/data.txt": base64.b64encode(b"hello").decode()},
        fetch_files=["out.txt", "missing.txt"],
    )
    assert result["status"] == "ok", result
    assert result["files"] == {"out.txt": base64.b64encode(b"HELLO").decode()}


async def test_batch_results_come_back_in_request_order(client: httpx.AsyncClient) -> None:
    # Earlier items sleep longer, so they finish last; the order must still be the request's.
    requests = [
        {"code": f"import time; time.sleep({(7 - i) * 0.05}); print({i})"} for i in range(8)
    ]
    response = await client.post("/execute/batch", json={"requests": requests})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["stdout"] for r in results] == [f"{i}\n" for i in range(8)]
    assert len({r["id"] for r in results}) == 8


async def test_batch_mixes_outcomes(client: httpx.AsyncClient) -> None:
    requests = [
        {"code": "print('a')"},
        {"code": "import sys; sys.exit(2)"},
        {"code": "while True: pass", "timeout": 0.5},
    ]
    response = await client.post("/execute/batch", json={"requests": requests})
    statuses = [r["status"] for r in response.json()["results"]]
    assert statuses == ["ok", "error", "timeout"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, ["body", "code"]),
        ({"code": "1", "bogus": 1}, ["body", "bogus"]),
        ({"code": "1", "Timeout": 3}, ["body", "Timeout"]),
        ({"code": "1", "language": "ruby"}, ["body", "language"]),
        ({"code": "1", "timeout": 0}, ["body", "timeout"]),
        ({"code": "1", "timeout": 21}, ["body", "timeout"]),
        ({"code": "1", "memory_mb": 8}, ["body", "memory_mb"]),
        ({"code": "1", "memory_mb": 4096}, ["body", "memory_mb"]),
        ({"code": "x" * 4097}, ["body", "code"]),
        ({"code": "1", "files": {"../x": b64(b"hi")}}, ["body", "files"]),
        ({"code": "1", "files": {"/abs": b64(b"hi")}}, ["body", "files"]),
        ({"code": "1", "files": {"a.txt": "not base64!"}}, ["body", "files"]),
        ({"code": "1", "files": {"big": b64(b"x" * 5000)}}, ["body", "files"]),
        ({"code": "1", "fetch_files": ["../etc/passwd"]}, ["body", "fetch_files"]),
        ({"code": "1", "session_id": ""}, ["body", "session_id"]),
        ({"code": "1", "session_id": "s" * 257}, ["body", "session_id"]),
    ],
)
async def test_invalid_requests_get_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, object], loc: list[object]
) -> None:
    response = await client.post("/execute", json=body)
    assert response.status_code == 422, response.text
    locs = [error["loc"] for error in response.json()["detail"]]
    assert loc in locs, locs
    if loc[-1] == "language":
        assert "python" in response.text


async def test_invalid_batch_item_names_its_index_and_nothing_runs(
    client: httpx.AsyncClient,
) -> None:
    before = metric(
        (await client.get("/metrics")).text,
        'rl_sandbox_executions_total{status="ok"}',
    )
    requests = [{"code": "print(1)"}, {"code": "print(2)"}, {"code": "1", "timeout": 99}]
    response = await client.post("/execute/batch", json={"requests": requests})
    assert response.status_code == 422
    assert [e["loc"] for e in response.json()["detail"]] == [["body", "requests", 2, "timeout"]]
    response = await client.post("/execute/batch", json={"requests": [{"code": "1"}, {"cod": 1}]})
    assert response.status_code == 422
    assert ["body", "requests", 1, "code"] in [e["loc"] for e in response.json()["detail"]]
    after = metric(
        (await client.get("/metrics")).text,
        'rl_sandbox_executions_total{status="ok"}',
    )
    assert after == before


@pytest.mark.parametrize("count", [0, 9])
async def test_batch_size_is_bounded(client: httpx.AsyncClient, count: int) -> None:
    response = await client.post("/execute/batch", json={"requests": [{"code": "1"}] * count})
    assert response.status_code == 422
    assert ["body", "requests"] in [e["loc"] for e in response.json()["detail"]]


async def test_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/execute", json={"code": "#" + "x" * (2 * 1024 * 1024)})
    assert response.status_code == 413
    assert "body" in response.json()["detail"]


async def test_malformed_json_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/execute", content=b'{"code": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 422


async def test_operations_endpoints(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    docs = await client.get("/docs")
    assert docs.status_code == 200 and "http" not in docs.text.split("<body>")[0], docs.text
    for page, asset in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
        html = (await client.get(page)).text
        assert "cdn." not in html and f"/docs/assets/{asset}" in html
        script = await client.get(f"/docs/assets/{asset}")
        assert script.status_code == 200 and len(script.content) > 100_000
    assert (await client.get("/docs/assets/swagger-ui.css")).status_code == 200
    schema = (await client.get("/openapi.json")).json()
    assert {"/execute", "/execute/batch", "/healthz", "/readyz", "/metrics"} <= set(schema["paths"])


async def test_metrics_are_present_and_move(client: httpx.AsyncClient) -> None:
    before = (await client.get("/metrics")).text
    await asyncio.gather(*(execute(client, code="print(1)") for _ in range(3)))
    await execute(client, code="import sys; sys.exit(1)")
    after = (await client.get("/metrics")).text
    ok = 'rl_sandbox_executions_total{status="ok"}'
    assert metric(after, ok) >= metric(before, ok) + 3
    assert metric(after, 'rl_sandbox_executions_total{status="error"}') >= 1
    for name in ("rl_sandbox_queue_wait_seconds_count", "rl_sandbox_execution_wall_seconds_count"):
        assert metric(after, name) >= metric(before, name) + 4
    responses = 'rl_sandbox_http_responses_total{code="200",route="/execute"}'
    assert metric(after, responses) >= metric(before, responses) + 4
    assert metric(after, "rl_sandbox_workers_alive") == 2
    assert "rl_sandbox_queued_jobs " in after
    assert metric(after, "rl_sandbox_redis_up") == 1


async def test_request_id_reaches_the_worker_log(client: httpx.AsyncClient, stack: Stack) -> None:
    response = await client.post(
        "/execute", json={"code": "print(1)"}, headers={"X-Request-ID": "e2e-trace-42"}
    )
    execution_id = response.json()["id"]
    expected = {("api", "POST /execute 200"), ("worker", "job done")}
    for _ in range(100):  # the API logs its line just after the response has left
        text = stack.log_path.read_text()
        lines = [json.loads(line) for line in text.splitlines() if line.startswith('{"ts"')]
        mine = [line for line in lines if line.get("request_id") == "e2e-trace-42"]
        components = {(line["component"], line["msg"]) for line in mine}
        if expected <= components:
            break
        await asyncio.sleep(0.05)
    assert ("api", "POST /execute 200") in components
    assert ("worker", "job done") in components
    assert any(line.get("execution_id") == execution_id for line in mine)
