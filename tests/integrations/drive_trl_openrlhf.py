"""Run in the trainers' environment: the TRL and OpenRLHF examples, called as those trainers do.

Usage: drive_trl_openrlhf.py SERVICE_URL EXAMPLES_DIR OUTPUT_DIR. TRL: the reward function
awaited on TRL's own daemon event loop with TRL's keyword arguments, the environment's tool
schema read by transformers' get_json_schema (what GRPOTrainer does), reset and tool calls, and
one GRPOTrainer.train() step (trl_train_step.py). OpenRLHF: an episode through its own
MultiTurnAgentExecutor.execute() with the example's executor, tiny_chat's tokenizer and a
scripted engine answering as vLLM does. Prints one JSON report as its last line.
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
from types import ModuleType, SimpleNamespace
from typing import Any

warnings.simplefilter("error", ResourceWarning)

import tiny_chat  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402
from trl.trainer.utils import (  # noqa: E402
    is_async_callable,
    shutdown_event_loop_in_daemon,
    start_event_loop_in_daemon,
)
from trl_train_step import train_one_step  # noqa: E402

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


class ScriptedEngine:
    """OpenRLHF's LLM engine (the model, not our code), answering from a script as vLLM does:
    token ids end with the EOS (`<|im_end|>`), which the text leaves out."""

    def __init__(self, turns: list[str]) -> None:
        self._turns = iter(turns)

    async def generate(self, prompt_ids: list[int], sampling_params: Any, **kwargs: Any) -> Any:
        text = next(self._turns)
        output = SimpleNamespace(
            token_ids=tiny_chat.ids(text + tiny_chat.END_OF_TURN),
            text=text,
            finish_reason="stop",
            logprobs=None,
        )
        return SimpleNamespace(outputs=[output])


async def openrlhf_part(examples: Path) -> dict[str, Any]:
    example = load(examples / "openrlhf_agent_func.py")
    instances: list[Any] = []
    reset = example.AgentInstance.reset

    async def recorded_reset(self: Any, states: dict[str, Any], **kwargs: Any) -> Any:
        instances.append(self)
        return await reset(self, states, **kwargs)

    example.AgentInstance.reset = recorded_reset
    call = '<tool_call>\n{{"name": "jupyter_code", "arguments": {{"code": "{}"}}}}\n</tool_call>'
    engine = ScriptedEngine([call.format("v = 6 * 7"), call.format("v"), "So \\boxed{42}."])
    tok = tiny_chat.tokenizer()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 6 * 7?"}], tokenize=False, add_generation_prompt=True
    )
    episode = await example.AgentExecutor().execute(
        prompt,
        "42",
        SimpleNamespace(max_tokens=None, logprobs=None, stop=None),
        max_length=4096,
        hf_tokenizer=tok,
        llm_engine=engine,
    )
    await example._CLIENTS.aclose()
    await reward.close_clients()
    return {
        "tokens": tok.decode(episode["observation_tokens"]),
        "actions": [
            tok.decode(episode["observation_tokens"][a:b]) for a, b in episode["action_ranges"]
        ],
        "reward": episode["reward"],
        "session": instances[0].session.id,
    }


if __name__ == "__main__":
    os.environ["RL_SANDBOX_URL"] = sys.argv[1]
    examples = Path(sys.argv[2])
    report = {
        "trl": trl_part(examples),
        "openrlhf": asyncio.run(openrlhf_part(examples)),
        "train": train_one_step(load(examples / "trl_grpo.py"), Path(sys.argv[3])),
    }
    clients.close_shared_sync_clients()
    gc.collect()
    print(json.dumps(report))
