"""Trajectories rendered as the rStar2-Agent chat template renders them (ChatML, Qwen).

The prompt ends with the generation prompt `<|im_start|>assistant\\n<reason>`, so a response
starts inside the first turn's <reason>. Every generated turn ends with `<|im_end|>`; a tool
response comes back as a user turn and the next assistant turn is pre-filled with <reason>.
Tool-response texts are the release's: "Tool call success|failure", "reason:", "stdout:", ...
"""

from __future__ import annotations

from collections.abc import Sequence

GENERATION_PROMPT = "<|im_start|>assistant\n<reason>"


def tool_call(code: str) -> str:
    """One tool call as the model writes it (JSON inside <tool_call> tags)."""
    escaped = code.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return (
        '<tool_call>\n{"name": "python_code_with_standard_io", '
        f'"arguments": {{"code": "{escaped}", "input": ""}}}}\n</tool_call>'
    )


def tool_turn(text: str) -> str:
    """What the rollout appends after a turn that called a tool: the response, then a new turn."""
    return (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        f"{text}\n</tool_response><|im_end|>\n{GENERATION_PROMPT}"
    )


def render(turns: Sequence[str], tool_responses: Sequence[str]) -> str:
    """A response: assistant turns, each but the last followed by its tool response."""
    assert len(tool_responses) == len(turns) - 1
    out = ""
    for i, turn in enumerate(turns):
        out += turn
        out += tool_turn(tool_responses[i]) if i < len(tool_responses) else "<|im_end|>"
    return out


SUCCESS_4 = "Tool call success\nstdout: 4\nexecution time: 0.01s"
NAME_ERROR = (
    "Tool call failure\nreason: \nstderr: Traceback (most recent call last):\n"
    '  File "/tmp/tmpa1b2/main.py", line 1, in <module>\n'
    "    print(x)\nNameError: name 'x' is not defined\nexecution time: 0.02s"
)
TIMED_OUT = "Tool call failure\nreason: worker_timeout\nexecution time: 4.00s"
JSON_FAILURE = "Failed to decode tool call: Expecting ',' delimiter: line 1 column 48 (char 47)"
PRINTS_ERROR = "Tool call success\nstdout: relative error 0.0 < 1e-9: ok\nexecution time: 0.03s"

ANSWER_4 = "<answer>The value is \\boxed{4}.</answer>"

# T1-T8 of the spec's penalty table (shared/peers/rstar2-spec.md §3.4).
T1_NO_TOOL = render(["We compute 2 + 2 = 4 directly.</reason>" + ANSWER_4], [])
T2_ONE_OK = render(
    [
        "Let me compute it.</reason>" + tool_call("print(2 + 2)"),
        "The tool says 4.</reason>" + ANSWER_4,
    ],
    [SUCCESS_4],
)
T3_FAILED_THEN_OK = render(
    [
        "Let me compute it.</reason>" + tool_call("print(x)"),
        "I forgot to define x.</reason>" + tool_call("x = 2\nprint(x + 2)"),
        "The tool says 4.</reason>" + ANSWER_4,
    ],
    [NAME_ERROR, SUCCESS_4],
)
T4_TIMED_OUT = render(
    [
        "Brute force.</reason>" + tool_call("while True:\n    pass"),
        "It timed out, but 2 + 2 = 4.</reason>" + ANSWER_4,
    ],
    [TIMED_OUT],
)
T5_JSON_FAILURE_THEN_OK = render(
    [
        'Compute.</reason><tool_call>\n{"name": "python_code_with_standard_io", '
        '"arguments": {"code": "print(2 + 2)" "input": ""}}\n</tool_call>',
        "Fix the JSON.</reason>" + tool_call("print(2 + 2)"),
        "The tool says 4.</reason>" + ANSWER_4,
    ],
    [JSON_FAILURE, SUCCESS_4],
)
T6_TWO_ANSWERS = render(
    [
        "I think it is 4.</reason>" + ANSWER_4 + tool_call("print(2 + 2)"),
        "Confirmed.</reason>" + ANSWER_4,
    ],
    [SUCCESS_4],
)
T7_NO_ANSWER_TAG = render(
    ["Let me compute it.</reason>" + tool_call("print(2 + 2)"), "So it is \\boxed{4}.</reason>"],
    [SUCCESS_4],
)
T8_OK_PRINTS_ERROR = render(
    [
        "Check the float error.</reason>" + tool_call("print('relative error 0.0 < 1e-9: ok')"),
        "Fine.</reason>" + ANSWER_4,
    ],
    [PRINTS_ERROR],
)
