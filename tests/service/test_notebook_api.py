"""Notebook conventions through the real service: session cells on /execute and /run_jupyter's
cells take `!cmd`, `!pip install`, magics, and show a DataFrame as an HTML table; a plain
/execute program stays plain Python."""

from __future__ import annotations

import uuid
from typing import Any

import httpx


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_session_cells_take_notebook_syntax(client: httpx.AsyncClient) -> None:
    sid = f"nb-{uuid.uuid4().hex[:12]}"
    # smolagents' CodeAgent's first cell.
    pip = await post(client, "/execute", {"code": "!pip install numpy pillow", "session_id": sid})
    assert pip["status"] == "ok", pip
    assert [line.split(" in ")[0] for line in pip["stdout"].splitlines()] == [
        "Requirement already satisfied: numpy",
        "Requirement already satisfied: pillow",
    ]
    wrote = await post(
        client, "/execute", {"code": "%%writefile data.csv\na,b\n1,x\n2,y\n", "session_id": sid}
    )
    assert wrote["stdout"] == "Writing data.csv\n", wrote
    code = "import pandas as pd\n!wc -l data.csv\npd.read_csv('data.csv')"
    table = await post(client, "/execute", {"code": code, "session_id": sid})
    assert table["status"] == "ok", table
    assert table["stdout"].startswith("3 data.csv\n")
    [bundle] = table["display"]
    assert "<table" in bundle["text/html"] and "<td>y</td>" in bundle["text/html"]
    missing = await post(
        client, "/execute", {"code": "%pip install no-such-pkg-abc", "session_id": sid}
    )
    assert "no network" in missing["stderr"], missing


async def test_run_jupyter_cells_take_notebook_syntax(client: httpx.AsyncClient) -> None:
    cells = ["n = 21", "!echo $((21 * 2))", "%time m = n * 2", "m", "!exit 4\n_exit_code"]
    result = await post(client, "/run_jupyter", {"cells": cells})
    assert result["status"] == "Success", result
    out = result["cells"]
    assert out[1]["stdout"] == "42\n"
    assert out[2]["stdout"].startswith("CPU times: ") and out[2]["error"] == []
    assert out[3]["display"] == [{"text/plain": "42"}]
    assert out[4]["display"] == [{"text/plain": "4"}]


async def test_a_plain_program_gets_no_notebook_syntax(client: httpx.AsyncClient) -> None:
    result = await post(client, "/execute", {"code": "!echo hi"})
    assert result["status"] == "error" and "SyntaxError" in result["stderr"], result
