"""Hostile programs through the compose stack, with the worker's real container privileges.

Each test fails if the attack works, and then checks that the jail still answers the next call.
"""

from __future__ import annotations

import uuid

from tests.image import stack as podman_stack
from tests.image.stack import Stack
from tests.image.test_api import execute


def assert_still_serves(stack: Stack) -> None:
    result = execute(stack, "print('alive')")
    assert (result["status"], result["stdout"]) == ("ok", "alive\n"), result


def test_no_network_and_no_redis_from_the_jail(compose_stack: Stack) -> None:
    code = f"""
import os, socket
print(sorted(name for _, name in socket.if_nameindex()))
print('REDIS_URL' in os.environ, any(k.startswith('RL_SANDBOX') for k in os.environ))
for host in ({compose_stack.redis_address!r}, 'redis'):
    try:
        socket.create_connection((host, 6379), timeout=3).close()
        print('REACHED', host)
    except OSError as exc:
        print('refused', type(exc).__name__)
"""
    result = execute(compose_stack, code)
    assert result["status"] == "ok", result
    lines = str(result["stdout"]).splitlines()
    assert lines[0] == "['lo']", result
    assert lines[1] == "False False", result
    assert not any(line.startswith("REACHED") for line in lines), result
    assert len([line for line in lines if line.startswith("refused")]) == 2, result
    assert_still_serves(compose_stack)


def test_memory_limit_holds(compose_stack: Stack) -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 2**20))"
    result = execute(compose_stack, code, memory_mb=128, timeout=20)
    assert result["status"] == "memory_limit", result
    assert_still_serves(compose_stack)


def test_time_limit_holds(compose_stack: Stack) -> None:
    result = execute(compose_stack, "while True:\n    pass", timeout=1)
    assert result["status"] == "timeout", result
    assert float(str(result["wall_time"])) < 10, result
    assert_still_serves(compose_stack)


def test_process_limit_holds(compose_stack: Stack) -> None:
    code = """
import os, time
children = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as exc:
    print('stopped', type(exc).__name__, children)
"""
    result = execute(compose_stack, code, timeout=10)
    assert "stopped" in str(result["stdout"]), result
    assert_still_serves(compose_stack)


def test_nothing_is_left_behind_between_runs(compose_stack: Stack) -> None:
    token = uuid.uuid4().hex
    sleep_s = f"300.{uuid.uuid4().int % 10**6:06d}"
    plant = f"""
import os, subprocess
for path in ('/tmp/{token}', '/dev/shm/{token}', '{token}'):
    open(path, 'w').write('secret')
subprocess.Popen(['sleep', '{sleep_s}'], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    import time
    time.sleep(400)
"""
    check = f"""
import glob, os
found = [p for p in ('/tmp/{token}', '/dev/shm/{token}', '{token}') if os.path.exists(p)]
others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]
print(found, len(others))
"""
    planted = [execute(compose_stack, plant) for _ in range(4)]
    assert all(r["status"] == "ok" for r in planted), planted
    # Enough runs to pass through every slot of the stack's worker.
    for _ in range(8):
        result = execute(compose_stack, check)
        assert result["status"] == "ok", result
        found, others = str(result["stdout"]).rsplit(" ", 1)
        assert found == "[]", result
        assert int(others) <= 1, result  # the jail's init at most; never the planted sleepers
    for worker in podman_stack.containers("worker"):
        assert sleep_s not in podman_stack.podman("top", worker, "args"), worker
