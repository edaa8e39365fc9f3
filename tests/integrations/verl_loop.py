"""In the trainers' environment (drive_verl.py): whole trajectories through verl's
ToolAgentLoop.run, and a batch through verl's reward loop, with our tools and reward as verl
loads them. The agent loops are built as verl's
AgentLoopWorker builds them (hydra.utils.instantiate of the registered config, tools from the
example tool config by verl's load_all_tools), with tiny_chat's tokenizer; the model is a
scripted server (the LLM, not our code): its turns call `jupyter_code` with `v = 6 * 7`, then
`print(v)`, then answer. Both verl's plain `tool_agent` and our `rl_sandbox_tool_agent` run it.
The reward: verl's RewardLoopWorker, configured with our compute_score as verl's trainer
config names it, grades a DataProto batch.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import tiny_chat
import torch
import verl
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import (
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.tools.tool_registry import load_all_tools
from verl.workers.rollout.replica import TokenOutput

from trainer_client.integrations import reward
from trainer_client.integrations import verl as ours

CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
TURNS = [
    '<tool_call>\n{"name": "jupyter_code", "arguments": {"code": "v = 6 * 7"}}\n</tool_call>',
    '<tool_call>\n{"name": "jupyter_code", "arguments": {"code": "print(v)"}}\n</tool_call>',
    "So the answer is \\boxed{42}.",
]


class ScriptedServer:
    """verl's LLM server client, answering each trajectory's turns from TURNS (with the EOS)."""

    def __init__(self) -> None:
        self.turns: dict[str, int] = {}

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        return TokenOutput(token_ids=tiny_chat.ids(TURNS[turn] + tiny_chat.END_OF_TURN))


def trainer_config(examples: Path, work: Path) -> Any:
    config = OmegaConf.load(CONFIG)
    rollout = config.actor_rollout_ref.rollout
    rollout.prompt_length, rollout.response_length = 4096, 2048
    rollout.multi_turn.update(
        {
            "enable": True,
            "format": "hermes",
            "max_assistant_turns": 5,
            "max_user_turns": 5,
            "tool_config_path": str(examples / "session_tool_config.yaml"),
        }
    )
    rollout.agent.agent_loop_config_path = str(examples / "agent_loop_config.yaml")
    config.actor_rollout_ref.model.path = str(work / "tokenizer")
    config.reward.custom_reward_function.path = "pkg://trainer_client.integrations.reward"
    config.reward.custom_reward_function.name = "compute_score"
    url = os.environ["RL_SANDBOX_URL"]
    config.reward.custom_reward_function.reward_kwargs = {"sandbox_url": url}
    return config


async def trajectory(config: Any, agent_name: str, tools: list[Any]) -> dict[str, Any]:
    """One trajectory through the agent loop `agent_name`, built as verl's worker builds it."""
    agent_loop = hydra.utils.instantiate(
        config=_agent_loop_registry[agent_name],
        trainer_config=DictConfigWrap(config=config),
        server_manager=ScriptedServer(),
        tokenizer=tiny_chat.tokenizer(),
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(tools),
    )
    question = [{"role": "user", "content": "What is 6 * 7?"}]
    output = await agent_loop.run({"temperature": 1.0}, raw_prompt=question)
    response = tiny_chat.tokenizer().decode(output.response_ids)
    return {"response": response, "turns": output.num_turns}


def reward_batch(samples: list[tuple[str, str]]) -> DataProto:
    """A DataProto as verl's reward loop reads it: prompt and response ids, mask, ground truth."""
    tok = tiny_chat.tokenizer()
    prompt = tiny_chat.ids("<|im_start|>user\nWhat is it?<|im_end|>\n<|im_start|>assistant\n")
    responses = [tiny_chat.ids(text + tiny_chat.END_OF_TURN) for text, _ in samples]
    width = max(len(r) for r in responses)
    padded = [r + [tok.pad_token_id] * (width - len(r)) for r in responses]
    mask = [[1] * len(prompt) + [1] * len(r) + [0] * (width - len(r)) for r in responses]
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([prompt] * len(samples)),
            "responses": torch.tensor(padded),
            "attention_mask": torch.tensor(mask),
        },
        non_tensors={
            "data_source": np.array(["math"] * len(samples), dtype=object),
            "reward_model": np.array([{"ground_truth": t} for _, t in samples], dtype=object),
            "extra_info": np.array([{} for _ in samples], dtype=object),
        },
    )


async def run_loops_and_reward(examples: Path, work: Path) -> dict[str, Any]:
    """Both agent loops' trajectories and the reward loop's scores, with what they ended."""
    tiny_chat.tokenizer().save_pretrained(work / "tokenizer")
    config = trainer_config(examples, work)
    # As verl's AgentLoopWorker: the agent loop configs registered, the tools loaded once.
    for entry in OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path):
        _agent_loop_registry[entry.name] = entry
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    tools = load_all_tools(tool_config_path=multi_turn.tool_config_path, function_tool_path=None)
    (tool,) = tools
    sessions: list[str] = []
    ended: list[str] = []
    opened, end = tool._trajectory_session, tool.end_session

    def record_opened(agent_data: Any) -> str:
        session = opened(agent_data)
        if session not in sessions:
            sessions.append(session)
        return session

    async def record_end(session_id: str) -> bool:
        ended.append(session_id)
        return bool(await end(session_id))

    tool._trajectory_session, tool.end_session = record_opened, record_end
    report: dict[str, Any] = {"tool": type(tool).__name__}
    report["tool_agent"] = await trajectory(config, "tool_agent", tools)
    gc.collect()
    await tool.wait_ended()
    report["tool_agent"].update(sessions=list(sessions), ended=list(ended))
    report["rl_sandbox_tool_agent"] = await trajectory(config, ours.AGENT_NAME, tools)
    report["rl_sandbox_tool_agent"]["ended"] = ended[len(report["tool_agent"]["ended"]) :]

    worker = RewardLoopWorker(config)
    report["reward_manager"] = type(worker.reward_manager).__name__
    samples = [
        ("The answer is \\boxed{\\frac{1}{2}}.", "0.5"),
        ("So \\boxed{3}", "4"),
        ("no boxed answer", "1"),
        ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ]
    outputs = await worker.compute_score_batch(reward_batch(samples))
    report["reward_scores"] = [output["reward_score"] for output in outputs]
    await tool.aclose()
    await reward.close_clients()
    return report
