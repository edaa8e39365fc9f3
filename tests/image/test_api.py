"""The API contract through the compose stack: the images as users run them, not the checkout."""

from __future__ import annotations

import uuid

import httpx

from tests.image import stack as podman_stack
from tests.image.stack import Stack


def execute(stack: Stack, code: str, **body: object) -> dict[str, object]:
    """POST /execute; the result (a 200 is asserted)."""
    reply = httpx.post(f"{stack.url}/execute", json={"code": code, **body}, timeout=90.0)
    assert reply.status_code == 200, reply.text
    result: dict[str, object] = reply.json()
    return result


def test_operational_endpoints_answer(compose_stack: Stack) -> None:
    assert httpx.get(f"{compose_stack.url}/healthz", timeout=5).status_code == 200
    assert httpx.get(f"{compose_stack.url}/readyz", timeout=5).status_code == 200
    metrics = httpx.get(f"{compose_stack.url}/metrics", timeout=5).text
    assert "rl_sandbox_workers_alive" in metrics
    assert httpx.get(f"{compose_stack.url}/openapi.json", timeout=5).json()["paths"]["/execute"]


def test_every_container_passes_its_healthcheck(compose_stack: Stack) -> None:
    # podman runs healthchecks from systemd timers; without systemd, on demand is what there is.
    names = podman_stack.containers()
    assert len(names) == 3, names
    for name in names:
        podman_stack.podman("healthcheck", "run", name)  # exits 1 when unhealthy


def test_execute_returns_the_contract_fields(compose_stack: Stack) -> None:
    result = execute(compose_stack, "import sys\nprint(6 * 7)\nprint('e', file=sys.stderr)")
    assert (result["status"], result["exit_code"], result["signal"]) == ("ok", 0, None)
    assert (result["stdout"], result["stderr"]) == ("42\n", "e\n")
    for field in ("id", "wall_time", "cpu_time", "queue_time", "files", "display"):
        assert field in result, field
    failed = execute(compose_stack, "raise SystemExit(3)")
    assert (failed["status"], failed["exit_code"]) == ("error", 3)


def test_invalid_requests_are_422(compose_stack: Stack) -> None:
    for body in ({"code": "1", "timeout": 0}, {"code": "1", "language": "cobol"}, {}):
        reply = httpx.post(f"{compose_stack.url}/execute", json=body, timeout=10)
        assert reply.status_code == 422, (body, reply.text)


def test_sympy_through_the_compose_network(compose_stack: Stack) -> None:
    code = "import sympy\nx = sympy.Symbol('x')\nprint(sorted(sympy.solve(x**2 - 4, x)))"
    result = execute(compose_stack, code)
    assert (result["status"], result["stdout"]) == ("ok", "[-2, 2]\n"), result


def test_stdin_and_files_round_trip(compose_stack: Stack) -> None:
    code = "import sys\ntext = sys.stdin.read().upper() + open('in.txt').read()\n"
    code += "open('out.txt', 'w').write(text)"
    result = execute(
        compose_stack, code, stdin="abc", files={"in.txt": "ZGVm"}, fetch_files=["out.txt"]
    )
    assert result["status"] == "ok", result
    assert result["files"] == {"out.txt": "QUJDZGVm"}


def test_a_session_keeps_state_between_cells(compose_stack: Stack) -> None:
    sid = f"imagetest-{uuid.uuid4().hex[:12]}"
    assert execute(compose_stack, "x = 40", session_id=sid)["status"] == "ok"
    assert execute(compose_stack, "x + 2", session_id=sid)["stdout"] == "42\n"
    deleted = httpx.delete(f"{compose_stack.url}/sessions/{sid}", timeout=30)
    assert deleted.status_code in (200, 204), deleted.text
    after = execute(compose_stack, "print('x' in globals())", session_id=sid)
    assert after["stdout"] == "False\n", after


def test_a_batch_runs_every_item_in_order(compose_stack: Stack) -> None:
    requests = [{"code": f"print({i} ** 2)"} for i in range(24)]
    reply = httpx.post(
        f"{compose_stack.url}/execute/batch", json={"requests": requests}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [(r["status"], r["stdout"]) for r in results] == [("ok", f"{i**2}\n") for i in range(24)]
