"""Tool-call parsing and tool-response rendering, on rStar2-style model outputs."""

# ruff: noqa: E501 -- model outputs are kept verbatim, as long lines

from __future__ import annotations

import json

import pytest

from trainer_client import (
    JUPYTER_TOOL_NAME,
    PYTHON_TOOL_NAME,
    InvalidRequestError,
    ToolCall,
    execute_tool_call,
    format_parse_error,
    format_tool_response,
    jupyter_tool_schema,
    parse_tool_calls,
    python_tool_schema,
    truncate_middle,
    truncate_to_tokens,
)
from trainer_client.wire import ExecuteResult

# An assistant turn as rStar2-Agent models write it: reasoning, then a Hermes tool call whose
# code has escaped newlines (the paper's Fig. 2 problem: least p with p^2 | n^4 + 1).
TURN_ONE_CALL = r"""<reason> To solve this problem, I need to find the least prime number \( p \) such that there exists a positive integer \( n \) for which \( n^4 + 1 \) is divisible by \( p^2 \). Let me write the Python code to find the prime \( p \) and the corresponding \( m \). </reason>
<tool_call>
{"name": "python_code_with_standard_io", "arguments": {"code": "import sympy\n\ndef find_least_prime_and_m():\n    for p in sympy.primerange(2, 1000):\n        for m in range(1, p * p):\n            if (m**4 + 1) % (p * p) == 0:\n                return p, m\n\nprint(find_least_prime_and_m())", "input": ""}}
</tool_call>"""

TURN_TWO_CALLS = """<reason> Let me verify both the divisibility and read a number from stdin. </reason>
<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "print((110**4 + 1) % 289 == 0)", "input": ""}}</tool_call>
<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "n = int(input())\\nprint(n * 2)", "input": "21\\n"}}</tool_call>"""

FINAL_TURN = r"<reason> The verification confirms it. </reason><answer> \(\boxed{110}\) </answer>"


def test_parses_a_real_turn_with_one_call() -> None:
    [call] = parse_tool_calls(TURN_ONE_CALL)
    assert call.ok and call.name == PYTHON_TOOL_NAME
    assert call.arguments["input"] == ""
    assert call.arguments["code"].startswith("import sympy\n\ndef find_least_prime_and_m():\n")
    assert call.arguments["code"].endswith("print(find_least_prime_and_m())")


def test_parses_several_calls_in_order() -> None:
    calls = parse_tool_calls(TURN_TWO_CALLS)
    assert [c.arguments["code"].splitlines()[0] for c in calls] == [
        "print((110**4 + 1) % 289 == 0)",
        "n = int(input())",
    ]
    assert calls[1].arguments["input"] == "21\n"


def test_a_final_answer_has_no_calls() -> None:
    assert parse_tool_calls(FINAL_TURN) == []


def test_invalid_json_is_kept_with_its_error() -> None:
    text = '<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)"</tool_call>'
    [call] = parse_tool_calls(text)
    assert not call.ok and call.name is None
    assert call.raw.startswith('{"name"')
    assert format_parse_error(call).startswith("Failed to decode tool call: Expecting")


def test_a_bad_block_does_not_hide_the_good_ones() -> None:
    text = (
        '<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "1"}}</tool_call>'
        "<tool_call>not json</tool_call>"
        '<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "2"}}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [c.ok for c in calls] == [True, False, True]
    assert [c.arguments.get("code") for c in calls] == ["1", None, "2"]


@pytest.mark.parametrize(
    ("block", "error_part"),
    [
        ('{"arguments": {"code": "1"}}', "'name'"),
        ('{"name": "python_code_with_standard_io"}', "missing 'arguments'"),
        ('{"name": "python_code_with_standard_io", "arguments": [1]}', "must be a JSON object"),
        ('["python_code_with_standard_io"]', "expected a JSON object"),
        ('{"name": "x", "arguments": "{not json"}', "is a string but not JSON"),
    ],
)
def test_structurally_wrong_blocks_carry_an_error(block: str, error_part: str) -> None:
    [call] = parse_tool_calls(f"<tool_call>{block}</tool_call>")
    assert call.error is not None and error_part in call.error


def test_double_encoded_arguments_are_decoded() -> None:
    args = json.dumps({"code": "print(3)", "input": ""})
    [call] = parse_tool_calls(
        "<tool_call>" + json.dumps({"name": PYTHON_TOOL_NAME, "arguments": args}) + "</tool_call>"
    )
    assert call.ok and call.arguments == {"code": "print(3)", "input": ""}


def test_raw_newlines_in_strings_are_accepted_unless_strict() -> None:
    text = '<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "x = 1\nprint(x)", "input": ""}}</tool_call>'
    [lenient] = parse_tool_calls(text)
    assert lenient.ok and lenient.arguments["code"] == "x = 1\nprint(x)"
    [strict] = parse_tool_calls(text, strict_json=True)
    assert strict.error is not None and "control character" in strict.error


def test_an_unterminated_block_is_reported() -> None:
    text = TURN_ONE_CALL + '\n<tool_call>{"name": "python_code_with_standard_io", "argu'
    calls = parse_tool_calls(text)
    assert [c.ok for c in calls] == [True, False]
    assert calls[1].error is not None and "unterminated" in calls[1].error


def test_schema_is_the_releases_tool() -> None:
    schema = python_tool_schema()
    function = schema["function"]
    assert function["name"] == "python_code_with_standard_io"
    assert function["parameters"]["required"] == ["code", "input"]
    assert set(function["parameters"]["properties"]) == {"code", "input"}
    schema["function"]["name"] = "changed"
    assert python_tool_schema()["function"]["name"] == PYTHON_TOOL_NAME


def _result(
    status: str, stdout: str = "", stderr: str = "", wall_time: float = 0.0
) -> ExecuteResult:
    return ExecuteResult(id="x", status=status, stdout=stdout, stderr=stderr, wall_time=wall_time)


def test_success_format() -> None:
    text = format_tool_response(_result("ok", stdout="(17, 110)\n", wall_time=0.1234))
    assert text == "Tool call success\nstdout: (17, 110)\n\nexecution time: 0.12s"


def test_success_without_output_has_only_the_time() -> None:
    assert format_tool_response(_result("ok", wall_time=2)) == (
        "Tool call success\nexecution time: 2.00s"
    )


def test_error_format_has_an_empty_reason_like_code_judge() -> None:
    stderr = "NameError at line 1: name 'x' is not defined\n  print(x)\n"
    text = format_tool_response(_result("error", stderr=stderr, wall_time=0.05))
    assert text == (
        "Tool call failure\nreason: \n"
        "stderr: NameError at line 1: name 'x' is not defined\n  print(x)\n\n"
        "execution time: 0.05s"
    )


@pytest.mark.parametrize(
    ("status", "rstar2_reason"),
    [
        ("timeout", "worker_timeout"),
        ("queue_timeout", "queue_timeout"),
        ("sandbox_error", "internal_error"),
        ("memory_limit", ""),
        ("killed", ""),
    ],
)
def test_reasons_per_style(status: str, rstar2_reason: str) -> None:
    rstar2 = format_tool_response(_result(status, wall_time=4.0))
    assert rstar2.splitlines()[:2] == ["Tool call failure", f"reason: {rstar2_reason}"]
    plain = format_tool_response(_result(status, wall_time=4.0), style="status")
    assert plain.splitlines()[1] == f"reason: {status}"


def test_long_output_is_cut_in_the_middle() -> None:
    stdout = "".join(f"line {i}\n" for i in range(1000))
    text = format_tool_response(_result("ok", stdout=stdout, wall_time=1.5), max_chars=256)
    head, tail = text.split("...(truncated)...")
    assert len(head) == len(tail) == 128
    assert head.startswith("Tool call success\nstdout: line 0\nline 1\n")
    assert tail.endswith("line 999\n\nexecution time: 1.50s")


def test_no_limit_keeps_everything() -> None:
    stdout = "x" * 10_000
    assert stdout in format_tool_response(_result("ok", stdout=stdout), max_chars=None)


def test_truncate_middle_leaves_short_text_alone() -> None:
    assert truncate_middle("abc", 3) == "abc"
    assert truncate_middle("abcdef", 4) == "ab...(truncated)...ef"


class _RecordingExecutor:
    def __init__(self, result: ExecuteResult | Exception) -> None:
        self.result = result
        self.calls: list[tuple[str, str, float]] = []
        self.sessions: list[str | None] = []

    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float = 10.0,  # noqa: ASYNC109
        session_id: str | None = None,
    ) -> ExecuteResult:
        self.calls.append((code, stdin, timeout))
        self.sessions.append(session_id)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_execute_tool_call_runs_code_with_its_input() -> None:
    [_, call] = parse_tool_calls(TURN_TWO_CALLS)
    executor = _RecordingExecutor(_result("ok", stdout="42\n", wall_time=0.01))
    text = await execute_tool_call(executor, call, timeout=4)
    assert executor.calls == [("n = int(input())\nprint(n * 2)", "21\n", 4)]
    assert text == "Tool call success\nstdout: 42\n\nexecution time: 0.01s"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ToolCall(None, raw="x", error="bad json"), "Failed to decode tool call: bad json"),
        (
            ToolCall("web_search", {"q": "x"}),
            "Error when executing tool: unknown tool 'web_search'",
        ),
        (ToolCall(PYTHON_TOOL_NAME, {"input": ""}), "Error when executing tool: argument 'code'"),
        (ToolCall(PYTHON_TOOL_NAME, {"code": "1", "input": 5}), "argument 'input' must be"),
    ],
)
async def test_model_mistakes_become_text(call: ToolCall, expected: str) -> None:
    executor = _RecordingExecutor(_result("ok"))
    text = await execute_tool_call(executor, call)
    assert text.startswith("Failed to decode tool call: ") or text.startswith(
        "Error when executing tool: "
    )
    assert expected in text
    assert executor.calls == []


async def test_a_request_the_service_rejects_becomes_text() -> None:
    executor = _RecordingExecutor(InvalidRequestError("code is longer than 262144 bytes"))
    text = await execute_tool_call(executor, ToolCall(PYTHON_TOOL_NAME, {"code": "x"}))
    assert text == "Error when executing tool: code is longer than 262144 bytes"


PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def test_images_are_the_decoded_pngs_and_the_response_says_they_exist() -> None:
    display = [{"text/plain": "<Figure>"}, {"image/png": PNG_1X1}, {"image/png": PNG_1X1}]
    result = ExecuteResult(id="x", status="ok", stdout="done\n", wall_time=0.5, display=display)
    assert [image[:8] for image in result.images()] == [b"\x89PNG\r\n\x1a\n"] * 2
    text = format_tool_response(result, max_chars=None)
    assert text == (
        "Tool call success\nstdout: done\n\nimages: 2 produced (image/png)\nexecution time: 0.50s"
    )
    assert "images:" not in format_tool_response(result, max_chars=None, mention_images=False)
    assert "images:" not in format_tool_response(_result("ok"), max_chars=None)


@pytest.mark.parametrize(
    "value",
    ["not base64 at all!", "é" * 8, "AAAA", PNG_1X1[:-3], "", "=" * 8, "iVBORw0KGgo" + "\x00"],
)
def test_images_and_the_response_never_raise_on_a_forged_display(value: str) -> None:
    # A program can write its rich outputs itself; whatever the service passes on, the client
    # must not raise in a rollout loop: what is not a base64 PNG is not an image.
    display = [{"image/png": value}, {"image/png": PNG_1X1}, {"text/plain": value}]
    result = ExecuteResult(id="x", status="ok", display=display)
    assert [image[:8] for image in result.images()] == [b"\x89PNG\r\n\x1a\n"]
    assert "images: 1 produced" in format_tool_response(result, max_chars=None)


def test_the_jupyter_tool_schema_is_rstar2s() -> None:
    schema = jupyter_tool_schema()
    assert schema["function"]["name"] == JUPYTER_TOOL_NAME == "jupyter_code"
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert list(schema["function"]["parameters"]["properties"]) == ["code"]
    schema["function"]["name"] = "changed"
    assert jupyter_tool_schema()["function"]["name"] == "jupyter_code"


async def test_a_jupyter_call_runs_as_a_cell_of_the_given_session() -> None:
    executor = _RecordingExecutor(_result("ok", stdout="3\n", wall_time=0.01))
    call = ToolCall(JUPYTER_TOOL_NAME, {"code": "1 + 2"})
    text = await execute_tool_call(executor, call, timeout=4, session_id="traj-7")
    assert executor.calls == [("1 + 2", "", 4)] and executor.sessions == ["traj-7"]
    assert text.startswith("Tool call success\nstdout: 3\n")
    python = ToolCall(PYTHON_TOOL_NAME, {"code": "print(1)", "input": ""})
    await execute_tool_call(executor, python, session_id="traj-7")
    assert executor.sessions[-1] is None  # the stateless tool stays stateless


async def test_a_jupyter_call_without_a_session_is_refused_as_text() -> None:
    executor = _RecordingExecutor(_result("ok"))
    text = await execute_tool_call(executor, ToolCall(JUPYTER_TOOL_NAME, {"code": "1"}))
    assert text.startswith("Error when executing tool: unknown tool 'jupyter_code'")
    assert executor.calls == []


def _words(text: str) -> int:
    """A stand-in tokenizer: whitespace-separated words (any text -> count callable does)."""
    return len(text.split())


def test_a_token_budget_keeps_head_and_tail_and_says_what_was_cut() -> None:
    stdout = "".join(f"value {i}\n" for i in range(5000))
    result = _result("ok", stdout=stdout, wall_time=0.5)
    text = format_tool_response(result, max_chars=None, max_tokens=100, count_tokens=_words)
    assert 97 <= _words(text) <= 100  # as much kept as fits
    head, marker_and_tail = text.split("\n[... ", 1)
    omitted, tail = marker_and_tail.split(" characters omitted ...]\n", 1)
    assert head.startswith("Tool call success\nstdout: value 0\nvalue 1\n")
    assert tail.endswith("value 4999\n\nexecution time: 0.50s")
    whole = format_tool_response(result, max_chars=None)
    assert int(omitted) == len(whole) - len(head) - len(tail)
    assert whole.startswith(head) and whole.endswith(tail)


def test_a_token_budget_leaves_text_that_fits_alone_and_needs_a_tokenizer() -> None:
    result = _result("ok", stdout="42\n", wall_time=0.1)
    plain = format_tool_response(result, max_chars=None)
    assert format_tool_response(result, max_chars=None, max_tokens=50, count_tokens=_words) == plain
    with pytest.raises(ValueError, match="count_tokens"):
        format_tool_response(result, max_tokens=50)


def test_a_budget_below_the_marker_keeps_the_longest_prefix_that_fits() -> None:
    assert truncate_to_tokens("a b c d e f g", 2, _words) == "a b "
    assert truncate_to_tokens("abc", 0, len) == ""
