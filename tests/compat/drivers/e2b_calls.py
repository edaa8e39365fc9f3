"""The E2B SDK's own calls against rl-sandbox, run in a client environment with only the SDK.

Configured as E2B's self-hosting docs say: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY from the
environment; E2B_OTHER_KEY is a key of no tenant of this sandbox. Prints one JSON object of what
each call gave back; the test asserts on it.
"""

import asyncio
import base64
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from e2b import PtySize
from e2b_code_interpreter import AsyncSandbox, Sandbox

seen = {}


def failure(call):
    try:
        call()
    except Exception as exc:  # the SDK's exception is what is observed
        return type(exc).__name__ + ": " + str(exc)[:300]
    return None


sandbox = Sandbox.create(envs={"FROM_CREATE": "yes"}, metadata={"run": "e2b-test"})
seen["sandbox_id"] = sandbox.sandbox_id
seen["running"] = sandbox.is_running()
first = sandbox.run_code("x = 41\nprint('set')")
second = sandbox.run_code("x + 1")
seen["first_stdout"] = first.logs.stdout
seen["second_text"] = second.text
seen["second_stdout"] = second.logs.stdout
seen["execution_count"] = second.execution_count
plot = sandbox.run_code(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()"
)
pngs = [base64.b64decode(r.png) for r in plot.results if r.png]
seen["png_magic"] = [png[:8].hex() for png in pngs]
seen["png_sizes"] = [len(png) for png in pngs]
error = sandbox.run_code("def f():\n    return 1 / 0\nf()")
seen["error"] = (
    None
    if error.error is None
    else {
        "name": error.error.name,
        "value": error.error.value,
        "traceback": error.error.traceback,
    }
)
seen["error_stderr"] = error.logs.stderr
seen["after_error"] = sandbox.run_code("x").text
frame = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
seen["frame_html"] = [bool(r.html and "<table" in r.html) for r in frame.results]
seen["frame_is_main"] = [r.is_main_result for r in frame.results]
pip = sandbox.run_code("!pip install numpy pillow")  # smolagents' CodeAgent's first cell
seen["pip_stdout"] = "".join(pip.logs.stdout)
seen["pip_error"] = None if pip.error is None else pip.error.name

info = sandbox.files.write("/home/user/data.txt", "hello from files")
seen["write_info"] = {"name": info.name, "path": info.path}
seen["read_by_code"] = sandbox.run_code("open('data.txt').read()").text
sandbox.run_code("open('/home/sandbox/out.bin', 'wb').write(bytes(range(256)))")
seen["read_back"] = sandbox.files.read("/home/user/data.txt")
seen["read_bytes_ok"] = bytes(sandbox.files.read("out.bin", format="bytes")) == bytes(range(256))
seen["read_missing"] = failure(lambda: sandbox.files.read("/home/user/nope.txt"))
seen["write_outside"] = failure(lambda: sandbox.files.write("/etc/passwd", "x"))

context = sandbox.create_code_context()
sandbox.run_code("y = 'in the context'", context=context)
# one sandbox, one filesystem: every context sees the files and the commands' work
seen["context_reads_files"] = sandbox.run_code("open('data.txt').read()", context=context).text
sandbox.run_code("open('/home/user/from_context.txt', 'w').write('ctx')", context=context)
seen["default_reads_context_file"] = sandbox.run_code("open('from_context.txt').read()").text
seen["context_keeps_x_apart"] = sandbox.run_code("x", context=context).error.name


def own_variable(ctx):
    # each context reads its own variable while the other runs cells at the same time
    name = "y" if ctx is not None else "x"
    return [sandbox.run_code(name, context=ctx).text for _ in range(4)]


with ThreadPoolExecutor(2) as pool:
    seen["concurrent_contexts"] = list(pool.map(own_variable, [context, None]))
seen["context_value"] = sandbox.run_code("y", context=context).text
seen["default_lacks_y"] = sandbox.run_code("y").error.name
seen["contexts"] = sorted(c.id for c in sandbox.list_code_contexts())
seen["context_id"] = context.id
sandbox.restart_code_context(context)
seen["after_restart"] = sandbox.run_code("y", context=context).error.name
sandbox.remove_code_context(context)
seen["contexts_after_remove"] = sorted(c.id for c in sandbox.list_code_contexts())

seen["apostrophe"] = sandbox.run_code('"it\'s"').text
seen["quoted"] = sandbox.run_code("'plain'").text
shown = sandbox.run_code("def g(a, b):\n    return a / b\ng(1, 0)").error
seen["ipython_traceback"] = shown.traceback
seen["earlier_cell_frame"] = sandbox.run_code("g(2, 0)").error.traceback

# envd: the filesystem
sandbox.files.make_dir("/home/user/dir/sub")
seen["make_dir_again"] = sandbox.files.make_dir("/home/user/dir/sub")
sandbox.files.write_files(
    [
        {"path": "/home/user/dir/a.txt", "data": "alpha"},
        {"path": "/home/user/dir/sub/b.bin", "data": b"\x00\x01"},
    ]
)
seen["list_1"] = sorted((e.name, e.type.value) for e in sandbox.files.list("/home/user/dir"))
seen["list_2"] = sorted(e.path for e in sandbox.files.list("/home/user/dir", depth=2))
seen["exists"] = [sandbox.files.exists("dir/a.txt"), sandbox.files.exists("dir/nope")]
info = sandbox.files.get_info("/home/user/dir/a.txt")
seen["info"] = [info.name, info.type.value, info.size, info.permissions]
moved = sandbox.files.rename("/home/user/dir/a.txt", "/home/user/dir/c.txt")
seen["renamed"] = [moved.path, sandbox.files.read("/home/user/dir/c.txt")]
sandbox.files.remove("/home/user/dir/sub")
seen["after_remove"] = sorted(e.name for e in sandbox.files.list("/home/user/dir"))
seen["list_missing"] = failure(lambda: sandbox.files.list("/home/user/none"))

# envd: commands, in the sandbox's jail
chunks = []
done = sandbox.commands.run(
    "echo $GREET from $(pwd); cat c.txt; echo oops >&2; id -u",
    envs={"GREET": "hello"},
    cwd="/home/user/dir",
    on_stdout=chunks.append,
)
seen["command"] = [done.exit_code, done.stdout, done.stderr]
seen["on_stdout"] = "".join(chunks)
seen["command_exit"] = failure(lambda: sandbox.commands.run("exit 3"))
seen["command_sees_code_files"] = sandbox.commands.run("cat /home/user/from_context.txt").stdout
sandbox.commands.run("echo made-by-shell > /home/user/shell.txt")
seen["code_sees_command_files"] = sandbox.run_code("open('shell.txt').read().strip()").text
seen["no_network"] = sandbox.commands.run(
    "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 2)\" 2>&1 || true"
).stdout[-60:]
seen["command_timeout"] = failure(lambda: sandbox.commands.run("sleep 30", timeout=2))
handle = sandbox.commands.run("sleep 3; echo late", background=True)
seen["listed_pids"] = [p.pid for p in sandbox.commands.list()]
seen["handle_pid"] = handle.pid
seen["x_while_running"] = sandbox.run_code("x").text  # the sandbox serves other calls meanwhile
seen["background"] = handle.wait().stdout
later = sandbox.commands.run("sleep 3; echo later", background=True)
later.disconnect()  # the command runs on; connect streams its output from then on
time.sleep(1)  # the server has seen the stream go, in the middle of a poll
seen["listed_after_disconnect"] = later.pid in [p.pid for p in sandbox.commands.list()]
seen["connected"] = sandbox.commands.connect(later.pid).wait().stdout
seen["home"] = sandbox.commands.run("echo $HOME; cd ~ && ls data.txt").stdout
streamed = []
sandbox.commands.run("echo a; sleep 1.5; echo b", on_stdout=streamed.append)
seen["streamed"] = streamed  # live: two chunks, not one at the end
reader = sandbox.commands.run("read x; echo got $x", background=True, stdin=True)
sandbox.commands.send_stdin(reader.pid, "hi\n")
seen["stdin"] = reader.wait().stdout
server = sandbox.commands.run("python3 -m http.server 8765 --bind 127.0.0.1", background=True)
sandbox.commands.run(
    "for i in $(seq 100); do (: > /dev/tcp/127.0.0.1/8765) 2>/dev/null && break; sleep 0.1; done"
)
seen["served"] = sandbox.run_code(
    "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:8765/').status"
).text
seen["kill"] = sandbox.commands.kill(server.pid)
seen["killed_wait"] = failure(server.wait)
seen["after_kill_x"] = sandbox.run_code("x").text
seen["pty"] = failure(lambda: sandbox.pty.create(size=PtySize(rows=24, cols=80)))
seen["envs"] = sandbox.run_code("import os\nos.environ['GREETING']", envs={"GREETING": "hi"}).text
sandbox.set_timeout(120)
seen["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()]
seen["create_env"] = sandbox.run_code("os.environ['FROM_CREATE']").text
seen["info_id"] = sandbox.get_info().sandbox_id
again = Sandbox.connect(sandbox.sandbox_id)
seen["connected_sees_x"] = again.run_code("x").text


async def async_calls():
    box = await AsyncSandbox.create()
    await box.run_code("z = 6")
    value = (await box.run_code("z * 7")).text
    await box.files.write("/home/user/async.txt", "async file")
    listed = [e.name for e in await box.files.list("/home/user")]
    ran = await box.commands.run("cat async.txt")
    # another sandbox: none of the first one's files
    other = await box.files.exists("/home/user/data.txt")
    await box.kill()
    return [value, "async.txt" in listed, ran.stdout, other]


seen["async_value"] = asyncio.run(async_calls())

other = {"api_key": os.environ["E2B_OTHER_KEY"]}
seen["other_create"] = failure(lambda: Sandbox.create(**other))
seen["other_kill"] = failure(lambda: Sandbox.kill(sandbox.sandbox_id, **other))

seen["killed"] = sandbox.kill()
seen["running_after_kill"] = sandbox.is_running()
seen["kill_again"] = Sandbox.kill(sandbox.sandbox_id)
seen["run_after_kill"] = failure(lambda: sandbox.run_code("1"))
print(json.dumps(seen))
