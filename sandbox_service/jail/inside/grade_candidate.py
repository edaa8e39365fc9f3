"""The program `POST /grade` runs in the candidate's jail: it loads the candidate and serves calls.

Sent as an ordinary execution's `code` (this file's source, then `main()`), with its orders as
JSON on stdin, read whole before the candidate's code is even compiled:

    stdin   {"n": nonce, "code": candidate source, "names": bool, "only": [name, ...] | null,
             "calls": [request, ...]}
    request {"t": target, "a": [arg, ...], "k": {name: arg}}, target one of
            ["entry", name]   the top-level callable `name`, else `Solution().name`
            ["name", name]    the candidate's top-level binding `name`, called
            ["call", h]       the handle h, called
            ["getattr", h, attribute] / ["iter", h] / ["next", h] / ["len", h] / ["getitem", h]
    stdout  the candidate's own output, and lines `\\x1eRLSB-GRADE <nonce> <kind> <json>`:
            audit <key>                 the first time the candidate attempts a `key`
            names [[name, value], ...]  its top-level names (value: tagged data, or ["Q"]
                                        for a callable), when asked
            result [k, reply, mutated]  the k-th call's reply: ["ok", tagged] or
                                        ["raise", type name, message]; mutated: {arg index:
                                        tagged} for list, dict and set arguments
            exit [k, why]               the candidate ended its own run (k -1: while loading)
            load [type name, message]   its code raised while loading
            done {key: count}           every call answered; the audit's totals

Tagged data is JSON: ["N"], ["B", bool], ["I", hex], ["F", float.hex], ["C", hex, hex],
["S", str], ["Y", hex], ["L"|"T"|"E"|"Z", [items]] (list, tuple, set, frozenset),
["D", [[key, value], ...]], and ["H", n, type name] for anything else (an opaque handle).
Conversion uses references taken before the candidate runs and exact type checks only, so a
subclass of a built-in type, or an object with a clever `__eq__`, crosses as a handle. What the
candidate does to this process can change what it reports, never what the grader expects:
expected values, tests and their code are never sent here. Standard library only, and it must
not import sandbox_service (the jail's interpreter does not see the service's packages).
"""

from __future__ import annotations

import atexit
import builtins
import collections
import contextlib
import json
import os
import sys
import types
from typing import Any

MARK = "\x1eRLSB-GRADE"
MAX_DEPTH = 64
MAX_NODES = 200_000
MESSAGE_CHARS = 300
EXIT_NAMES = ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "SkipTest", "Skipped")
"""Exceptions that end a run rather than report a failure (unittest's and pytest's skips)."""
WATCHED_MODULES: dict[str, tuple[str, ...] | None] = {
    **dict.fromkeys(("math", "cmath", "operator", "json", "random", "re", "collections")),
    **dict.fromkeys(("functools", "copy", "unittest", "pytest", "sys", "builtins")),
    "os": ("_exit", "kill", "abort", "system", "fork", "execv", "write", "getpid"),
    "numpy": ("allclose", "isclose", "array_equal", "array_equiv", "equal", "testing", "ndarray"),
}
"""Modules (all their attributes, or the ones named) that the audit compares before and after
(`replaced_modules`). Each is read again in every forked run, and every object read costs its
page's copy-on-write fault: so the list is of what a tester compares with, not everything."""

_write = os.write
_dumps = json.dumps
_loads = json.loads
_exit = os._exit
_type = type
_len = len
_isinstance = isinstance
_callable = callable
_repr = repr
_id = id
_str_new = str
_list = list
_dict_items = dict.items
_hex_int = int.__format__
_float_hex = float.hex


class _TooBig(Exception):
    pass


class Harness:
    """The candidate's side of one grading run."""

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce
        self.counts: dict[str, int] = {}
        self.handles: list[Any] = []
        self.held: list[str] = []
        self.bound_ports: set[int] = set()
        self.numpy_scalars: tuple[type, ...] = ()
        self.numpy_array: type | None = None
        self.know_numpy()

    def know_numpy(self) -> None:
        """numpy's types, once it is imported: at the start where the zygote preloads it, else
        after the candidate loaded (a numpy it replaced could only claim values, which a
        candidate may claim by returning them; expected values never enter the jail)."""
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy_array is None:
            self.numpy_array = numpy.ndarray
            self.numpy_scalars = (numpy.generic,)
            self.numpy_item = numpy.generic.item
            self.numpy_tolist = numpy.ndarray.tolist
        self.collection_types = {
            collections.Counter: "D",
            collections.OrderedDict: "D",
            collections.defaultdict: "D",
            collections.deque: "L",
        }
        self.builtins_before = dict(builtins.__dict__)
        self.modules_before = {
            name: sys.modules[name] for name in WATCHED_MODULES if name in sys.modules
        }
        self.module_dicts = {
            name: _attributes(module, WATCHED_MODULES[name])
            for name, module in self.modules_before.items()
            if name not in ("sys", "builtins")
        }
        self.hooks_before = _hooks()
        self.stdout = sys.stdout
        self.stderr = sys.stderr

    # --- the report channel ---------------------------------------------------------------

    def line(self, kind: str, payload: object, held: bool = False) -> None:
        """Write a frame; a `held` one waits for the next unheld one (one write for the replies
        and the final frame; a run that ends in between loses only replies it cannot use)."""
        text = f"\n{MARK} {self.nonce} {kind} {_dumps(payload, separators=(',', ':'))}\n"
        self.held.append(text)
        if held:
            return
        self.flush()
        data = "".join(self.held).encode("utf-8", "surrogatepass")
        self.held.clear()
        while data:
            data = data[_write(1, data) :]

    def flush(self) -> None:
        for stream in (self.stdout, self.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()

    def count(self, key: str, n: int = 1) -> None:
        first = key not in self.counts
        self.counts[key] = self.counts.get(key, 0) + n
        if first:
            self.line("audit", key)

    # --- the audit hook ---------------------------------------------------------------------

    def on_event(self, event: str, args: tuple[Any, ...]) -> None:
        if event in ("os.kill", "os.killpg", "signal.pthread_kill", "signal.raise_signal"):
            self.count("signals_sent")
        elif event in ("socket.bind",):
            port = _port_of(args[1] if _len(args) > 1 else None)
            if port is not None:
                self.bound_ports.add(port)
        elif event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
            address = args[1] if _len(args) > 1 else None
            if not (_is_loopback(address) and _port_of(address) in self.bound_ports):
                self.count("network_attempts")
        elif event == "socket.__new__" and _len(args) > 2 and _is_datagram(args[1], args[2]):
            self.count("network_attempts")
        elif event == "open":
            if _writes(args):
                self.count("files_written")
        elif event in ("os.remove", "os.rename", "os.mkdir", "os.truncate", "os.symlink"):
            self.count("files_written")
        elif (
            event in ("sys.settrace", "sys.setprofile", "sys.addaudithook")
            or event.startswith("sys.monitoring")
            or event == "sys._setprofileallthreads"
        ):
            self.count("hooks_installed")
        elif event.startswith("ctypes."):
            self.count("ctypes_uses")
        elif event in INTROSPECTION_EVENTS:
            self.count("introspection")
        elif event == "_thread.start_new_thread":
            self.count("threads_started")
        elif event in ("os.fork", "os.forkpty", "subprocess.Popen", "os.system", "os.posix_spawn"):
            self.count("processes_started")
        elif event == "os.exec":
            self.count("early_exits")

    # --- conversion to tagged plain data -------------------------------------------------

    def tag(self, value: Any) -> Any:
        self.know_numpy()
        budget = [MAX_NODES]
        return self._tag(value, 0, budget)

    def _tag(self, value: Any, depth: int, budget: list[int]) -> Any:
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_DEPTH:
            raise _TooBig
        kind = _type(value)
        if value is None:
            return ["N"]
        if kind is bool:
            return ["B", value is True]
        if kind is int:
            return ["I", _hex_int(value, "x")]
        if kind is float:
            return ["F", _float_hex(value)]
        if kind is complex:
            return ["C", _float_hex(value.real), _float_hex(value.imag)]
        if kind is str:
            return ["S", _str_new(value)]
        if kind is bytes:
            return ["Y", bytes.hex(value)]
        if kind in (list, tuple, set, frozenset, collections.deque):
            tags: dict[type, str] = {list: "L", tuple: "T", set: "E", frozenset: "Z"}
            tag = tags.get(kind, "L")
            return [tag, [self._tag(item, depth + 1, budget) for item in _list(value)]]
        if kind in (dict, collections.Counter, collections.OrderedDict, collections.defaultdict):
            pairs = _list(_dict_items(value))
            return [
                "D",
                [
                    [self._tag(k, depth + 1, budget), self._tag(v, depth + 1, budget)]
                    for k, v in pairs
                ],
            ]
        if self.numpy_array is not None and kind is self.numpy_array:
            return self._tag(self.numpy_tolist(value), depth, budget)
        if self.numpy_scalars and _is_numpy_scalar(kind, self.numpy_scalars):
            return self._tag(self.numpy_item(value), depth, budget)
        self.handles.append(value)
        self.count("opaque_values")
        return ["H", _len(self.handles) - 1, _type_name(kind)]

    def untag(self, tagged: Any) -> Any:
        tag = tagged[0]
        if tag == "N":
            return None
        if tag == "B":
            return bool(tagged[1])
        if tag == "I":
            return int(tagged[1], 16)
        if tag == "F":
            return float.fromhex(tagged[1])
        if tag == "C":
            return complex(float.fromhex(tagged[1]), float.fromhex(tagged[2]))
        if tag == "S":
            return str(tagged[1])
        if tag == "Y":
            return bytes.fromhex(tagged[1])
        if tag in ("L", "T", "E", "Z"):
            items = [self.untag(item) for item in tagged[1]]
            return {"L": list, "T": tuple, "E": set, "Z": frozenset}[tag](items)
        if tag == "D":
            return {self.untag(k): self.untag(v) for k, v in tagged[1]}
        if tag == "H":
            return self.handles[int(tagged[1])]
        raise ValueError(f"unknown tag {tag!r}")

    # --- the audit's after-the-fact checks -----------------------------------------------

    def inspect(self) -> None:
        now = builtins.__dict__
        replaced = sum(1 for k, v in self.builtins_before.items() if now.get(k, _MISSING) is not v)
        added = sum(1 for k in now if k not in self.builtins_before)
        self._at_least("replaced_builtins", replaced + added)
        modules = sum(
            1 for k, v in self.modules_before.items() if sys.modules.get(k, _MISSING) is not v
        )
        for name, before in self.module_dicts.items():
            module = self.modules_before[name]
            after = module.__dict__
            modules += sum(1 for k, v in before.items() if after.get(k, _MISSING) is not v)
        self._at_least("replaced_modules", modules)
        hooks = sum(
            1
            for a, b in zip(self.hooks_before, _hooks(), strict=True)
            if (a != b if _type(a) is int else a is not b)
        )
        self._at_least("hooks_installed", hooks)

    def _at_least(self, key: str, n: int) -> None:
        if n > self.counts.get(key, 0):
            self.count(key, n - self.counts.get(key, 0))


_MISSING = object()
INTROSPECTION_EVENTS = frozenset(
    {"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers"}
    | {"gc.get_referents", "object.__getattr__"}
)
"""Events of a program reading other code's frames or objects (the grader's, it hopes)."""


def _hooks() -> tuple[Any, ...]:
    """Every hook a program can install that is visible from Python, by identity."""
    threading = sys.modules.get("threading")
    monitoring = getattr(sys, "monitoring", None)
    tools = tuple(monitoring.get_tool(t) for t in range(6)) if monitoring is not None else ()
    return (
        *(sys.excepthook, sys.displayhook, sys.unraisablehook, sys.breakpointhook),
        *(sys.gettrace(), sys.getprofile()),
        *((threading.gettrace(), threading.getprofile()) if threading is not None else ()),
        *tools,
        _atexit_count(),
    )


def _atexit_count() -> int:
    # An exit handler is a hook too: a naive grader's process runs it after a failed assert, and
    # it can os._exit(0) there.
    return atexit._ncallbacks()


def _is_numpy_scalar(kind: type, bases: tuple[type, ...]) -> bool:
    # A numpy scalar type is one numpy defines (the candidate may subclass one: a handle then).
    return issubclass(kind, bases) and _type_module(kind) == "numpy"


def _type_module(kind: type) -> str:
    module = type.__dict__["__module__"].__get__(kind)
    return module if _type(module) is str else ""


def _type_name(kind: type) -> str:
    name = type.__dict__["__name__"].__get__(kind)
    return name[:100] if _type(name) is str else "?"


def _port_of(address: Any) -> int | None:
    if _type(address) is tuple and _len(address) >= 2 and _type(address[1]) is int:
        port: int = address[1]
        return port
    return None


def _is_datagram(family: Any, kind: Any) -> bool:
    # Linux numbers (AF_INET 2, AF_INET6 10, SOCK_STREAM 1): an internet socket for datagrams
    # or raw packets exists only to send them (the jail refuses to make one).
    return family in (2, 10) and _type(kind) is int and (kind & 0xF) != 1


def _is_loopback(address: Any) -> bool:
    if _type(address) is not tuple or not address or _type(address[0]) is not str:
        return False
    host = address[0]
    return host in ("localhost", "::1", "0.0.0.0", "") or host.startswith("127.")


def _writes(args: tuple[Any, ...]) -> bool:
    mode = args[1] if _len(args) > 1 else None
    flags = args[2] if _len(args) > 2 else 0
    if _type(mode) is str and any(c in mode for c in "wax+"):
        return True
    written = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    return _type(flags) is int and bool(flags & written)


def _exception_text(exc: BaseException) -> tuple[str, str]:
    name = _type_name(_type(exc))
    try:
        message = _str_new(BaseException.__str__(exc))
    except BaseException:
        message = ""
    return name, message[:MESSAGE_CHARS]


def _ends_run(exc: BaseException) -> bool:
    mro = type.__dict__["__mro__"].__get__(_type(exc))
    return any(_type_name(kind) in EXIT_NAMES for kind in mro)


def _load(code: str) -> dict[str, Any]:
    module = types.ModuleType("solution")
    module.__dict__["__builtins__"] = builtins
    sys.modules["solution"] = module
    exec(compile(code, "solution.py", "exec"), module.__dict__)
    return module.__dict__


def _attributes(module: Any, names: tuple[str, ...] | None) -> dict[str, Any]:
    found = module.__dict__
    if names is None:
        return dict(found)
    return {name: found[name] for name in names if name in found}


def _names(
    harness: Harness, namespace: dict[str, Any], only: list[str] | None, preloaded: set[str]
) -> list[Any]:
    found = []
    for name, value in _list(namespace.items()):
        if _type(name) is not str or name.startswith("__"):
            continue
        if only is not None and name not in only:
            continue
        if only is None and (name in harness.builtins_before or name in preloaded):
            continue
        if only is None and _type(value) is types.ModuleType:
            continue
        found.append([name, ["Q"] if _callable(value) else harness.tag(value)])
        if _len(found) >= 256:
            break
    return found


def _target(namespace: dict[str, Any], harness: Harness, target: list[Any]) -> Any:
    kind = target[0]
    if kind == "entry":
        name = target[1]
        found = namespace.get(name)
        if found is not None and _callable(found) and _type(found) is not type:
            return found
        solution = namespace.get("Solution")
        if solution is not None:
            return getattr(solution(), name)
        if found is not None:
            return found
        raise NameError(f"the candidate defines no {name!r} (nor Solution().{name})")
    if kind == "name":
        return namespace[target[1]]
    return harness.handles[int(target[1])]


def _serve(namespace: dict[str, Any], harness: Harness, request: dict[str, Any]) -> Any:
    target = request["t"]
    subject = _target(namespace, harness, target)
    args = [harness.untag(a) for a in request.get("a", [])]
    kwargs = {k: harness.untag(v) for k, v in request.get("k", {}).items()}
    operation = target[0]
    if operation in ("entry", "name", "call"):
        result = subject(*args, **kwargs)
    elif operation == "getattr":
        result = getattr(subject, target[2])
    elif operation == "iter":
        result = iter(subject)
    elif operation == "next":
        result = next(subject)
    elif operation == "len":
        result = len(subject)
    elif operation == "getitem":
        result = subject[args[0]]
    else:
        raise ValueError(f"unknown operation {operation!r}")
    return result, args


def main() -> None:
    """Read the orders, load the candidate, answer each call; never return to the zygote."""
    orders = _loads(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
    harness = Harness(str(orders["n"]))
    sys.addaudithook(harness.on_event)
    try:
        _run(harness, orders)
    except BaseException as exc:
        harness.line("exit", [-2, _exception_text(exc)[0]])
    harness.flush()
    _exit(0)


def _run(harness: Harness, orders: dict[str, Any]) -> None:
    # Taken before the candidate's module joins sys.modules (as "solution", a name a candidate's
    # own function may have: HumanEval/121's entry point).
    preloaded = (
        {name.partition(".")[0] for name in _list(sys.modules)} if orders.get("names") else set()
    )
    try:
        namespace = _load(orders["code"])
    except BaseException as exc:
        harness.inspect()
        if _ends_run(exc):
            harness.count("early_exits")
            harness.line("exit", [-1, _exception_text(exc)[0]])
        else:
            harness.line("load", _exception_text(exc))
        return
    harness.inspect()
    if orders.get("names"):
        names = _names(harness, namespace, orders.get("only"), preloaded)
        harness.line("names", names, held=True)
    for index, request in enumerate(orders.get("calls", [])):
        try:
            result, args = _serve(namespace, harness, request)
        except StopIteration:
            reply: list[Any] = ["stop"]
            args = []
        except BaseException as exc:
            if _ends_run(exc):
                harness.count("early_exits")
                harness.inspect()
                harness.line("exit", [index, _exception_text(exc)[0]])
                return
            reply, args = ["raise", *_exception_text(exc)], []
        else:
            try:
                reply = ["ok", harness.tag(result)]
            except _TooBig:
                reply = ["raise", "ValueError", "the value is too large or too deep to report"]
        mutated = {}
        for position, arg in enumerate(args):
            if _type(arg) in (list, dict, set):
                with contextlib.suppress(_TooBig):
                    mutated[str(position)] = harness.tag(arg)
        harness.line("result", [index, reply, mutated], held=True)
    harness.inspect()
    harness.line("done", harness.counts)
