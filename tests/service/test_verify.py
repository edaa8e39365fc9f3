"""POST /verify on a real stack: answers judged in the workers' jails, each item under its limit."""

from __future__ import annotations

import httpx

HANG = "9^{9^{9^9}}"
"""sympy evaluates this power for minutes unless it is stopped."""


async def test_verdicts_come_back_in_order_and_a_hanging_item_costs_only_its_limit(
    client: httpx.AsyncClient,
) -> None:
    items = [
        {"answer": "\\frac{1}{2}", "reference": "0.5"},
        {"answer": "41", "reference": "42"},
        {"answer": HANG, "reference": "1"},
        {"answer": "", "reference": "3"},
        {"answer": "\\sqrt{4}", "reference": "2"},
        {"answer": "1", "reference": "\\text{}"},
    ]
    reply = await client.post("/verify", json={"items": items, "timeout": 2.0})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    print("item times (s):", [r["time"] for r in results])
    assert [(r["verdict"], r["reason"]) for r in results] == [
        ("correct", "equivalent"),
        ("incorrect", "not_equivalent"),
        ("timeout", "time_limit"),
        ("invalid", "empty_answer"),
        ("correct", "equivalent"),
        ("invalid", "unparsable_reference"),
    ]
    # The worker that held the hanging item serves the next calls.
    again = await client.post(
        "/verify", json={"items": [{"answer": "7", "reference": "7"}] * 4, "timeout": 2.0}
    )
    assert [r["verdict"] for r in again.json()["results"]] == ["correct"] * 4
    ran = await client.post("/execute", json={"code": "print(6 * 7)"})
    assert ran.json()["stdout"] == "42\n"


async def test_limits_the_server_cannot_keep_are_refused(client: httpx.AsyncClient) -> None:
    item = {"answer": "1", "reference": "1"}
    too_slow = await client.post("/verify", json={"items": [item], "timeout": 15.0})
    assert too_slow.status_code == 422
    assert too_slow.json()["detail"][0]["loc"] == ["body", "timeout"]
    too_many = await client.post("/verify", json={"items": [item] * 10_000})
    assert too_many.status_code == 422
    assert (await client.post("/verify", json={"items": []})).status_code == 422
    extra = await client.post("/verify", json={"items": [{**item, "x": 1}]})
    assert extra.status_code == 422
