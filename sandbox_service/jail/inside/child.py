"""The child that runs a program: its limits, standard streams, seeds, a fresh __main__, and the
program run like the interpreter would.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import io
import os
import resource
import signal
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any

from . import protocol
from .cell_syntax import notebook_source
from .files import _SCRATCH_PREFIXES, SCRATCH_DIRS
from .finish import finish, report_uncaught
from .imports import _AfterImport
from .outputs import display_value, leave_outputs, record_error
from .shell import shell_of

if TYPE_CHECKING:
    from collections.abc import Callable

# --- the child: becomes the user's program ---------------------------------------------------


def _set_limits(limits: protocol.RunLimits) -> None:
    cpu = limits.cpu_time_s
    fsize = limits.max_file_size_mb * 1024 * 1024
    wanted = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_FSIZE: (fsize, fsize),
        resource.RLIMIT_NOFILE: (limits.max_open_files,) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in wanted.items():
        # Never above the jail's own hard limit, which nsjail set and nothing can raise.
        _, jail_hard = resource.getrlimit(which)
        if jail_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, jail_hard), min(hard, jail_hard)
        resource.setrlimit(which, (soft, hard))


_StdStreams = tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]

_CHILDREN_STD_STREAMS: list[_StdStreams] = []
"""The text streams a program gets on descriptors 0-2 (make_children_std_streams), made once by
the zygote and never used by it: each standby installs its own copy-on-write copy."""


def _std_streams() -> _StdStreams:
    """New text streams over descriptors 0-2, as the interpreter makes for a program."""
    return (
        open(0, encoding="utf-8", errors="strict", closefd=False),
        open(1, "w", encoding="utf-8", errors="strict", closefd=False),
        open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1),
    )


def make_children_std_streams() -> None:
    """Make the streams every standby installs, over a pipe on descriptors 0-2 for the while.

    A stream learns what its descriptor is when it is made (seekable, a terminal, its block
    size) and keeps it; a program's descriptors are pipes, so these are made over one (the
    zygote's own, a log file, would leave a program with a stdout that claims to seek), and the
    zygote's descriptors are put back. Made once here instead of in every child: about 50
    copy-on-write faults and three streams' construction less per run.
    """
    saved = [_dup_above_std(fd) for fd in (0, 1, 2)]
    pipe = os.pipe()
    read_end, write_end = (fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 3) for end in pipe)
    for end in pipe:
        os.close(end)
    try:
        for fd, end in ((0, read_end), (1, write_end), (2, write_end)):
            os.dup2(end, fd)
        streams = _std_streams()
        for stream in streams:
            stream.seekable()  # learnt now, over the pipe
        _CHILDREN_STD_STREAMS[:] = [streams]
    finally:
        for fd, original in enumerate(saved):
            if original is None:
                os.close(fd)
            else:
                os.dup2(original, fd)
                os.close(original)
        os.close(read_end)
        os.close(write_end)


def _dup_above_std(fd: int) -> int | None:
    """A duplicate of fd numbered 3 or more (not in a free slot of 0-2), or None if fd is not
    open."""
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return None


def _install_std_streams(streams: _StdStreams) -> None:
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def _exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def prepare_child() -> None:
    """In a pre-forked child, before any request: everything that does not depend on it.

    Done while the slot is idle, so the copy-on-write page faults of this work stay off the
    execution's critical path; the program's fresh __main__ is made here.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Streams over fds 0-2; the request's pipes are dup2'd under them.
    _install_std_streams(_CHILDREN_STD_STREAMS[0] if _CHILDREN_STD_STREAMS else _std_streams())
    _fresh_main()
    # Touch the compile, exec and print paths once.
    exec(compile("_ = repr([1, 'a', 2.0])", "<warm-up>", "exec"), {"__builtins__": builtins})


def run_child(code_fd: int, limits: protocol.RunLimits) -> None:
    """In the child, once its request came: limits, the program in the __main__ that
    prepare_child made, its exit. Never returns.

    Nothing here reports to the zygote: from the first line of the program on, this process is
    the program's, and the zygote learns how it ended from the kernel alone. Only sys.modules
    holds __main__, so that `finish` can let it go as the interpreter does.
    """
    status = 1
    try:
        with os.fdopen(code_fd, "rb") as f:
            source = f.read().decode("utf-8", errors="surrogateescape")
        _set_limits(limits)
        status = _run_source(source, sys.modules["__main__"].__dict__)
    except BaseException:
        try:
            traceback.print_exc()
        finally:
            status = 1
    finally:
        with contextlib.suppress(BaseException):
            leave_outputs()
        status = finish(status)
        # The program's pipes are closed first, so the worker sees their end without waiting
        # for the kernel's teardown of this address space.
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                os.close(fd)
        os._exit(status)


_MT_KEY_WORDS = 624
_MT_KEY_BYTES = 4 * _MT_KEY_WORDS


def _reseed_random() -> None:
    # A forked child inherits the PRNG states of the process it was forked from: without this,
    # every execution would draw the same numbers. `random` reseeds itself in os.fork's
    # handlers, which fork_lean skips; numpy's legacy global state never does, nor does sympy's
    # own generator (sympy.randprime, its randomised tests), seeded once at its import. The
    # zygote calls this before each standby's fork (the child forked before it never sees the
    # new states), where the code is warm: in a fresh child it cost about 70 copy-on-write
    # faults.
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        # A whole Mersenne Twister key from the kernel, as seed() would make, without its
        # SeedSequence (0.32 -> 0.19 ms of a child's CPU); no Gaussian is left cached.
        key = np.frombuffer(os.urandom(_MT_KEY_BYTES), dtype=np.uint32)
        np.random.set_state(("MT19937", key, _MT_KEY_WORDS, 0, 0.0))
    sympy_random = sys.modules.get("sympy.core.random")
    if sympy_random is not None:
        sympy_random.rng.seed()


_SEEDED_GENERATORS: dict[str, Callable[[types.ModuleType, int], None]] = {
    "random": lambda module, seed: module.seed(seed),  # mpmath draws from it too
    "numpy.random": lambda module, seed: module.seed(seed),  # the global state scipy uses
    "sympy.core.random": lambda module, seed: module.rng.seed(seed),
}
"""The modules whose global generators a seed seeds, and how."""
_SEED: list[int] = []
"""The seed of the current run or cell, for a generator module it imports later."""


def seed_random(seed: int | None) -> None:
    """Seed every generator the jail preloads from `seed` (None: forget the last one), and
    those of SEEDED_GENERATORS imported later in the run. Generators a program makes from
    fresh entropy (numpy's default_rng(), os.urandom, secrets, uuid4) stay unseeded:
    docs/jail.md."""
    _SEED[:] = [] if seed is None else [seed]
    if seed is None:
        return
    for name, apply in _SEEDED_GENERATORS.items():
        module = sys.modules.get(name)
        if module is not None:
            apply(module, seed)


def install_seed_hooks() -> None:
    """Before any import of the generator modules: seed them as they are imported, when the
    run has a seed (cold mode imports them in the program, after the seed is known)."""

    def hook(name: str) -> Callable[[types.ModuleType], None]:
        def seed_on_import(module: types.ModuleType) -> None:
            if _SEED:
                _SEEDED_GENERATORS[name](module, _SEED[0])

        return seed_on_import

    sys.meta_path.insert(0, _AfterImport({name: hook(name) for name in _SEEDED_GENERATORS}))


def _fresh_main() -> dict[str, Any]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins  # the module, as in a script's __main__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.path.insert(0, "")  # as `python -c`: the working directory is importable
    return main.__dict__


def _run_source(source: str, namespace: dict[str, Any] | None = None, cell: bool = False) -> int:
    """Run a program (or a notebook cell) like the interpreter would; return its exit status."""
    if namespace is None:
        namespace = _fresh_main()
    _forget_scratch_listings()
    try:
        if cell:
            _run_cell(source, namespace)
        else:
            exec(compile(source, "<string>", "exec"), namespace)
    except SystemExit as exc:
        code = _exit_code_of(exc)
        if cell and code:  # a notebook shows it as the cell's error
            record_error(exc, _program_frames(exc.__traceback__))
        return code
    except BaseException as exc:
        # The traceback starts at the program, as with `python -c`.
        tb = _program_frames(exc.__traceback__)
        record_error(exc, tb)
        if cell:  # a notebook shows it itself, whatever sys.excepthook is
            traceback.print_exception(type(exc), exc, tb)
        else:
            report_uncaught(exc, tb)
        return 1
    return 0


_INSIDE_DIR = os.path.dirname(__file__)
"""Where the modules of the in-jail program are: their frames are not the program's."""


def _program_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback less the in-jail program's frames (the runner's, a cell's, display's): the
    model sees only its program's own lines, whatever ran them."""
    kept = []
    while tb is not None:
        if os.path.dirname(tb.tb_frame.f_code.co_filename) != _INSIDE_DIR:
            kept.append(tb)
        tb = tb.tb_next
    for frame, following in zip(kept, [*kept[1:], None], strict=True):
        frame.tb_next = following
    return kept[0] if kept else None


def _forget_scratch_listings() -> None:
    """Drop the import system's cached listings of the writable directories, where the program's
    input files (or an earlier cell's) may have appeared. The rest of sys.path is read-only:
    importlib.invalidate_caches() would cost 0.8 ms of a fresh child's copy-on-write faults."""
    for path, finder in list(sys.path_importer_cache.items()):
        if path in SCRATCH_DIRS or path.startswith(_SCRATCH_PREFIXES):
            invalidate = getattr(finder, "invalidate_caches", None)
            if invalidate:
                invalidate()


def _run_cell(source: str, namespace: dict[str, Any]) -> None:
    """Notebook semantics: notebook syntax (`!cmd`, magics) turned into Python, the statements
    run, the last expression's value (not None) printed and displayed."""
    import ast

    python = notebook_source(source)
    if python is not source:
        shell_of(namespace)  # `get_ipython()`, which the transformed cell calls
    tree = ast.parse(python, "<cell>", "exec")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            display_value(value)
