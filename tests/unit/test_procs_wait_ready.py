"""procs.wait_ready: the readiness wait every launcher of `rl-sandbox up` uses."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from sandbox_service.local.procs import NotReady, free_port, wait_ready


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_ready_service_returns(server: str) -> None:
    wait_ready(server, 10)


def test_a_path_answering_503_times_out(server: str) -> None:
    with pytest.raises(NotReady, match=r"/healthz did not answer 200 within 1 s"):
        wait_ready(server, 1, path="/healthz")


def test_a_process_that_exits_first_is_reported_with_its_status() -> None:
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    with pytest.raises(NotReady, match="exited with 3"):
        wait_ready(f"http://127.0.0.1:{free_port()}", 10, process)
