"""Run in the trainers' environment: the TRL and OpenRLHF examples, called as those trainers do.

Usage: drive_trl_openrlhf.py SERVICE_URL EXAMPLES_DIR. TRL: the reward function awaited on
TRL's own daemon event loop with TRL's keyword arguments, the environment's tool schema read by
transformers' get_json_schema (what GRPOTrainer does), reset and tool calls. OpenRLHF: the
example's AgentExecutor built (OpenRLHF's MultiTurnAgentExecutor checks the instance class), an
episode driven as its execute() drives it (reset, then step per model turn). Prints one JSON
report as its last line.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

warnings.simplefilter("error", ResourceWarning)

from transformers.utils import get_json_schema  # noqa: E402
from trl.trainer.utils import (  # noqa: E402
    is_async_callable,
    shutdown_event_loop_in_daemon,
    start_event_loop_in_daemon,
)

from trainer_client.integrations import clients, reward  # noqa: E402


def load(path: Path) -> ModuleType:
    """A module from a file, as OpenRLHF loads --agent_func_path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trl_part(examples: Path) -> dict[str, Any]:
    example = load(examples / "trl_grpo.py")
    thread, loop, ready = start_event_loop_in_daemon(name="trl-async")
    ready.wait()
    completions = [
        [{"role": "assistant", "content": "6 * 7 = \\boxed{42}"}],
        "\\boxed{41}",
        "I am not sure.",
    ]
    rewards = asyncio.run_coroutine_threadsafe(
        example.correct_answer_reward(
            prompts=["q"] * 3,
            completions=completions,
            completion_ids=[[0]] * 3,
            answer=["42", "42", "1"],
            trainer_state=None,
        ),
        loop,
    ).result(120)
    asyncio.run_coroutine_threadsafe(reward.close_clients(), loop).result(30)
    shutdown_event_loop_in_daemon(thread, loop)

    env = example.PythonSandbox()
    env.reset()
    texts = [env.python("a = 6"), env.python("a * 7")]
    first_session = env.session_id
    env.reset()  # the next rollout: a fresh interpreter, the last one's ended
    texts.append(env.python("a"))
    second_session = env.session_id
    env._session.close()
    return {
        "rewards": rewards,
        "reward_is_async": is_async_callable(example.correct_answer_reward),
        "tool_schema": get_json_schema(env.python),
        "texts": texts,
        "sessions": [first_session, second_session],
    }


async def openrlhf_part(examples: Path) -> dict[str, Any]:
    example = load(examples / "openrlhf_agent_func.py")
    executor = example.AgentExecutor()
    agent = executor.agent_instance_cls()
    first = await agent.reset({"observation": "What is 6 * 7?", "label": "42"})

    def turn(action: str) -> dict[str, Any]:
        return {"observation_text": "", "action_text": action, "label": "42"}

    call = '<tool_call>{{"name": "jupyter_code", "arguments": {{"code": "{}"}}}}</tool_call>'
    steps = [
        await agent.step(turn(call.format("v = 6 * 7"))),
        await agent.step(turn(call.format("v"))),
    ]
    session = agent.session.id
    steps.append(await agent.step(turn("So the answer is \\boxed{42}.")))
    await example._CLIENTS.aclose()
    await reward.close_clients()
    return {
        "observation": first["observation"],
        "feedback": [s["environment_feedback"] for s in steps],
        "rewards": [s["rewards"].item() for s in steps],
        "done": [s["done"] for s in steps],
        "session": session,
    }


if __name__ == "__main__":
    os.environ["RL_SANDBOX_URL"] = sys.argv[1]
    examples = Path(sys.argv[2])
    report = {"trl": trl_part(examples), "openrlhf": asyncio.run(openrlhf_part(examples))}
    clients.close_shared_sync_clients()
    gc.collect()
    print(json.dumps(report))
