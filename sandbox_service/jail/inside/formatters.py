"""A value's rich representations, as IPython's display formatter finds them: text/plain is its
repr; `_repr_html_`, `_repr_markdown_`, `_repr_json_`, `_repr_latex_`, `_repr_svg_`,
`_repr_png_` and `_repr_mimebundle_` add the others a notebook shows (a pandas DataFrame's
HTML table, a sympy expression's LaTeX).
"""

from __future__ import annotations

import base64
import json
import sys
import traceback
from typing import Any

REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("application/json", "_repr_json_"),
    ("text/latex", "_repr_latex_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
)
"""Each representation's mime type and the method that gives it, in IPython's order."""
RICH_MIME_TYPES = tuple(mime for mime, _ in REPR_METHODS)


def mime_bundle(value: Any, text: str) -> dict[str, str]:
    """Every representation of `value` (text/plain is `text`), each a string: application/json
    as JSON text, image/png as base64. A method that is missing, returns None or fails adds
    nothing (a failure is reported on stderr, as IPython reports it)."""
    bundle: dict[str, str] = {"text/plain": text}
    for mime, data in _from_mimebundle(value).items():
        bundle.setdefault(mime, data)
    for mime, method_name in REPR_METHODS:
        if mime in bundle:
            continue
        method = _method(value, method_name)
        if method is None:
            continue
        try:
            data = method()
        except Exception:  # the value's bug, shown, not the cell's failure
            print(f"{type(value).__name__}.{method_name} failed:", file=sys.stderr)
            traceback.print_exc()
            continue
        if isinstance(data, tuple) and len(data) == 2:  # (data, metadata)
            data = data[0]
        encoded = _encoded(mime, data)
        if encoded is not None:
            bundle[mime] = encoded
    return bundle


def _method(value: Any, name: str) -> Any:
    """The bound method `name` of the value's class (not an attribute an instance answers
    for any name, as a mock's __getattr__ does: IPython looks it up on the class too)."""
    if isinstance(value, type) or getattr(type(value), name, None) is None:
        return None
    method = getattr(value, name, None)
    return method if callable(method) else None


def _from_mimebundle(value: Any) -> dict[str, str]:
    method = _method(value, "_repr_mimebundle_")
    if method is None:
        return {}
    try:
        data = method(include=None, exclude=None)
    except Exception:
        print(f"{type(value).__name__}._repr_mimebundle_ failed:", file=sys.stderr)
        traceback.print_exc()
        return {}
    if isinstance(data, tuple) and len(data) == 2:
        data = data[0]
    if not isinstance(data, dict):
        return {}
    found = {}
    for mime in RICH_MIME_TYPES:
        encoded = _encoded(mime, data.get(mime))
        if encoded is not None:
            found[mime] = encoded
    return found


def _encoded(mime: str, data: object) -> str | None:
    """One representation as the string a display carries, or None if it is not one."""
    if data is None:
        return None
    if mime == "application/json":
        try:
            return json.dumps(json.loads(data) if isinstance(data, str) else data)
        except (TypeError, ValueError):
            return None
    if mime == "image/png":
        if isinstance(data, bytes | bytearray | memoryview):
            return base64.b64encode(bytes(data)).decode()
        return data if isinstance(data, str) else None
    return data if isinstance(data, str) else None
