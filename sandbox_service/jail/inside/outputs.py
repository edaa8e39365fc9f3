"""Rich outputs of a run: displayed values, matplotlib figures and the program's error, left by
the child in a file of its scratch and read back by the zygote for the answer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import sys
import traceback
import types
from typing import Any

from . import protocol
from .files import _open_beneath
from .formatters import mime_bundle
from .imports import _AfterImport


def install_matplotlib_hooks(cache_dir: str | None) -> None:
    """Before any import of matplotlib: its font list from `cache_dir`, pyplot's show."""

    def on_matplotlib(module: types.ModuleType) -> None:
        if cache_dir is not None:
            setattr(module, "get_cachedir", lambda: cache_dir)  # noqa: B010

    def on_pyplot(module: types.ModuleType) -> None:
        setattr(module, "show", show_figures)  # noqa: B010

    hooks = {"matplotlib": on_matplotlib, "matplotlib.pyplot": on_pyplot}
    sys.meta_path.insert(0, _AfterImport(hooks))


# --- rich outputs: displays (figures, a cell's value) and the uncaught exception -------------

OUTPUTS_FILE = "/tmp/.rl-sandbox-outputs.json"
"""Where the program's process leaves its rich outputs for the zygote, once the program (or
cell) is over; the zygote reads it with a bound, validates it, and removes it."""
_OUTPUTS: dict[str, Any] = {"display": [], "error": None}
"""What the program in this process has displayed, and the exception that ended it."""


def preload_matplotlib() -> None:
    """pyplot on Agg, its font list loaded and one figure rendered, once in the zygote.

    `plt.show()` displays the open figures and closes them, as Jupyter's inline backend does
    (Agg alone would only warn); install_matplotlib_hooks does the same for an import in a run.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    plt.show = show_figures
    _forget_zygote_config_dir(matplotlib)
    figure = plt.figure()
    figure.gca().plot([0, 1], [0, 1], label="warm-up")
    figure.gca().set_title("warm-up")
    figure.gca().legend()
    _png_of(figure)
    plt.close("all")
    # The fonts that rendering opened read their files through descriptors, which a standby
    # closes before the program starts (_close_all_but): a program's text would be read
    # through a closed (or reused) descriptor, "failed to load glyph". Each run opens its own.
    font_manager = sys.modules.get("matplotlib.font_manager")
    get_font = getattr(font_manager, "_get_font", None)
    if get_font is not None and hasattr(get_font, "cache_clear"):
        get_font.cache_clear()


def _forget_zygote_config_dir(matplotlib: Any) -> None:
    """The zygote cannot write the program's home, so matplotlib made itself a temporary config
    directory and registered its removal at exit: in a child (another uid, another /tmp) that
    removal would fail on stderr. The path stays cached, and names nothing: matplotlib only
    reads a configuration there, and its cache directory is the worker's font list."""
    import atexit
    import shutil

    atexit.unregister(shutil.rmtree)
    get_configdir = getattr(matplotlib, "get_configdir", None)
    path = str(get_configdir()) if get_configdir is not None else ""
    if path.startswith("/tmp/matplotlib-"):
        shutil.rmtree(path, ignore_errors=True)


def show_figures(*_args: Any, **_kwargs: Any) -> None:
    """Display every open matplotlib figure as image/png, then close them all."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for number in plt.get_fignums():
        _OUTPUTS["display"].append({"image/png": _png_of(plt.figure(number))})
    plt.close("all")


def _png_of(figure: Any) -> str:
    import base64

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode()


def display_value(value: Any) -> None:
    """A cell's last expression: its repr printed, as in a notebook, and displayed with its
    rich representations (formatters.mime_bundle)."""
    text = repr(value)
    print(text)
    _OUTPUTS["display"].append(mime_bundle(value, text))


def record_error(exc: BaseException, tb: types.TracebackType | None) -> None:
    """The exception that ended the program or cell, in Jupyter's terms."""
    _OUTPUTS["error"] = {
        "ename": type(exc).__name__,
        "evalue": str(exc),
        "traceback": traceback.format_exception(type(exc), exc, tb),
    }


def leave_outputs() -> None:
    """In the program's process, after it ran: its displays (open figures included) and error
    into OUTPUTS_FILE, within the size the zygote accepts; cleared for the next cell."""
    try:
        show_figures()
    except Exception:
        traceback.print_exc()  # a figure that cannot render is the program's error, not ours
    display, error = _OUTPUTS["display"], _OUTPUTS["error"]
    _OUTPUTS["display"], _OUTPUTS["error"] = [], None
    if not display and error is None:
        return
    kept, size = [], 0
    for item in display:
        size += sum(len(v) for v in item.values())
        if size > protocol.MAX_OUTPUTS_BYTES // 2:
            break
        kept.append(item)
    body = json.dumps({"display": kept, "error": error}).encode()
    if len(body) > protocol.MAX_OUTPUTS_BYTES:
        body = json.dumps({"display": [], "error": error}).encode()[: protocol.MAX_OUTPUTS_BYTES]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        fd = os.open(OUTPUTS_FILE, flags, 0o600)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def take_outputs() -> protocol.Outputs:
    """The zygote's side: the run's outputs file, read without following links or blocking,
    bounded and validated (the program could have written anything there), then removed."""
    try:
        fd = _open_beneath(OUTPUTS_FILE, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return protocol.Outputs()
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return protocol.Outputs()
            data = f.read(protocol.MAX_OUTPUTS_BYTES + 1)
        if len(data) > protocol.MAX_OUTPUTS_BYTES:
            return protocol.Outputs()
        return protocol.Outputs.from_wire(protocol.decode_body(data))
    except (OSError, protocol.ProtocolError):
        return protocol.Outputs()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(OUTPUTS_FILE)
