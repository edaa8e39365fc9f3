"""The framed lines a grading run wrote on stdout, read back outside the jail (pure).

Both in-jail grading programs (jail/grade_candidate.py, jail/grade_evaluator.py) frame their
reports as `\\x1eRLSB-GRADE <nonce> <kind> <json>` lines among the program's own output. Those
bytes were written by a jailed process, so they are read with bounds, and any line that carries
the frame's mark without being a well-formed report of this run (wrong nonce, unknown kind, bad
JSON, a second report of the same thing) is counted as forged output and otherwise ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MARK = "\x1eRLSB-GRADE"
MARK_WORD = "RLSB-GRADE"
"""Any line carrying this word that is not a well-formed report counts as forged output."""
MAX_LINE_CHARS = 4 * 1024 * 1024
AUDIT_KEYS = (
    "early_exits",
    "replaced_builtins",
    "replaced_modules",
    "hooks_installed",
    "signals_sent",
    "network_attempts",
    "files_written",
    "forged_output",
)
"""The spec's audit keys; the harness may report more (ctypes_uses, frames_inspected, ...)."""
EXTRA_AUDIT_KEYS = (
    "ctypes_uses",
    "introspection",
    "processes_started",
    "threads_started",
    "opaque_values",
    "limits_reached",
)
"""Keys beyond the spec's: informational too (an opaque value is how an always-equal object or
a subclass of a built-in type crosses; limits_reached counts cases ended by time or memory)."""
MAX_COUNT = 1_000_000
KINDS = ("audit", "names", "result", "exit", "load", "done", "need", "verdict")


@dataclass(slots=True)
class RunReport:
    """What one grading run reported, and the program's output without the frames."""

    audit: dict[str, int] = field(default_factory=dict)
    names: list[Any] | None = None
    results: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    """Call index -> (reply, mutated arguments), both as written (tagged data)."""
    exit: tuple[int, str] | None = None
    """(call index or -1 while loading, why) when the candidate ended its own run."""
    load_error: tuple[str, str] | None = None
    done: bool = False
    need: dict[str, Any] | None = None
    verdict: tuple[str, str] | None = None
    stdout: str = ""

    def count(self, key: str, n: int = 1) -> None:
        """Add to an audit count."""
        self.audit[key] = min(MAX_COUNT, self.audit.get(key, 0) + n)

    def at_least(self, key: str, n: int) -> None:
        """Raise an audit count to n."""
        self.audit[key] = min(MAX_COUNT, max(self.audit.get(key, 0), n))


def read(stdout: str, nonce: str) -> RunReport:
    """The report of a run whose orders carried `nonce`."""
    report = RunReport()
    kept: list[str] = []
    seen: set[tuple[str, int]] = set()
    for line in stdout.split("\n"):
        if MARK_WORD not in line:
            kept.append(line)
            continue
        if not _take(report, line, nonce, seen):
            report.count("forged_output")
        if kept and not kept[-1]:
            kept.pop()  # a frame is written as "\n<frame>\n": its leading newline is its own
    report.stdout = "\n".join(kept)
    return report


def _take(report: RunReport, line: str, nonce: str, seen: set[tuple[str, int]]) -> bool:
    prefix = f"{MARK} {nonce} "
    if not line.startswith(prefix) or len(line) > MAX_LINE_CHARS:
        return False
    kind, _, text = line[len(prefix) :].partition(" ")
    if kind not in KINDS:
        return False
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return _apply(report, kind, payload, seen)


def _apply(report: RunReport, kind: str, payload: Any, seen: set[tuple[str, int]]) -> bool:
    if kind == "audit":
        if payload not in AUDIT_KEYS + EXTRA_AUDIT_KEYS:
            return False
        report.at_least(payload, 1)
        return True
    once_key = (kind, payload[0] if kind == "result" and _is_list(payload, 3) else -1)
    if once_key in seen:
        return False
    seen.add(once_key)
    if kind == "done" and isinstance(payload, dict):
        for key, value in payload.items():
            if key in AUDIT_KEYS + EXTRA_AUDIT_KEYS and _is_count(value):
                report.at_least(key, value)
        report.done = True
        return True
    if kind == "names" and isinstance(payload, list):
        report.names = payload
        return True
    if kind == "result" and _is_list(payload, 3) and _is_count(payload[0]):
        if isinstance(payload[1], list) and isinstance(payload[2], dict):
            report.results[payload[0]] = (payload[1], payload[2])
            return True
        return False
    if kind == "exit" and _is_list(payload, 2) and isinstance(payload[0], int):
        report.exit = (payload[0], str(payload[1])[:200])
        return True
    if kind == "load" and _is_list(payload, 2):
        report.load_error = (str(payload[0])[:200], str(payload[1])[:300])
        return True
    if kind == "need" and isinstance(payload, dict):
        report.need = payload
        return True
    if kind == "verdict" and _is_list(payload, 2) and isinstance(payload[0], str):
        report.verdict = (payload[0], str(payload[1])[:300])
        return True
    return False


def _is_list(value: Any, length: int) -> bool:
    return isinstance(value, list) and len(value) == length


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
