"""The end of a program as the interpreter ends it: its uncaught exception through
sys.excepthook, then threads, atexit, the standard streams' flush and the finalizers of what
__main__ held (CPython's Py_RunMain and Py_FinalizeEx, in their order).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import types

FLUSH_FAILED_STATUS = 120
"""The interpreter's exit status when flushing a standard stream fails at exit, whatever the
program's own status was (Py_RunMain, Py_Exit)."""


def report_uncaught(exc: BaseException, tb: types.TracebackType | None) -> None:
    """Hand an uncaught exception to sys.excepthook, as the interpreter does (PyErr_Print).

    The default hook prints the traceback; a program's own hook is called instead, and if it
    raises, both tracebacks are printed as CPython prints them.
    """
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    sys.last_exc = exc
    hook = getattr(sys, "excepthook", None)
    if hook is None or hook is sys.__excepthook__:
        traceback.print_exception(type(exc), exc, tb)
        return
    try:
        hook(type(exc), exc, tb)
    except BaseException as hook_exc:  # the interpreter reports it and goes on
        with contextlib.suppress(BaseException):
            print("Error in sys.excepthook:", file=sys.stderr)
            traceback.print_exception(hook_exc)
            print("\nOriginal exception was:", file=sys.stderr)
            traceback.print_exception(type(exc), exc, tb)


def finish(status: int) -> int:
    """After the program: non-daemon threads joined, atexit functions, the standard streams
    flushed, then __main__ let go (the finalizers of what it held run, in the collector's
    order, with its globals still in place); the exit status the interpreter would give."""
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    if not _flush_std_streams():
        status = FLUSH_FAILED_STATUS
    with contextlib.suppress(BaseException):
        _release_main()
    _flush_std_streams()  # what finalizers printed
    return status


def _flush_std_streams() -> bool:
    """Flush sys.stdout and sys.stderr unless closed or None (flush_std_files); whether both
    flushed. A failure of stdout's is reported as an unraisable exception, as CPython does."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None or _is_closed(stream):
            continue
        try:
            stream.flush()
        except BaseException as exc:
            ok = False
            if stream is sys.stdout:
                _report_unraisable(exc, stream)
    return ok


def _is_closed(stream: object) -> bool:
    try:
        return bool(getattr(stream, "closed", False))
    except BaseException:  # CPython takes a failing `closed` as open
        return False


def _report_unraisable(exc: BaseException, stream: object) -> None:
    with contextlib.suppress(BaseException):
        err = sys.stderr
        if err is None or _is_closed(err):
            return
        err.write(f"Exception ignored in: {stream!r}\n")
        err.write("".join(traceback.format_exception(exc)))
        err.flush()


def _release_main() -> None:
    """Drop __main__ and the last exception (which holds its frames), then collect: what the
    program's names alone held is finalized, as at the interpreter's finalization."""
    import gc

    sys.last_type = sys.last_value = sys.last_traceback = sys.last_exc = None  # type: ignore[assignment]
    sys.modules.pop("__main__", None)
    gc.collect()
