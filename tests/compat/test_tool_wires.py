"""Acceptance of the small tool wires against a running rl-sandbox, with each framework's own
request shapes (their packages are heavy: NeMo-Skills pulls its whole eval stack, open-instruct
vLLM), sent exactly as their clients send them:

- NeMo-Skills' LocalSandbox (nemo_skills/code_execution/sandbox.py): `POST /execute` with
  `generated_code`, `X-Session-ID` for `ipython`; `DELETE /sessions/{id}` with the header, which
  must answer 200 or 404; `GET /health`.
- open-instruct's PythonCodeTool (open_instruct/environments/tools/tools.py): `{"code",
  "timeout"}` to its `api_endpoint`, reading `output` and `error`.
- SkyRL's skyrl-agent and tinker-cookbook post SandboxFusion's `/run_code` body
  (`{"code", "language", "run_timeout", "files"}`) to the URL of `SANDBOX_FUSION_URL` /
  `SANDBOX_URL` and read `status == "Success"` and `run_result.stdout`; these two also run
  through their own code (tinker-cookbook 0.6.1's `sandbox_check_correctness`, skyrl 0.4.0's
  `_process_single_case`), installed without their heavy dependencies, which those paths never
  import.
"""

from __future__ import annotations

import json
import uuid

import httpx

from tests.compat.client_env import (
    SANDBOXFUSION_PEERS,
    SANDBOXFUSION_PEERS_NO_DEPS,
    client_python,
    run_driver,
)
from tests.service.stack import Stack

JSON = {"Content-Type": "application/json"}


def _nemo(url: str, code: str, session: str | None, language: str = "ipython") -> httpx.Response:
    # LocalSandbox._prepare_request and _send_request, field for field
    request = {
        "generated_code": code,
        "std_input": "",
        "timeout": 10.0,
        "language": language,
        "max_output_characters": 1000,
        "traceback_verbosity": "Plain",
    }
    headers = {**JSON, **({"X-Session-ID": session} if session else {})}
    return httpx.post(f"{url}/execute", content=json.dumps(request), headers=headers, timeout=60)


def test_nemo_skills_stateful_session(compat_stack: Stack) -> None:
    url = compat_stack.url
    assert httpx.get(f"{url}/health").status_code == 200  # wait_for_sandbox
    session = str(uuid.uuid4())
    first = _nemo(url, "x = 20", session).json()
    assert first == {
        "process_status": "completed",
        "stdout": "",
        "stderr": "",
        "new_session_created": False,
    }
    assert _nemo(url, "x * 2 + 2", session).json()["stdout"] == "42\n"
    failed = _nemo(url, "1/0", session).json()
    assert failed["process_status"] == "error" and "ZeroDivisionError" in failed["stderr"]
    assert _nemo(url, "print(x)", session).json()["stdout"] == "20\n"
    missing = _nemo(url, "1", None)
    assert missing.status_code == 400 and "X-Session-ID" in missing.json()["stderr"]
    # delete_session: 200 first, then 404, both with the header
    delete = f"{url}/sessions/{session}"
    assert httpx.delete(delete, headers={"X-Session-ID": session}).status_code == 200
    assert httpx.delete(delete, headers={"X-Session-ID": session}).status_code == 404
    assert _nemo(url, "x", session).json()["process_status"] == "error"  # a fresh session


def test_nemo_skills_stateless_and_native_untouched(compat_stack: Stack) -> None:
    url = compat_stack.url
    answer = _nemo(url, "import sys; print('out'); sys.exit(3)", None, "python").json()
    assert answer["process_status"] == "completed" and answer["stdout"] == "out\n"
    timed_out = httpx.post(
        f"{url}/execute",
        json={"generated_code": "while True: pass", "timeout": 1, "language": "python"},
    ).json()
    assert timed_out["process_status"] == "timeout"
    shell = _nemo(url, "ls", None, "shell")
    assert shell.status_code == 400 and shell.json()["process_status"] == "error"
    # our own /execute is unchanged, including a program that mentions the key
    native = httpx.post(f"{url}/execute", json={"code": "print('generated_code')"}).json()
    assert native["status"] == "ok" and native["stdout"] == "generated_code\n"


def test_open_instruct_python_tool(compat_stack: Stack) -> None:
    endpoint = f"{compat_stack.url}/open-instruct/execute"
    ok = httpx.post(endpoint, json={"code": "print(6 * 7)", "timeout": 3}, timeout=60).json()
    assert ok == {"output": "42\n", "error": None, "success": True}
    failed = httpx.post(endpoint, json={"code": "1/0", "timeout": 3}, timeout=60).json()
    assert failed["output"] == "" and failed["error"].endswith(
        "ZeroDivisionError: division by zero"
    )
    slow = httpx.post(endpoint, json={"code": "while True: pass", "timeout": 1}, timeout=60).json()
    assert "Timeout" in slow["error"] and slow["success"] is False
    assert httpx.post(endpoint, json={"timeout": 3}).status_code == 400


def test_skyrl_and_tinker_run_code(compat_stack: Stack) -> None:
    # tinker-cookbook sandboxfusion.py: SANDBOX_URL is the full /run_code URL
    tinker = httpx.post(
        f"{compat_stack.url}/run_code",
        json={
            "code": "print(open('input.txt').read().upper())",
            "language": "python",
            "run_timeout": 10,
            "files": {"input.txt": "aGVsbG8="},
        },
        timeout=60,
    ).json()
    assert tinker["status"] == "Success" and tinker["run_result"]["stdout"] == "HELLO\n"
    # skyrl-agent: SANDBOX_FUSION_URL + /run_code with verl's payload
    skyrl = httpx.post(
        f"{compat_stack.url}/run_code",
        json={
            "code": "print(1 + 1)",
            "stdin": "",
            "compile_timeout": 10,
            "run_timeout": 10,
            "memory_limit_MB": 1024,
            "language": "python",
            "files": {},
            "fetch_files": [],
        },
        timeout=60,
    ).json()
    assert skyrl["status"] == "Success" and skyrl["run_result"]["stdout"] == "2\n"


def test_tinker_cookbook_and_skyrl_through_their_own_code(compat_stack: Stack) -> None:
    python = client_python("sandboxfusion-peers", SANDBOXFUSION_PEERS, SANDBOXFUSION_PEERS_NO_DEPS)
    env = {
        "SANDBOX_URL": f"{compat_stack.url}/run_code",
        "SANDBOX_FUSION_URL": compat_stack.url,
    }
    seen = run_driver(python, "sandboxfusion_peers.py", env)
    assert seen["tinker_right"] is True and seen["tinker_right_status"] == "Success"
    assert seen["tinker_wrong"] is False
    assert seen["skyrl_tool"] == ["Finished", "42\n"]
    assert seen["skyrl_graded"] == "success"
    assert seen["skyrl_wrong"] == "wrong_answer"
