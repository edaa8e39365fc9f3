"""Finding the final answer in a response: the last `\\boxed{}` inside `<answer>...</answer>`.

Pure string functions; the `\\boxed{}` reader is the one the trainer integrations use
(`trainer_client.integrations.answer`, standard library only). Judging the extracted answer is
`rl.reward.math_equal`'s job, done in worker processes under a time limit (`rl.reward.verifier`).
"""

from __future__ import annotations

import re

from trainer_client.integrations.answer import final_answer as last_boxed

_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


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
