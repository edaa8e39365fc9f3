"""GRPO with TRL's GRPOTrainer, rl-sandbox grading the answers and running the tool calls.

    RL_SANDBOX_URL=http://127.0.0.1:8000 python examples/trl_grpo.py MODEL DATASET_JSONL

- `correct_answer_reward` is a `reward_funcs` entry: TRL awaits it with the batch's completions
  and the dataset's columns (here `answer`); one POST /verify grades the batch.
- `PythonSandbox` is an `environment_factory`: TRL makes one per rollout slot, calls `reset`
  before each rollout and offers its public methods (`python`) as tools, with the schema it
  reads from the docstring. Each rollout gets a fresh session (one interpreter); `reset` ends the
  previous rollout's.

Tested by tests/integrations/test_trl_openrlhf_service.py (TRL 1.16: calls made as TRL makes
them, and one GRPOTrainer.train() step on a tiny model that calls the tool and answers).
"""

from __future__ import annotations

import sys
from typing import Any

from trainer_client.integrations.clients import shared_sync_client
from trainer_client.integrations.reward import grade_or_none, met_infrastructure, service_address
from trainer_client.sync import SyncSession
from trainer_client.tools import format_tool_response


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes a string, or (conversational data) a list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")


def tool_responses(completion: Any) -> list[str]:
    """The tool messages of a conversational completion (none for a plain string)."""
    if isinstance(completion, str):
        return []
    return [str(m.get("content") or "") for m in completion if m.get("role") == "tool"]


async def correct_answer_reward(
    completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float | None]:
    """1.0 when the completion's last \\boxed{} equals the dataset's `answer`, else 0.0; None
    (TRL's "no reward") when a tool call met an infrastructure status or the answer could not
    be judged."""
    texts = [completion_text(c) for c in completions]
    infrastructure = [met_infrastructure(tool_responses(c)) for c in completions]
    return await grade_or_none(
        texts, answer, address=service_address(), infrastructure=infrastructure
    )


class PythonSandbox:
    """One persistent Python interpreter per rollout, in rl-sandbox."""

    def __init__(self) -> None:
        self._client = shared_sync_client(service_address())
        self._session: SyncSession | None = None

    @property
    def session_id(self) -> str | None:
        """The rollout's session (a property: TRL offers only methods as tools)."""
        return None if self._session is None else self._session.id

    def reset(self, **kwargs: Any) -> None:
        """A new rollout: end the last one's interpreter and start with an empty one."""
        if self._session is not None:
            self._session.close()
        self._session = self._client.session(timeout=10)

    def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter and return what it printed.

        Variables, imports and functions persist between calls; the value of the last
        expression is shown, as in a notebook.

        Args:
            code: The Python code to run.
        """
        if self._session is None:
            self.reset()
        assert self._session is not None
        return format_tool_response(self._session.run(code), style="status", max_chars=2048)


def main(model: str, dataset_path: str) -> None:
    """Train (a GPU host, TRL with vLLM or transformers generation)."""
    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[correct_answer_reward],
        environment_factory=PythonSandbox,
        train_dataset=load_dataset("json", data_files=dataset_path, split="train"),
        args=GRPOConfig(output_dir="grpo-sandbox", max_tool_calling_iterations=8),
    )
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
