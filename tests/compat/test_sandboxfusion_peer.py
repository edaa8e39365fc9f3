"""SandboxFusion's own test cases (sandbox/tests/runners: test_python.py, test_jupyter.py,
test_isolation.py but for external network access, which the jail refuses by design), as our
requests against the real service, checked on the fields its tests check."""

from __future__ import annotations

import asyncio
import base64
import random
import struct
from typing import Any

import httpx
import pytest

from tests.compat.conftest import post_ok

SERVE_AND_FETCH = """
import http.server, socketserver, threading, time
import requests

class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header('Content-type', 'text/html')
        self.end_headers()
        self.wfile.write(b'a special string from myself')

def serve():
    with socketserver.TCPServer(('', {port}), Handler) as server:
        server.serve_forever()

threading.Thread(target=serve, daemon=True).start()
time.sleep({wait_s})
reply = requests.get('http://{host}:{port}')
print('Test Passed' if reply.status_code == 200 and 'special string' in reply.text else 'Failed')
"""


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(data: str) -> str:
    return base64.b64decode(data).decode()


async def run_code(http: httpx.AsyncClient, code: str, **fields: Any) -> Any:
    return await post_ok(http, "/run_code", {"language": "python", "code": code, **fields})


async def test_print(http: httpx.AsyncClient) -> None:
    result = await run_code(http, "print(123)", run_timeout=5)
    assert result["status"] == "Success" and result["run_result"]["stdout"].strip() == "123"


async def test_timeout(http: httpx.AsyncClient) -> None:
    result = await run_code(http, "import time; time.sleep(0.2)", run_timeout=0.1)
    assert result["status"] == "Failed"
    assert result["run_result"]["status"] == "TimeLimitExceeded"
    assert result["run_result"]["return_code"] is None


@pytest.mark.parametrize(
    ("code", "expected"),
    [("assert 1 == 2", "AssertionError"), ("int a = 1", "SyntaxError: invalid syntax")],
)
async def test_failures_finish_with_their_error(
    http: httpx.AsyncClient, code: str, expected: str
) -> None:
    result = await run_code(http, code, run_timeout=5)
    assert result["status"] == "Failed" and result["run_result"]["status"] == "Finished"
    assert expected in result["run_result"]["stderr"]
    assert result["run_result"]["return_code"] == 1


async def test_an_input_file_in_nested_directories(http: httpx.AsyncClient) -> None:
    files = {"dir1/dir2/dir3/secret_flag": b64('"hello, this is a test"')}
    code = 'print(open("dir1/dir2/dir3/secret_flag").read())'
    result = await run_code(http, code, run_timeout=5, files=files)
    assert result["status"] == "Success" and result["run_result"]["status"] == "Finished"
    assert "hello, this is a test" in result["run_result"]["stdout"]


async def test_stdin(http: httpx.AsyncClient) -> None:
    result = await run_code(http, "print(int(input()))", run_timeout=5, stdin="65535")
    assert result["status"] == "Success" and result["run_result"]["stdout"] == "65535\n"


async def test_fetch_files_relative_and_absolute(http: httpx.AsyncClient) -> None:
    code = 'open("a.txt", "w").write("secret"); open("/mnt/b", "w").write("sauce");'
    result = await run_code(http, code, run_timeout=5, fetch_files=["a.txt", "/mnt/b"])
    assert result["status"] == "Success" and result["run_result"]["status"] == "Finished"
    assert unb64(result["files"]["a.txt"]) == "secret"
    assert unb64(result["files"]["/mnt/b"]) == "sauce"


async def test_absolute_input_files_land_in_the_jails_directories(http: httpx.AsyncClient) -> None:
    files = {"/tmp/in/t": b64("tmp"), "/mnt/m": b64("mnt"), "/home/sandbox/w": b64("wd")}
    code = "print(open('/tmp/in/t').read(), open('/mnt/m').read(), open('w').read())"
    result = await run_code(http, code, files=files, fetch_files=["/home/sandbox/w"])
    assert result["run_result"]["stdout"] == "tmp mnt wd\n", result
    assert unb64(result["files"]["/home/sandbox/w"]) == "wd"
    outside = await http.post(
        "/run_code", json={"language": "python", "code": "1", "files": {"/etc/x": b64("x")}}
    )
    assert outside.status_code == 422 and "outside the jail" in outside.text
    escape = await http.post(
        "/run_code", json={"language": "python", "code": "1", "fetch_files": ["/tmp/../etc/passwd"]}
    )
    assert escape.status_code == 422


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_program_serves_and_fetches_from_itself(http: httpx.AsyncClient, host: str) -> None:
    code = SERVE_AND_FETCH.format(port=random.randint(30000, 60000), wait_s=1, host=host)
    result = await run_code(http, code, run_timeout=5)
    assert result["status"] == "Success", result
    assert "Test Passed" in result["run_result"]["stdout"]


async def test_two_programs_serve_on_the_same_port_at_once(http: httpx.AsyncClient) -> None:
    code = SERVE_AND_FETCH.format(port=random.randint(30000, 60000), wait_s=2, host="127.0.0.1")
    results = await asyncio.gather(*(run_code(http, code, run_timeout=6) for _ in range(2)))
    for result in results:
        assert result["status"] == "Success", result
        assert "Test Passed" in result["run_result"]["stdout"]


async def test_external_network_access_is_refused(http: httpx.AsyncClient) -> None:
    # SandboxFusion's test expects this to succeed; the jail has no route out, on purpose.
    code = "import requests\nrequests.get('https://www.sina.com.cn', timeout=5)"
    result = await run_code(http, code, run_timeout=20)
    assert result["status"] == "Failed"
    assert "ConnectionError" in result["run_result"]["stderr"]


# --- /run_jupyter ---


async def jupyter(http: httpx.AsyncClient, cells: list[str], **fields: Any) -> Any:
    return await post_ok(http, "/run_jupyter", {"cells": cells, **fields})


async def test_jupyter_print(http: httpx.AsyncClient) -> None:
    result = await jupyter(http, ["print(123)"])
    assert result["status"] == "Success" and result["message"] == ""
    assert list(result) == ["status", "message", "driver", "cells", "executor_pod_name", "files"]
    assert result["cells"] == [{"stdout": "123\n", "stderr": "", "display": [], "error": []}]
    assert result["driver"]["status"] == "Finished" and result["driver"]["return_code"] == 0


async def test_jupyter_state_and_the_value_of_a_cell(http: httpx.AsyncClient) -> None:
    result = await jupyter(http, ['a = "hello"', "a", "print(a)"])
    first, second, third = result["cells"]
    assert first["stdout"] == "" and first["display"] == []
    assert second["display"][0]["text/plain"] == "'hello'" and second["stdout"] == ""
    assert third["stdout"] == "hello\n"


async def test_jupyter_stderr_an_error_and_the_cells_after_it(http: httpx.AsyncClient) -> None:
    cells = [
        'a = "hello"',
        'import sys\nsys.stderr.write("This is an error message\\n")',
        "assert False",
        "print(a)",
    ]
    result = await jupyter(http, cells)
    assert result["status"] == "Success"
    cells_out = result["cells"]
    assert cells_out[0]["stdout"] == ""
    assert cells_out[1]["stderr"] == "This is an error message\n"
    assert cells_out[1]["display"] == [{"text/plain": "25"}]  # write()'s value, as in Jupyter
    [error] = cells_out[2]["error"]
    assert (error["ename"], error["evalue"]) == ("AssertionError", "")
    assert error["traceback"][0].startswith("Traceback") and cells_out[2]["stderr"] == ""
    # Only the cell's own frame: nothing of the interpreter that ran it.
    assert [line for line in error["traceback"] if line.startswith("  File")] == [
        '  File "<cell>", line 1, in <module>\n'
    ]
    assert cells_out[3]["stdout"] == "hello\n"


def png_size(data: str) -> tuple[int, int]:
    raw = base64.b64decode(data, validate=True)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


async def test_jupyter_plot(http: httpx.AsyncClient) -> None:
    plot = """
x = [1, 2, 3, 4, 5]
y = [2, 3, 5, 7, 11]

plt.plot(x, y)

plt.title('Simple Plot')
plt.xlabel('X-axis')
plt.ylabel('Y-axis')

plt.show()
    """
    result = await jupyter(http, ["import matplotlib.pyplot as plt", plot])
    assert result["status"] == "Success", result
    display = result["cells"][1]["display"]
    assert "image/png" in display[0]
    assert png_size(display[0]["image/png"]) == (640, 480)  # matplotlib's default figure
    assert result["cells"][1]["stderr"] == ""


async def test_jupyter_files_in_and_out(http: httpx.AsyncClient) -> None:
    cells = ["data = open('in.txt').read()", "open('/mnt/out.txt', 'w').write(data.upper())"]
    result = await jupyter(
        http, cells, files={"in.txt": b64("abc")}, fetch_files=["/mnt/out.txt", "missing"]
    )
    assert result["status"] == "Success"
    assert result["files"] == {"/mnt/out.txt": b64("ABC")}


async def test_jupyter_a_cell_over_its_time_limit(http: httpx.AsyncClient) -> None:
    result = await jupyter(http, ["x = 1", "import time; time.sleep(30)"], cell_timeout=1)
    assert result["status"] == "Failed" and result["cells"] == []
    assert result["driver"]["status"] == "TimeLimitExceeded"


async def test_jupyter_cells_over_the_total_time(http: httpx.AsyncClient) -> None:
    cells = ["import time; time.sleep(0.6)"] * 4
    result = await jupyter(http, cells, total_timeout=1.5)
    assert result["status"] == "Failed" and result["cells"] == []
    assert result["driver"]["status"] == "TimeLimitExceeded"


async def test_jupyter_a_cell_that_ends_its_interpreter(http: httpx.AsyncClient) -> None:
    result = await jupyter(http, ["import os", "os._exit(7)", "print('never')"])
    assert result["status"] == "Failed" and result["cells"] == []
    assert result["driver"]["return_code"] == 7


async def test_jupyter_sessions_end_with_their_request(
    http: httpx.AsyncClient, compat_stack: Any, compat_redis: Any
) -> None:
    import redis

    await jupyter(http, ["x = 1", "x"])
    client = redis.Redis.from_url(compat_redis.url)
    try:
        left = [k for k in client.scan_iter(match=f"{compat_stack.queue}:*run-jupyter-*")]
    finally:
        client.close()
    assert left == []
    fresh = await jupyter(http, ["'x' in dir()"])
    assert fresh["cells"][0]["display"] == [{"text/plain": "False"}]


async def test_jupyter_bad_requests_are_422(http: httpx.AsyncClient) -> None:
    for body in (
        {"cells": ["1"], "kernel": "python2"},
        {"cells": ["1"], "total_timeout": 0},
        {"cells": ["1"], "files": {"/etc/passwd": b64("x")}},
    ):
        response = await http.post("/run_jupyter", json=body)
        assert response.status_code == 422, (body, response.text)
