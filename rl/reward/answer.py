"""Finding the final answer in a response: the last `\\boxed{}` inside `<answer>...</answer>`
(math), or the last fenced code block there (code).

Pure string functions; the `\\boxed{}` reader is the one the trainer integrations use
(`trainer_client.integrations.answer`, standard library only). Judging the extracted answer is
`rl.reward.math_equal`'s job, done in worker processes under a time limit (`rl.reward.verifier`).
"""

from __future__ import annotations

import re

from trainer_client.integrations.answer import final_answer as last_boxed

_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE = re.compile(r"```([A-Za-z0-9+#]*)[^\n]*\n(.*?)```", re.DOTALL)
_CPP_TAGS = frozenset({"cpp", "c++", "cc", "cxx"})


def answer_blocks(response: str) -> list[str]:
    """The contents of every closed `<answer>...</answer>` block, in order."""
    return _ANSWER_BLOCK.findall(response)


def extract_answer(response: str, *, fallback_to_last_boxed: bool = False) -> str | None:
    """The final `\\boxed{}` inside the `<answer>` blocks, else (if allowed) the last anywhere."""
    for block in reversed(answer_blocks(response)):
        boxed = last_boxed(block)
        if boxed is not None:
            return boxed
    if fallback_to_last_boxed:
        return last_boxed(response)
    return None


def last_code_block(text: str) -> tuple[str, str] | None:
    """(language, code) of the last fenced block: "cpp" for ```cpp/c++/cc/cxx, else "python"."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    tag, code = blocks[-1]
    return ("cpp" if tag.lower() in _CPP_TAGS else "python"), code


def extract_code(response: str, *, fallback_to_last_block: bool = False) -> tuple[str, str] | None:
    """The last fenced code block inside the `<answer>` blocks, else (if allowed) the last one."""
    for block in reversed(answer_blocks(response)):
        code = last_code_block(block)
        if code is not None:
            return code
    if fallback_to_last_block:
        return last_code_block(response)
    return None
