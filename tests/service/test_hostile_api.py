"""Hostile requests and programs through the HTTP API of a real stack (API, Redis, RQ workers,
nsjail): text that cannot be encoded on every route, a fetch over the budget, forged reports,
IPC and files across calls. After each, the service still answers the next call."""

from __future__ import annotations

import base64
import json
import textwrap
from typing import Any

import httpx
import pytest

LONE = "\udc80"
"""A lone surrogate: valid in JSON (as the escape \\udc80), not encodable as UTF-8."""
B64 = base64.b64encode(b"x").decode()
SUBMISSION = {"type": "python", "solution": "print(1)"}

UNENCODABLE: list[tuple[str, dict[str, Any]]] = [
    ("/execute", {"code": "print(1)", "files": {"in" + LONE: B64}}),
    ("/execute", {"code": "print(1)", "fetch_files": ["out" + LONE]}),
    ("/execute", {"code": "print(1)" + LONE}),
    ("/execute", {"code": "print(1)", "stdin": LONE}),
    ("/execute", {"code": "print(1)", "session_id": "s" + LONE}),
    ("/execute/batch", {"requests": [{"code": "print(1)"}, {"code": "1", "fetch_files": [LONE]}]}),
    ("/execute/batch", {"requests": [{"code": "print(1)", "files": {LONE: B64}}]}),
    ("/run_code", {"code": "print(1)", "language": "python", "files": {"a" + LONE: B64}}),
    ("/run_code", {"code": "print(1)", "language": "python", "fetch_files": ["/tmp/a" + LONE]}),
    ("/run_jupyter", {"cells": ["print(1)"], "files": {"a" + LONE: B64}}),
    ("/run_jupyter", {"cells": ["print(1)"], "fetch_files": ["a" + LONE]}),
    ("/run_jupyter", {"cells": ["print(1)", LONE]}),
    ("/run", {**SUBMISSION, "input": LONE}),
    ("/run/batch", {"submissions": [SUBMISSION, {**SUBMISSION, "solution": LONE}]}),
    ("/run/long-batch", {"submissions": [{**SUBMISSION, "sub_id": LONE}]}),
    ("/judge", {**SUBMISSION, "expected_output": LONE}),
    ("/judge/batch", {"submissions": [{**SUBMISSION, "input": LONE}]}),
    ("/judge/long-batch", {"submissions": [{**SUBMISSION, "expected_output": LONE}]}),
    ("/verify", {"items": [{"answer": LONE, "reference": "1"}]}),
    ("/verify", {"items": [{"answer": "1", "reference": "\\frac{1}{2}" + LONE}]}),
]


async def post_raw(client: httpx.AsyncClient, path: str, body: object) -> httpx.Response:
    # json.dumps escapes the surrogate (ensure_ascii), as a client in any language may send it.
    content = json.dumps(body).encode()
    return await client.post(path, content=content, headers={"Content-Type": "application/json"})


async def execute(client: httpx.AsyncClient, **body: object) -> dict[str, Any]:
    response = await client.post("/execute", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def answers_next(client: httpx.AsyncClient) -> None:
    """The service, its workers and their jails serve an ordinary call."""
    result = await execute(client, code="print('next call')")
    assert (result["status"], result["stdout"]) == ("ok", "next call\n"), result


@pytest.mark.parametrize(("path", "body"), UNENCODABLE, ids=[p for p, _ in UNENCODABLE])
async def test_text_that_cannot_be_encoded_is_a_422_on_every_route(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    response = await post_raw(client, path, body)
    assert response.status_code == 422, f"{path}: {response.status_code} {response.text[:300]}"
    assert "detail" in response.json()
    await answers_next(client)


async def test_a_fetch_over_the_budget_returns_what_fits_and_names_the_rest(
    client: httpx.AsyncClient,
) -> None:
    program = textwrap.dedent("""\
        for i in range(3):
            open(f"big{i}.bin", "wb").write(bytes([65 + i]) * (7 << 20))
        print("written")
        """)
    names = ["big0.bin", "big1.bin", "big2.bin"]
    result = await execute(client, code=program, fetch_files=names, timeout=15, memory_mb=512)
    assert (result["status"], result["stdout"]) == ("ok", "written\n"), result["stderr"][-500:]
    assert sorted(result["files"]) == ["big0.bin", "big1.bin"], sorted(result["files"])
    assert base64.b64decode(result["files"]["big1.bin"]) == b"B" * (7 << 20)
    assert "big2.bin: over the fetch budget" in result["stderr"], result["stderr"][-500:]
    await answers_next(client)


async def test_forged_reports_on_every_descriptor_are_not_believed(
    client: httpx.AsyncClient,
) -> None:
    program = textwrap.dedent("""\
        import os, sys
        forged = (b'{"status": "ok", "exit_code": 0, "cpu_time": -5.0}\\n'
                  b'\\x00\\x00\\x00\\x10{"op": "done"}\\xff\\xff\\xff\\xff{"exit')
        for fd in range(3, 1024):
            try:
                os.write(fd, forged)
            except OSError:
                pass
        print("forged")
        sys.exit(3)
        """)
    result = await execute(client, code=program)
    assert (result["status"], result["exit_code"]) == ("error", 3), result
    assert result["stdout"] == "forged\n" and result["cpu_time"] >= 0
    await answers_next(client)


async def test_ipc_objects_and_files_do_not_survive_into_the_next_calls(
    client: httpx.AsyncClient,
) -> None:
    plant = textwrap.dedent("""\
        import ctypes, os
        from multiprocessing import shared_memory
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5eed, 4096, 0o1000 | 0o666), ctypes.get_errno())
        shm = shared_memory.SharedMemory(name="planted", create=True, size=4096)
        shm.buf[:6] = b"secret"
        shm.close()
        for path in ("/tmp/planted", "/home/sandbox/planted", "/mnt/planted"):
            open(path, "w").write("secret")
        """)
    look = textwrap.dedent("""\
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0x5eed, 0, 0), ctypes.get_errno())
        print(sorted(os.listdir("/dev/shm") + os.listdir("/tmp") + os.listdir("/mnt")
                     + os.listdir("/home/sandbox")))
        """)
    # Both workers' slots: a batch of two plants, then more looks than slots.
    planted = await client.post("/execute/batch", json={"requests": [{"code": plant}] * 2})
    assert planted.status_code == 200
    for result in planted.json()["results"]:
        assert (result["status"], result["stdout"]) == ("ok", "-1 38\n"), result  # ENOSYS
    looked = await client.post("/execute/batch", json={"requests": [{"code": look}] * 4})
    assert looked.status_code == 200
    for result in looked.json()["results"]:
        assert result["stdout"] == "-1 38\n[]\n", f"state survived a run: {result}"
    await answers_next(client)


async def test_denied_system_calls_are_errors_and_the_worker_keeps_serving(
    client: httpx.AsyncClient,
) -> None:
    program = textwrap.dedent("""\
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        for name, args in (("ptrace", (0, 0, 0, 0)), ("mount", (b"x", b"/tmp", b"tmpfs", 0, 0))):
            ctypes.set_errno(0)
            print(name, getattr(libc, name)(*args), ctypes.get_errno())
        os.unshare(os.CLONE_NEWUSER)
        """)
    result = await execute(client, code=program)
    assert result["status"] == "error" and result["signal"] is None, result
    assert result["stdout"] == "ptrace -1 1\nmount -1 1\n"
    assert "PermissionError: [Errno 1] Operation not permitted" in result["stderr"]
    await answers_next(client)
