"""In the trainers' environment (drive_trl_openrlhf.py): one GRPOTrainer.train() step of TRL with
the TRL example (examples/trl_grpo.py). The model is tiny_chat's, first
taught (a few hundred SFT steps, seconds on a CPU) to answer the prompt with a call of the
example environment's `python` tool and, after the tool's response, with `\\boxed{42}`; then
TRL's GRPOTrainer, with the example's reward function and environment factory, trains one step:
TRL resets the environments, parses the model's tool calls, runs them through the environment
(a session of the service), and grades the answers through the service. Prints one JSON report
in the report.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import tiny_chat
import torch
from datasets import Dataset
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import shutdown_event_loop_in_daemon

from trainer_client.integrations import reward

QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
ANSWER = "The answer is \\boxed{42}."


def teach(model: Any, tools: list[dict[str, Any]]) -> None:
    """SFT on the two assistant turns of the scripted episode (only their tokens are learnt)."""
    tok = tiny_chat.tokenizer()
    first = tok.apply_chat_template(
        QUESTION, tools=tools, tokenize=False, add_generation_prompt=True
    )
    tool_turn = (
        "<|im_start|>user\n<tool_response>\nTool call success\nstdout: 42\n\n"
        "execution time: 0.01s\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    pieces = [
        (first, False),
        (CALL + "<|im_end|>", True),
        ("\n" + tool_turn, False),
        (ANSWER + "<|im_end|>", True),
    ]
    ids: list[int] = []
    labels: list[int] = []
    for text, learnt in pieces:
        piece = tiny_chat.ids(text)
        ids += piece
        labels += piece if learnt else [-100] * len(piece)
    inputs, targets = torch.tensor([ids]), torch.tensor([labels])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        loss = model(input_ids=inputs, labels=targets).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break


def train_one_step(example: ModuleType, output_dir: Path) -> dict[str, Any]:
    """GRPOTrainer with the example's reward and environment, one step; what it logged."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    torch.set_num_threads(1)  # the service's workers share the machine's cores
    model = tiny_chat.model()
    started = time.monotonic()
    teach(model, [get_json_schema(example.PythonSandbox.python)])
    taught_s = time.monotonic() - started
    data = Dataset.from_list([{"prompt": QUESTION, "answer": "42"}] * 2)
    args = GRPOConfig(
        output_dir=str(output_dir),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=192,
        max_tool_calling_iterations=2,
        temperature=0.05,
        learning_rate=1e-5,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tiny_chat.tokenizer(),
        reward_funcs=[example.correct_answer_reward],
        environment_factory=example.PythonSandbox,
        train_dataset=data,
        args=args,
    )
    started = time.monotonic()
    trainer.train()
    trained_s = time.monotonic() - started
    environments = [env for pool in trainer._environment_pool.values() for env in pool]
    sessions = [env.session_id for env in environments]
    for env in environments:
        if env._session is not None:
            env._session.close()
    asyncio.run_coroutine_threadsafe(reward.close_clients(), trainer.async_loop).result(30)
    shutdown_event_loop_in_daemon(trainer.async_loop_thread, trainer.async_loop)
    logged = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    return {
        "global_step": trainer.state.global_step,
        "log": {k: v for k, v in logged.items() if isinstance(v, int | float)},
        "sessions": sessions,
        "taught_s": round(taught_s, 2),
        "trained_s": round(trained_s, 2),
    }
