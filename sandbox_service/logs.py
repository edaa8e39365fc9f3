"""Structured logs: one JSON object per line, carrying the request id of the work being done.

The API takes the request id from `X-Request-ID` (or makes one), puts it in the job payload, and
the worker binds it while it runs that job, so one grep follows a request across processes.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar
from typing import Any

request_id_var: ContextVar[str] = ContextVar("request_id", default="")
"""The request id of the work the current task or thread is doing ("" outside any request)."""

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/@+=-]{1,128}")


def request_id_from_header(value: str | None) -> str:
    """The client's X-Request-ID when it is a sane token, else a fresh id."""
    if value and _REQUEST_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: ts, level, component, logger, msg, request_id, fields."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self._component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "component": self._component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(component: str, level: str = "INFO") -> None:
    """Route every logger (ours, uvicorn's, rq's) to JSON lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(component))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Their per-event INFO lines would double ours; keep their warnings and errors.
    for noisy in ("rq.worker", "rq.job", "rq.queue", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def fields(**values: Any) -> dict[str, Any]:
    """`extra=` for a log call that adds structured fields to its line."""
    return {"fields": values}
