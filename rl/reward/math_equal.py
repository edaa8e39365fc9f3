"""Whether an extracted answer equals the ground truth: math-verify (sympy), numeric tolerance.

Runs with no time limit of its own, and sympy can hang (in C, holding the GIL) on inputs such
as `9^{9^{9^9}}`: call it only inside a verifier worker process (`rl.reward.verify_worker`),
which the parent kills on time-out. Importing this module imports sympy and math-verify.

Self-contained (the standard library, sympy and math-verify only, no package imports): the
service's `POST /verify` runs this file's source inside the jail (sandbox_service/jail/
verify_program.py), since math-verify hands parts of the answer to sympy's `parse_expr`, which
evaluates them with `eval`.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Literal

import sympy  # type: ignore[import-untyped,unused-ignore]
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Our worker enforces the time limit from outside, so math-verify's signal.alarm is switched off
# (it fires only between bytecodes and cannot stop a big-integer power), and its warning about
# that is silenced.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

# Digit groups of three after a thin space, a LaTeX space, `~` or `{,}`: 1\,024, 1 024, 1{,}024.
# math-verify reads "1\,024" as 1 + 024 = 25; "1,024" it already handles. Not after a decimal
# point, so 3.141 592 is left alone.
_GROUPED_DIGITS = re.compile(
    r"(?<![\d.])\d{1,3}(?:(?:\\[,!; ]|\\thinspace\s*|~|\{,\}| )\d{3})+(?!\d)"
)
_GROUP_SEPARATOR = re.compile(r"\\[,!; ]|\\thinspace\s*|~|\{,\}| ")


def normalize(answer: str) -> str:
    """Remove thousands separators that math-verify misreads; otherwise leave the LaTeX alone."""
    return _GROUPED_DIGITS.sub(lambda m: _GROUP_SEPARATOR.sub("", m.group(0)), answer.strip())


@functools.lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple[object, ...]:
    # Cached: each ground truth is checked against every rollout of its group (32 in the paper).
    parsed = parse(
        "\\boxed{" + normalize(answer) + "}",
        extraction_config=_EXTRACTION,
        parsing_timeout=None,
    )
    return tuple(parsed)


def _numerically_close(gold: object, prediction: object, rel_tol: float) -> bool:
    """Relative closeness of two constant real expressions; an integer gold must match exactly."""
    if not isinstance(gold, sympy.Expr) or not isinstance(prediction, sympy.Expr):
        return False
    if gold.is_Integer or not gold.is_number or not prediction.is_number:
        return False
    gold_value = sympy.N(gold, 30)
    pred_value = sympy.N(prediction, 30)
    if not (gold_value.is_real and pred_value.is_real):
        return False
    if not (gold_value.is_finite and pred_value.is_finite):
        return False
    scale = max(abs(gold_value), abs(pred_value))
    return bool(abs(gold_value - pred_value) <= rel_tol * scale)


def _integer_exact(gold: object, prediction: object) -> bool:
    """Re-check an integer gold exactly: math-verify compares numbers to 15 digits, which lets
    an unevaluated 10^{10^{10}} + 1 pass for 10^{10^{10}}."""
    if not isinstance(gold, sympy.Integer) or not isinstance(prediction, sympy.Expr):
        return True
    if not prediction.is_number:
        return True
    value = prediction.doit()  # the parser builds powers and products unevaluated
    if isinstance(value, sympy.Integer):
        return bool(value == gold)
    if isinstance(value, sympy.Float):  # sympy holds Float(1024.0) != Integer(1024)
        return bool((value - gold).is_zero)
    return True


Comparison = Literal["equal", "not_equal", "unparsable_answer", "unparsable_reference"]


def compare(prediction: str, gold: str, *, rel_tol: float = 1e-6) -> Comparison:
    """Whether prediction and gold denote the same mathematical object, or which of them could
    not be read (no time limit here)."""
    gold_parsed = list(_parse(gold))
    if not gold_parsed:
        return "unparsable_reference"
    pred_parsed = list(_parse(prediction))
    if not pred_parsed:
        return "unparsable_answer"
    if verify(gold_parsed, pred_parsed, timeout_seconds=None):
        equal = _integer_exact(gold_parsed[0], pred_parsed[0])
    else:
        equal = _numerically_close(gold_parsed[0], pred_parsed[0], rel_tol)
    return "equal" if equal else "not_equal"


def is_equivalent(prediction: str, gold: str, *, rel_tol: float = 1e-6) -> bool:
    """True when prediction and gold denote the same mathematical object (no time limit here)."""
    return compare(prediction, gold, rel_tol=rel_tol) == "equal"
