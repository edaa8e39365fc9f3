"""Large answers in pieces (api/answers.py): the pieces make exactly json.dumps' text, none is
long, and the ledger refuses what would go over its bound."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from sandbox_service.api.answers import (
    CHUNK_CHARS,
    AnswerLedger,
    answer,
    is_large,
    json_chunks,
    send_bytes_counted,
)
from sandbox_service.api.dispatch import Unavailable

BIG_B64 = base64.b64encode(os.urandom(3 * CHUNK_CHARS)).decode()
VALUES: list[Any] = [
    {"status": "ok", "stdout": "1\n", "files": {"out.bin": BIG_B64}, "exit_code": 0},
    {"results": [{"stdout": 'é"\\\n\x7f' * CHUNK_CHARS, "x": None}, {"y": [1.5, True, []]}]},
    {"stdout": "😀" * (CHUNK_CHARS + 3), "empty": {}, "n": -3},
    {"plain": "a" * 10, "list": [], "nested": {"k": ["v", {"w": 1e300}]}},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_pieces_are_json_dumps_text_and_none_is_long(value: Any) -> None:
    pieces = list(json_chunks(value))
    assert "".join(pieces) == json.dumps(value)
    assert max(map(len, pieces)) <= CHUNK_CHARS


def test_only_an_answer_with_a_long_string_is_large() -> None:
    assert is_large(VALUES[0]) and is_large(VALUES[1]) and not is_large(VALUES[3])


def test_the_ledger_counts_large_answers_and_refuses_past_its_bound() -> None:
    ledger = AnswerLedger(max_bytes=5 * CHUNK_CHARS, room_per_call=2 * CHUNK_CHARS)
    assert ledger.over("default") is None
    small = answer(VALUES[3], ledger)
    assert ledger.held_bytes == 0 and small.body == json.dumps(VALUES[3]).encode()
    first = answer(VALUES[0], ledger)
    assert ledger.held_bytes == len(json.dumps(VALUES[0])) == int(first.headers["content-length"])
    with pytest.raises(Unavailable, match="max_unread_answer_bytes"):
        answer(VALUES[0], ledger)  # a second one would go over: refused, nothing counted
    assert ledger.held_bytes == len(json.dumps(VALUES[0]))
    over = ledger.over("default")  # 4 chunks held, room for 2 more needed: a call is refused
    assert over is not None and "max_unread_answer_bytes" in over
    ledger.give_back("default", ledger.held_bytes)
    assert ledger.held_bytes == 0 and ledger.over("default") is None


async def test_raw_bytes_go_in_pieces_counted_while_sent_and_are_refused_over_the_bound() -> None:
    data = os.urandom(3 * CHUNK_CHARS + 5)
    ledger = AnswerLedger(max_bytes=4 * CHUNK_CHARS, room_per_call=CHUNK_CHARS)
    messages: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            assert ledger.held_bytes == len(data)  # counted while it is sent
        messages.append(message)

    assert await send_bytes_counted(send, data, "application/octet-stream", ledger) is None
    bodies = [m["body"] for m in messages[1:]]
    assert b"".join(bodies) == data and max(map(len, bodies)) <= CHUNK_CHARS
    assert ledger.held_bytes == 0 and not messages[-1]["more_body"]
    ledger.take("default", 2 * CHUNK_CHARS)
    messages.clear()
    refused = await send_bytes_counted(send, data, "application/octet-stream", ledger)
    assert refused is not None and "max_unread_answer_bytes" in refused and messages == []


def test_a_tenant_whose_clients_never_read_fills_only_its_own_share() -> None:
    ledger = AnswerLedger(
        max_bytes=12 * CHUNK_CHARS, room_per_call=2 * CHUNK_CHARS, weights={"a": 1, "b": 2}
    )
    assert (ledger.share("a"), ledger.share("b")) == (4 * CHUNK_CHARS, 8 * CHUNK_CHARS)
    assert ledger.share("unknown") == 3 * CHUNK_CHARS  # weight 1 of 4
    assert ledger.take("a", 2 * CHUNK_CHARS) is None
    assert ledger.take("a", 2 * CHUNK_CHARS) is None
    refused = ledger.take("a", CHUNK_CHARS)  # a's share is full; the process's bound is not
    assert refused is not None and "share" in refused
    assert ledger.over("a") is not None
    assert ledger.over("b") is None  # b's room is untouched by a's unread answers
    for _ in range(4):
        assert ledger.take("b", 2 * CHUNK_CHARS) is None
    assert ledger.held == {"a": 4 * CHUNK_CHARS, "b": 8 * CHUNK_CHARS}
    ledger.give_back("a", 4 * CHUNK_CHARS)
    assert ledger.held == {"b": 8 * CHUNK_CHARS} and ledger.over("a") is None


def test_a_tenant_holding_nothing_may_take_one_answer_larger_than_its_share() -> None:
    ledger = AnswerLedger(
        max_bytes=8 * CHUNK_CHARS, room_per_call=6 * CHUNK_CHARS, weights={"a": 1, "b": 1}
    )
    assert ledger.over("a") is None
    assert ledger.take("a", 6 * CHUNK_CHARS) is None  # over its share of 4: its first answer
    assert ledger.take("a", CHUNK_CHARS) is not None  # a second is over its share
    assert ledger.take("b", 3 * CHUNK_CHARS) is not None  # the process's bound still holds
    assert ledger.take("b", 2 * CHUNK_CHARS) is None
