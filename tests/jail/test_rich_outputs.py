"""Rich outputs and the environment programs rely on (spec "Inside the jail"), in real jails.

Figures come back as image/png displays, a session cell's value as text/plain, an uncaught
exception as ename/evalue/traceback; loopback serves and `localhost` resolves; /mnt is writable
and private to one run.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.jail.inside.outputs import OUTPUTS_FILE
from sandbox_service.jail.policy import MATPLOTLIB_CACHE_IN_JAIL
from sandbox_service.jail.sessions import SessionPool
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT
from tests.jail.conftest import RunFn

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT = """
import matplotlib.pyplot as plt
fig = plt.figure(figsize=(4, 3), dpi=50)
plt.plot([1, 2, 3], [1, 4, 9])
plt.title('squares')
"""


def png_size(data_b64: str) -> tuple[int, int]:
    """Width and height of a base64 PNG; fails unless it is one."""
    data = base64.b64decode(data_b64, validate=True)
    assert data[:8] == PNG_SIGNATURE, data[:16]
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_an_open_figure_comes_back_as_a_png_of_its_size(run: RunFn) -> None:
    result = run(PLOT, timeout_s=30)
    assert result.status == Status.OK, result.stderr
    assert [list(item) for item in result.display] == [["image/png"]]
    assert png_size(result.display[0]["image/png"]) == (200, 150)
    # The font list comes from the worker's read-only cache, in warm and cold mode alike: a
    # font scan would say "Matplotlib is building the font cache" (or a Fontconfig error).
    assert result.stderr == ""


@pytest.fixture(scope="module")
def full_preload() -> Iterator[JailExecutor]:
    settings = Settings(cgroup_parent=JAIL_CGROUP_PARENT, preload="full")
    ex = JailExecutor(settings, slot=14, mode="warm")
    yield ex
    ex.close()


def test_with_matplotlib_preloaded_a_figure_with_text_renders(full_preload: JailExecutor) -> None:
    # The zygote renders a figure to warm pyplot up; the fonts it opened then read their files
    # through descriptors that each standby closes before the program: "failed to load glyph".
    for _ in range(2):
        result = full_preload.run(ExecutionSpec(code=PLOT, limits=Limits(timeout_s=30)))
        assert result.status == Status.OK, result.stderr
        assert png_size(result.display[0]["image/png"]) == (200, 150)
        assert result.stderr == ""


def test_the_font_list_is_read_only_and_no_run_writes_one(run: RunFn) -> None:
    code = PLOT + (
        "import os, matplotlib\n"
        "cache = matplotlib.get_cachedir()\n"
        "print(cache, sorted(os.listdir(cache)))\n"
        "try:\n"
        "    open(os.path.join(cache, 'fontlist-v0.json'), 'w')\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
        "print([os.path.join(d, f) for d, _, fs in os.walk('/home/sandbox') for f in fs])\n"
    )
    result = run(code, timeout_s=30)
    assert result.status == Status.OK, result.stderr
    listing, refused, home_files = result.stdout.splitlines()
    assert listing.startswith(MATPLOTLIB_CACHE_IN_JAIL + " ['fontlist-v"), listing
    assert refused in ("OSError", "PermissionError"), refused
    assert "fontlist" not in home_files, home_files


def test_show_displays_and_closes_figures_in_order(run: RunFn) -> None:
    code = PLOT + "plt.show()\nplt.figure(figsize=(2, 2), dpi=50)\nplt.plot([0, 1])\n"
    result = run(code, timeout_s=30)
    assert result.status == Status.OK, result.stderr
    sizes = [png_size(item["image/png"]) for item in result.display]
    assert sizes == [(200, 150), (100, 100)]


def test_a_program_without_figures_has_no_display_and_its_error_is_structured(
    run: RunFn,
) -> None:
    ok = run("print(1)")
    assert ok.display == () and ok.error is None
    failed = run("def f():\n    raise KeyError('k')\nf()")
    assert failed.status == Status.ERROR and failed.error is not None
    assert (failed.error.ename, failed.error.evalue) == ("KeyError", "'k'")
    assert failed.error.traceback[0] == "Traceback (most recent call last):\n"
    assert failed.error.traceback[-1] == "KeyError: 'k'\n"
    assert "".join(failed.error.traceback) in failed.stderr


def test_a_traceback_shows_only_the_programs_own_frames(run: RunFn) -> None:
    failed = run("def f():\n    return undefined_name\n\nf()")
    assert failed.error is not None and failed.error.ename == "NameError"
    shown = "".join(failed.error.traceback)
    assert shown == (
        "Traceback (most recent call last):\n"
        '  File "<string>", line 4, in <module>\n'
        '  File "<string>", line 2, in f\n'
        "NameError: name 'undefined_name' is not defined\n"
    )
    assert "zygote" not in failed.stderr and shown in failed.stderr


@pytest.mark.parametrize(
    "forgery",
    [
        "open(PATH, 'w').write(json.dumps({'display': [{'text/javascript': 'x'}], 'error': None}))",
        "open(PATH, 'w').write(json.dumps({'display': [{'image/png': 1}]}))",
        "open(PATH, 'w').write('{' * 100000)",
        "open(PATH, 'w').write('x' * (9 << 20))",
        "os.symlink('/etc/passwd', PATH)",
        "os.mkfifo(PATH)",
    ],
    ids=["mime", "type", "nesting", "size", "symlink", "fifo"],
)
def test_a_forged_outputs_file_is_dropped_by_the_zygote(run: RunFn, forgery: str) -> None:
    # The program writes the outputs file itself and exits before the zygote's code would.
    code = f"import json, os\nPATH = {OUTPUTS_FILE!r}\n{forgery}\nos._exit(0)\n"
    result = run(code, max_file_size_mb=16)
    assert result.status == Status.OK, result.stderr
    assert result.display == () and result.error is None
    assert run("print(2)").stdout == "2\n"


def test_a_program_may_display_text_through_the_outputs_file(run: RunFn) -> None:
    # Forging a well-formed report gives the program nothing it could not print itself.
    code = (
        f"import json, os\nopen({OUTPUTS_FILE!r}, 'w').write(json.dumps("
        "{'display': [{'text/plain': 'mine'}], 'error': None}))\nos._exit(0)\n"
    )
    assert run(code).display == ({"text/plain": "mine"},)


def test_localhost_resolves_to_loopback_and_a_program_serves_itself(run: RunFn) -> None:
    code = """
import http.server, socket, threading, urllib.request
assert socket.gethostbyname('localhost') == '127.0.0.1'
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'served by myself')
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(('localhost', 0), Hello)
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]
print(urllib.request.urlopen(f'http://localhost:{port}/', timeout=5).read().decode())
"""
    result = run(code)
    assert result.status == Status.OK, result.stderr
    assert result.stdout == "served by myself\n"


def test_nothing_but_loopback_is_reachable(run: RunFn) -> None:
    code = """
import socket
print(sorted(name for _, name in socket.if_nameindex()))  # /proc/net: not in a subset=pid /proc
try:
    socket.create_connection(('10.0.0.1', 80), timeout=2)
    print('REACHED')
except OSError as exc:
    print('unreachable', exc.errno)
"""
    result = run(code)
    assert result.stdout.splitlines()[0] == "['lo']"
    assert "REACHED" not in result.stdout


def test_mnt_is_writable_and_private_to_one_run(run: RunFn) -> None:
    first = run("open('/mnt/b', 'w').write('sauce'); print(open('/mnt/b').read())")
    assert first.status == Status.OK and first.stdout == "sauce\n", first.stderr
    second = run("import os; print(os.listdir('/mnt'))")
    assert second.stdout == "[]\n"


def test_scipy_and_matplotlib_are_importable(run: RunFn) -> None:
    code = (
        "import scipy.optimize, scipy.integrate, scipy.stats, matplotlib\n"
        "print(round(scipy.optimize.brentq(lambda x: x * x - 2, 0, 2), 6))\n"
        "print(matplotlib.get_backend())\n"
    )
    result = run(code, timeout_s=30)
    assert result.status == Status.OK, result.stderr
    assert result.stdout.lower().splitlines() == ["1.414214", "agg"]


@pytest.fixture(scope="module")
def pool() -> Iterator[SessionPool]:
    p = SessionPool(Settings(cgroup_parent=JAIL_CGROUP_PARENT, session_ttl_s=60), slot=11, spares=0)
    yield p
    p.close()


def cell(code: str) -> ExecutionSpec:
    return ExecutionSpec(code=code, limits=Limits(timeout_s=30, memory_mb=512, max_processes=32))


def test_a_session_cell_displays_its_value_and_its_figures(pool: SessionPool) -> None:
    assert pool.run_cell("rich", cell("x = [1, 2]")).result.display == ()
    value = pool.run_cell("rich", cell("x")).result
    assert value.display == ({"text/plain": "[1, 2]"},) and value.stdout == "[1, 2]\n"
    plotted = pool.run_cell("rich", cell(PLOT + "fig")).result
    assert plotted.status == Status.OK, plotted.stderr
    assert list(plotted.display[0]) == ["text/plain"]
    assert plotted.display[0]["text/plain"].startswith("<Figure size 200x150")
    assert png_size(plotted.display[1]["image/png"]) == (200, 150)
    # Figures are closed once displayed, as by Jupyter's inline backend.
    after = pool.run_cell("rich", cell("import matplotlib.pyplot as plt\nlen(plt.get_fignums())"))
    assert after.result.display == ({"text/plain": "0"},)


def test_a_session_cell_error_is_structured_and_keeps_the_session(pool: SessionPool) -> None:
    failed = pool.run_cell("rich-err", cell("y = 3\nassert y == 4, 'nope'"))
    assert failed.alive and failed.result.error is not None
    assert (failed.result.error.ename, failed.result.error.evalue) == ("AssertionError", "nope")
    assert pool.run_cell("rich-err", cell("y")).result.stdout == "3\n"


def test_e2b_home_is_the_working_directory(run: RunFn) -> None:
    result = run(
        "open('/home/user/data.csv', 'w').write('a,b\\n')\n"
        "import os; print(open('data.csv').read(), os.path.realpath('/home/user'))"
    )
    assert (result.status, result.stdout) == (Status.OK, "a,b\n /home/sandbox\n"), result
