"""The E2B SDK's own calls against rl-sandbox, run in a client environment with only the SDK.

Configured as E2B's self-hosting docs say: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY from the
environment; E2B_OTHER_KEY is a key of no tenant of this sandbox. Prints one JSON object of what
each call gave back; the test asserts on it.
"""

import asyncio
import base64
import json
import os

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
seen["context_value"] = sandbox.run_code("y", context=context).text
seen["default_lacks_y"] = sandbox.run_code("y").error.name
seen["contexts"] = sorted(c.id for c in sandbox.list_code_contexts())
seen["context_id"] = context.id
sandbox.restart_code_context(context)
seen["after_restart"] = sandbox.run_code("y", context=context).error.name
sandbox.remove_code_context(context)
seen["contexts_after_remove"] = sorted(c.id for c in sandbox.list_code_contexts())

seen["commands"] = failure(lambda: sandbox.commands.run("ls"))
seen["files_list"] = failure(lambda: sandbox.files.list("/home/user"))
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
    await box.kill()
    return value


seen["async_value"] = asyncio.run(async_calls())

other = {"api_key": os.environ["E2B_OTHER_KEY"]}
seen["other_create"] = failure(lambda: Sandbox.create(**other))
seen["other_kill"] = failure(lambda: Sandbox.kill(sandbox.sandbox_id, **other))

seen["killed"] = sandbox.kill()
seen["running_after_kill"] = sandbox.is_running()
seen["kill_again"] = Sandbox.kill(sandbox.sandbox_id)
seen["run_after_kill"] = failure(lambda: sandbox.run_code("1"))
print(json.dumps(seen))
