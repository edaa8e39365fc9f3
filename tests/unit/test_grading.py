"""The grader's pure core: plain data decoding and comparison, report frames, stdio verdicts."""

from __future__ import annotations

import json

import pytest

from sandbox_service import grade_reports, grading, plain_data
from sandbox_service.plain_data import Malformed, Opaque, decode, equal

NONCE = "ab12"


def frame(kind: str, payload: object, nonce: str = NONCE) -> str:
    return f"\n{grade_reports.MARK} {nonce} {kind} {json.dumps(payload)}\n"


@pytest.mark.parametrize(
    ("got", "expected", "same"),
    [
        ((1, 2), [1, 2], True),
        ([(1, (2,))], [[1, [2]]], True),
        (0.1 + 0.2, 0.3, True),
        (1e9 + 1e-4, 1e9, True),
        (1.001, 1.0, False),
        (5.0, 5, True),
        (True, 1, True),
        (float("nan"), float("nan"), False),
        ({"a": (1.0000001,)}, {"a": [1]}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ("1", 1, False),
        (None, None, True),
        (None, 0, False),
        (2**300, 2**300, True),
        (Opaque("AlwaysEqual"), 1, False),
        ([Opaque("x")], [Opaque("x")], False),
        (1j * 1j, -1, True),
        ({1, 2}, {2, 1}, True),
    ],
)
def test_equal_follows_the_graders_rules(got: object, expected: object, same: bool) -> None:
    assert equal(got, expected) is same


def test_decode_reads_every_tag() -> None:
    tagged = [
        "L",
        [
            ["N"],
            ["B", True],
            ["I", format(-(2**200), "x")],
            ["F", (0.1).hex()],
            ["C", (1.0).hex(), (-2.0).hex()],
            ["S", "日本"],
            ["Y", b"\x00\xff".hex()],
            ["T", [["I", "1"]]],
            ["E", [["I", "2"]]],
            ["Z", [["S", "z"]]],
            ["D", [[["S", "k"], ["N"]]]],
            ["H", 0, "Thing"],
        ],
    ]
    value = decode(tagged)
    assert value[:11] == [
        None,
        True,
        -(2**200),
        0.1,
        1 - 2j,
        "日本",
        b"\x00\xff",
        (1,),
        {2},
        frozenset({"z"}),
        {"k": None},
    ]
    assert isinstance(value[11], Opaque) and value[11].type_name == "Thing"


@pytest.mark.parametrize(
    "tagged",
    [
        "x",
        [],
        ["Q"],
        ["I", 5],
        ["B", 1],
        ["F", "not-hex"],
        ["D", [[["L", []], ["N"]]]],
        ["D", [["N"]]],
        ["I", "f" * (plain_data.MAX_DIGITS_HEX + 1)],
    ],
)
def test_decode_refuses_what_is_not_tagged_data(tagged: object) -> None:
    with pytest.raises(Malformed):
        decode(tagged)


def test_decode_bounds_depth_and_size() -> None:
    deep: list[object] = ["N"]
    for _ in range(plain_data.MAX_DEPTH + 2):
        deep = ["L", [deep]]
    with pytest.raises(Malformed):
        decode(deep)
    with pytest.raises(Malformed):
        decode(["L", [["N"]] * (plain_data.MAX_NODES + 1)])


def test_frames_are_read_and_forgeries_counted() -> None:
    stdout = (
        "hello\n"
        + frame("audit", "files_written")
        + frame("result", [0, ["ok", ["I", "7"]], {}])
        + frame("result", [0, ["ok", ["I", "8"]], {}])
        + frame("result", [1, ["ok", ["I", "8"]], {}], nonce="guess")
        + "RLSB-GRADE printed by the program\n"
        + frame("done", {"files_written": 3, "bogus": 1})
    )
    report = grade_reports.read(stdout, NONCE)
    assert report.results == {0: (["ok", ["I", "7"]], {})}
    assert report.done
    assert report.audit == {"files_written": 3, "forged_output": 3}
    assert report.stdout == "hello\n"


def test_a_run_without_its_reply_is_an_early_exit() -> None:
    result = {"status": "ok", "exit_code": 0, "stdout": "", "stderr": ""}
    report = grading.read_run(result, NONCE)
    verdict = grading.function_verdict(result, report, 7)
    assert verdict.status == "early_exit"
    assert report.audit["early_exits"] == 1
    killed = {"status": "killed", "signal": 15, "stdout": "", "stderr": ""}
    report = grading.read_run(killed, NONCE)
    assert grading.function_verdict(killed, report, 7).status == "early_exit"
    assert report.audit["signals_sent"] == 1
    timeout = {"status": "timeout", "signal": 9, "stdout": "", "stderr": ""}
    report = grading.read_run(timeout, NONCE)
    assert grading.function_verdict(timeout, report, 7).status == "timeout"


def test_a_function_case_passes_only_on_an_equal_plain_value() -> None:
    for value, status in ((["I", "7"], "passed"), (["H", 0, "AlwaysEqual"], "failed")):
        stdout = frame("result", [0, ["ok", value], {}]) + frame("done", {})
        result = {"status": "ok", "stdout": stdout}
        report = grading.read_run(result, NONCE)
        assert grading.function_verdict(result, report, 7).status == status


@pytest.mark.parametrize(
    ("stdout", "expected", "status"),
    [
        ("6\n", "6", "passed"),
        ("a  \nb\n\n\n", "a\nb", "passed"),
        ("a\r\n", "a", "passed"),
        ("6\n", "7", "failed"),
        ("\n6", "6", "failed"),
    ],
)
def test_stdio_compares_lines_without_trailing_whitespace(
    stdout: str, expected: str, status: str
) -> None:
    result = {"status": "ok", "exit_code": 0, "stdout": stdout, "stderr": ""}
    assert grading.stdio_verdict(result, expected).status == status


def test_stdio_needs_exit_code_zero() -> None:
    result = {"status": "error", "exit_code": 1, "stdout": "6\n", "stderr": ""}
    assert grading.stdio_verdict(result, "6").status == "error"
