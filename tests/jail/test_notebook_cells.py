"""Notebook conventions in session cells, in real session jails: `!cmd`, `!pip`/`%pip`, the
line and cell magics, rich representations of the last value; and what stays jailed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail.sessions import SessionPool
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT
from tests.jail.conftest import RunFn


@pytest.fixture(scope="module")
def pool() -> Iterator[SessionPool]:
    p = SessionPool(Settings(cgroup_parent=JAIL_CGROUP_PARENT, session_ttl_s=60), slot=12, spares=0)
    yield p
    p.close()


def cell(code: str, **limits: object) -> ExecutionSpec:
    base = {"timeout_s": 30.0, "memory_mb": 512, "max_processes": 32, "max_output_bytes": 4096}
    return ExecutionSpec(code=code, limits=Limits(**{**base, **limits}))  # type: ignore[arg-type]


def test_a_shell_command_runs_in_the_cells_jail_with_its_streams(pool: SessionPool) -> None:
    result = pool.run_cell("nb-shell", cell("n = 3\n!echo out {n * 2} && echo err >&2\n")).result
    assert result.status == Status.OK, result.stderr
    assert result.stdout == "out 6\n" and result.stderr == "err\n"
    # The program's uid and the cell's working directory; status in _exit_code as in IPython.
    who = pool.run_cell("nb-shell", cell("!id -u; pwd\n!exit 3\n_exit_code")).result
    assert who.stdout.splitlines()[0] != "0"
    assert who.stdout.splitlines()[-1] == "3"
    lines = pool.run_cell("nb-shell", cell("files = !ls /\nprint('tmp' in files)")).result
    assert lines.stdout == "True\n", lines.stderr


def test_pip_install_of_what_the_image_has_answers_as_pip(pool: SessionPool) -> None:
    # smolagents' CodeAgent sends this cell first.
    result = pool.run_cell("nb-pip", cell("!pip install numpy pillow")).result
    assert result.status == Status.OK, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    assert lines[0].startswith("Requirement already satisfied: numpy in ")
    assert lines[1].startswith("Requirement already satisfied: pillow in ")
    magic = pool.run_cell("nb-pip", cell("%pip install -q sympy>=1.0\n_exit_code")).result
    assert magic.stdout.startswith("Requirement already satisfied: sympy>=1.0 in "), magic
    assert magic.stdout.endswith("0\n")


def test_pip_install_of_anything_else_fails_clearly(pool: SessionPool) -> None:
    result = pool.run_cell(
        "nb-pip-x", cell("!pip install numpy surely-not-a-package-xyz\n_exit_code")
    )
    assert result.result.stdout == "1\n"
    assert "No matching distribution found for surely-not-a-package-xyz" in result.result.stderr
    assert "no network" in result.result.stderr
    newer = pool.run_cell("nb-pip-x", cell("%pip install 'numpy>=999'")).result
    assert "no network" in newer.stderr


def test_time_timeit_writefile_cd_env(pool: SessionPool) -> None:
    timed = pool.run_cell("nb-magic", cell("%time x = sum(range(1000))\nx")).result
    assert timed.status == Status.OK, timed.stderr
    assert timed.stdout.startswith("CPU times: user ") and "Wall time: " in timed.stdout
    assert timed.stdout.endswith("499500\n")
    whole = pool.run_cell("nb-magic", cell("%%time\ny = x + 1\ny")).result
    assert "Wall time" in whole.stdout and whole.stdout.endswith("499501\n"), whole
    loops = pool.run_cell("nb-magic", cell("%timeit -n 10 -r 2 x + 1")).result
    assert "per loop (mean \xb1 std. dev. of 2 runs, 10 loops each)" in loops.stdout, loops
    wrote = pool.run_cell("nb-magic", cell("%%writefile notes.txt\nfirst line\nsecond\n")).result
    assert wrote.stdout == "Writing notes.txt\n", wrote
    read = pool.run_cell("nb-magic", cell("open('notes.txt').read()")).result
    assert read.display[0]["text/plain"] == repr("first line\nsecond\n")
    moved = pool.run_cell("nb-magic", cell("%cd /tmp\nimport os\nos.getcwd()")).result
    assert moved.stdout == "/tmp\n'/tmp'\n", moved
    env = pool.run_cell("nb-magic", cell("%env GREETING=hello\n!echo $GREETING")).result
    assert env.stdout == "env: GREETING=hello\nhello\n", env


def test_an_unknown_magic_is_the_cells_error_and_keeps_the_session(pool: SessionPool) -> None:
    outcome = pool.run_cell("nb-unknown", cell("%nosuchmagic 1"))
    assert outcome.alive and outcome.result.error is not None
    assert outcome.result.error.ename == "UsageError"
    assert "%nosuchmagic" in outcome.result.error.evalue


def test_rich_representations_of_the_last_value_go_to_display(pool: SessionPool) -> None:
    code = (
        "class Rich:\n"
        "    def __repr__(self): return 'Rich()'\n"
        "    def _repr_html_(self): return '<b>rich</b>'\n"
        "    def _repr_markdown_(self): return '**rich**'\n"
        "    def _repr_json_(self): return {'rich': [1, 2]}\n"
        "    def _repr_latex_(self): return r'$\\rho$'\n"
        "    def _repr_svg_(self): return '<svg></svg>'\n"
        "Rich()"
    )
    result = pool.run_cell("nb-rich", cell(code)).result
    assert result.status == Status.OK, result.stderr
    (bundle,) = result.display
    assert bundle["text/plain"] == "Rich()" and bundle["text/html"] == "<b>rich</b>"
    assert bundle["text/markdown"] == "**rich**" and bundle["text/latex"] == "$\\rho$"
    assert json.loads(bundle["application/json"]) == {"rich": [1, 2]}
    assert bundle["image/svg+xml"] == "<svg></svg>"
    assert result.stdout == "Rich()\n"


def test_a_dataframe_shows_as_an_html_table(pool: SessionPool) -> None:
    code = "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"
    result = pool.run_cell("nb-pandas", cell(code)).result
    assert result.status == Status.OK, result.stderr
    (bundle,) = result.display
    assert "<table" in bundle["text/html"] and "<td>x</td>" in bundle["text/html"]
    assert bundle["text/plain"].split() == ["a", "b", "0", "1", "x", "1", "2", "y"]


def test_a_failing_or_lying_repr_method_costs_only_that_representation(pool: SessionPool) -> None:
    code = (
        "class Odd:\n"
        "    def __repr__(self): return 'Odd()'\n"
        "    def _repr_html_(self): raise RuntimeError('no html')\n"
        "    def _repr_png_(self): return b'not a png'\n"
        "    def _repr_json_(self): return object()\n"
        "    def __getattr__(self, name): return lambda *a, **k: 'anything'\n"
        "Odd()"
    )
    result = pool.run_cell("nb-odd", cell(code)).result
    assert result.status == Status.OK, result.stderr
    assert result.display == ({"text/plain": "Odd()"},)
    assert "RuntimeError: no html" in result.stderr


def test_a_shell_command_stays_jailed_and_ends_with_its_cell(pool: SessionPool) -> None:
    started = pool.run_cell("nb-jailed", cell("!sleep 600 &\n!ls /proc | grep -c '^[0-9]'")).result
    assert started.status == Status.OK, started.stderr
    # Nothing the cell's shell started outlives the cell.
    after = pool.run_cell("nb-jailed", cell("!ps -eo comm= 2>/dev/null | grep -c sleep")).result
    assert after.stdout.strip() == "0", after
    net = pool.run_cell(
        "nb-jailed",
        cell("!python -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\""),
    ).result
    assert "Error" in net.stderr  # no network for a command either


def test_a_shell_commands_output_is_bounded_and_its_time_limited(pool: SessionPool) -> None:
    flood = pool.run_cell("nb-bounds", cell("!yes | head -c 100000000", max_output_bytes=4096))
    assert flood.result.stdout_truncated and len(flood.result.stdout) <= 4096
    hang = pool.run_cell("nb-bounds", cell("!sleep 600", timeout_s=2))
    assert hang.result.status == Status.TIMEOUT


def test_plain_python_cells_import_no_ipython(pool: SessionPool) -> None:
    loaded = "sorted(sys.modules['rl_sandbox_inside.cell_syntax']._LOADED)"
    plain = pool.run_cell("nb-plain", cell(f"import sys\nx = 7 % 4 != 2\nx, {loaded}"))
    assert plain.result.display[0]["text/plain"] == "(True, [])", plain.result
    # The same check sees the transformer once a cell used notebook syntax.
    used = pool.run_cell("nb-plain", cell(f"!true\n{loaded}")).result
    assert "core/inputtransformer2.py" in used.display[0]["text/plain"], used
    # A `%` that starts a line continuing an expression is still Python's modulo.
    modulo = pool.run_cell("nb-plain", cell("(7\n% 4)")).result
    assert modulo.display == ({"text/plain": "3"},), modulo


def test_a_program_gets_no_notebook_syntax(run: RunFn) -> None:
    # As `python script.py`: magics and `!` are for cells.
    result = run("!echo hi\n")
    assert result.status == Status.ERROR and "SyntaxError" in result.stderr
