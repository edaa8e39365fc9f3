"""Finding the final answer in a response: the last `\\boxed{}` inside `<answer>...</answer>`.

Pure string functions. Judging the extracted answer is `rl.reward.math_equal`'s job, done in worker
processes under a time limit (`rl.reward.verifier`).
"""

from __future__ import annotations

import re

_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _braced(text: str, open_index: int) -> str | None:
    """The text between the `{` at open_index and its matching `}`; None when it never closes."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            # `\{` and `\}` are literal braces in LaTeX, not grouping.
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in text; None if absent or unclosed."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    content = _braced(text, matches[-1].end() - 1)
    if content is None:
        return None
    content = content.strip()
    return content or None


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
