"""The final answer of a response: the content of its last `\\boxed{...}` (or `\\fbox{...}`).

The answer POST /verify judges is already extracted; trainers' reward hooks get the whole
response text. Pure string functions.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _braced(text: str, open_index: int) -> str | None:
    """The text inside the `{` at open_index and its matching `}`; None when it never closes."""
    depth = 0
    i = open_index
    while i < len(text):
        if text[i] == "\\":
            i += 2  # `\{` and `\}` are literal braces, not grouping
            continue
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
        i += 1
    return None


def final_answer(response: str) -> str | None:
    """The stripped content of the last `\\boxed{}` in the response; None if absent or empty."""
    matches = list(_BOXED.finditer(response))
    if not matches:
        return None
    content = _braced(response, matches[-1].end() - 1)
    return content.strip() or None if content is not None else None
