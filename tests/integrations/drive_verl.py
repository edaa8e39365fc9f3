"""Run in the trainers' environment: our verl tools and reward, through verl's own code.

Usage: drive_verl.py SERVICE_URL EXAMPLES_DIR WORK_DIR. The tools are built by verl's tool
registry from the example configs; calls go through verl's ToolAgentLoop._call_tool (create,
execute, release around each call, as verl's agent loop does); then whole trajectories and the
reward loop (verl_loop.py, in the same process: verl is imported once). Prints one JSON report
as its last line; the test checks it and then asks the service whether the sessions are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

# A leaked connection or transport shows up as a ResourceWarning when collected.
warnings.simplefilter("error", ResourceWarning)

from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # noqa: E402
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop  # noqa: E402
from verl.experimental.agent_loop.tool_parser import FunctionCall  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402
from verl_loop import run_loops_and_reward  # noqa: E402

from trainer_client.integrations import clients, reward  # noqa: E402
from trainer_client.integrations import verl as ours  # noqa: E402


def bare_tool_agent_loop(tools: list[Any]) -> ToolAgentLoop:
    """verl's ToolAgentLoop with only what _call_tool reads (no model, tokenizer or server)."""
    loop = object.__new__(ToolAgentLoop)
    loop.tools = {tool.name: tool for tool in tools}
    loop.max_tool_response_length = 4096
    loop.tool_response_truncate_side = "middle"
    return loop


def agent_data(request_id: str) -> AgentData:
    return AgentData(
        messages=[],
        image_data=None,
        video_data=None,
        audio_data=None,
        mm_processor_kwargs=None,
        metrics={},
        request_id=request_id,
        tools_kwargs={},
    )


def socket_fds() -> int:
    """Open sockets of this process."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the fd of the listing itself, closed meanwhile
            count += os.readlink(fd).startswith("socket:")
    return count


async def main(examples: Path, work: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"sockets_before": socket_fds()}
    (code_tool,) = initialize_tools_from_config(str(examples / "code_tool_config.yaml"))
    (session_tool,) = initialize_tools_from_config(str(examples / "session_tool_config.yaml"))
    report["names"] = [code_tool.name, session_tool.name]
    report["schemas"] = [
        t.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
        for t in (code_tool, session_tool)
    ]

    # The BaseTool lifecycle, one instance: create opens the session, release ends it.
    instance, _ = await session_tool.create()
    first, _, _ = await session_tool.execute(instance, {"code": "x = 41"})
    second, _, _ = await session_tool.execute(instance, {"code": "x + 1"})
    report["instance"] = {
        "session": session_tool.session_of(instance),
        "texts": [first.text, second.text],
    }
    await session_tool.release(instance)

    # verl's own call path; inside a trajectory scope the calls share the trajectory's session.
    agent = bare_tool_agent_loop([code_tool, session_tool])

    async def call(name: str, arguments: dict[str, Any], request_id: str) -> str:
        response, _, _ = await agent._call_tool(
            FunctionCall(name=name, arguments=json.dumps(arguments)), {}, agent_data(request_id)
        )
        return str(response.text)

    async with ours.trajectory_scope():
        texts = [await call("jupyter_code", {"code": "y = 6"}, "traj-1")]
        # a turn's parallel calls (verl gathers them) are in the trajectory too
        texts += await asyncio.gather(
            call("jupyter_code", {"code": "y * 7"}, "traj-1"),
            call("jupyter_code", {"code": "y + 1"}, "traj-1"),
        )
        scope = ours._TRAJECTORY.get()
        assert scope is not None
        trajectory_sessions = [session for _, session in scope.sessions.values()]
    report["trajectory"] = {"sessions": trajectory_sessions, "texts": texts}
    # Outside a scope, calls of two trajectories (two AgentData) share nothing; each trajectory's
    # session ends when its AgentData is freed.
    report["unscoped"] = [
        await call("jupyter_code", {"code": "z = 1"}, "traj-2"),
        await call("jupyter_code", {"code": "z"}, "traj-2"),
    ]
    report["stateless"] = await call(
        "python_code_with_standard_io", {"code": "print(input()[::-1])", "input": "abc"}, "t3"
    )
    report["bad_arguments"] = await call("python_code_with_standard_io", {"code": 3}, "t4")
    report["agent_loop"] = dict(_agent_loop_registry.get(ours.AGENT_NAME, {}))

    # The reward: verl's reward loop awaits one compute_score per sample, all at once.
    samples = [
        ("The answer is \\boxed{\\frac{1}{2}}.", "0.5"),
        ("So \\boxed{3}", "4"),
        ("no boxed answer", "1"),
        ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ]
    report["scores"] = await asyncio.gather(
        *(reward.compute_score("math", text, truth, {}) for text, truth in samples)
    )
    report["batch_scores"] = await asyncio.to_thread(
        reward.compute_score_batch,
        ["math"] * len(samples),
        [text for text, _ in samples],
        [truth for _, truth in samples],
        [{}] * len(samples),
    )

    report["loop"] = await run_loops_and_reward(examples, work)
    gc.collect()
    await session_tool.wait_ended()
    await code_tool.aclose()
    await session_tool.aclose()
    await reward.close_clients()
    clients.close_shared_sync_clients()
    gc.collect()
    report["sockets_after"] = socket_fds()
    return report


if __name__ == "__main__":
    os.environ["RL_SANDBOX_URL"] = sys.argv[1]
    print(json.dumps(asyncio.run(main(Path(sys.argv[2]), Path(sys.argv[3])))))
