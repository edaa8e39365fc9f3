"""Seeds and cut output through the real service (API, Redis, workers, jails)."""

from __future__ import annotations

import re
import uuid

import httpx

from tests.service.conftest import DEFAULT_LIMITS
from tests.service.test_api import execute

DRAWS = "import random, numpy\nprint(random.random(), numpy.random.randint(10**9))"


async def test_the_same_seed_prints_the_same_in_runs_and_session_cells(
    client: httpx.AsyncClient,
) -> None:
    runs = [await execute(client, code=DRAWS, seed=2**32 - 1) for _ in range(2)]
    other = await execute(client, code=DRAWS, seed=0)
    fresh = [await execute(client, code=DRAWS) for _ in range(2)]
    assert runs[0]["status"] == "ok", runs[0]
    assert runs[0]["stdout"] == runs[1]["stdout"] != other["stdout"]
    assert fresh[0]["stdout"] != fresh[1]["stdout"]
    session = f"seed-{uuid.uuid4().hex}"
    await execute(client, code="import random\nrandom.random()", session_id=session)
    cell = await execute(client, code=DRAWS, session_id=session, seed=2**32 - 1)
    assert cell["stdout"] == runs[0]["stdout"]
    assert (await client.delete(f"/sessions/{session}")).status_code == 204


async def test_a_seed_out_of_range_is_refused_naming_the_field(client: httpx.AsyncClient) -> None:
    for seed in (-1, 2**32, 1.5, "x"):
        response = await client.post("/execute", json={"code": "pass", "seed": seed})
        assert response.status_code == 422, (seed, response.text)
        assert any(e["loc"][-1] == "seed" for e in response.json()["detail"])


async def test_a_flood_answers_head_tail_and_the_true_size(client: httpx.AsyncClient) -> None:
    code = (
        "import sys\nsys.stdout.write('START' + 'x' * 3_000_000 + 'END')\n"
        "print('e' * 10, file=sys.stderr)"
    )
    result = await execute(client, code=code)
    assert result["status"] == "ok" and result["stdout_truncated"] is True
    assert result["stdout_bytes"] == 3_000_008
    stdout = str(result["stdout"])
    assert len(stdout.encode()) <= DEFAULT_LIMITS["max_output_bytes"]
    assert stdout.startswith("STARTxx") and stdout.endswith("xxEND")
    assert re.search(r"\n\[\.\.\. \d+ bytes omitted \.\.\.\]\n", stdout)
    assert (result["stderr_truncated"], result["stderr_bytes"]) == (False, 11)
