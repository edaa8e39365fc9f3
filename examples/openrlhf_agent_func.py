"""An OpenRLHF agent function: tool calls run in an rl-sandbox session, the answer graded there.

    RL_SANDBOX_URL=http://127.0.0.1:8000 python -m openrlhf.cli.train_ppo_ray ... \\
        --train.agent_func_path examples/openrlhf_agent_func.py

OpenRLHF makes one AgentInstance per prompt, `reset`s it, then calls `step` with each model
turn. A turn holding `<tool_call>` blocks (rStar2-Agent's format: `jupyter_code` cells, or
`python_code_with_standard_io` programs) gets the tool responses back as the next user turn; a
turn without one is the final answer, rewarded 1.0 when its last \\boxed{} equals the label. The
episode's session ends then.

Tested by tests/integrations/test_trl_openrlhf_service.py (OpenRLHF 0.11.2: an episode through
its MultiTurnAgentExecutor.execute with a scripted engine; not a training run, which needs GPUs).
"""

from __future__ import annotations

from typing import Any

import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from trainer_client.integrations.clients import ClientPerLoop
from trainer_client.integrations.reward import grade_responses, service_address
from trainer_client.session import Session
from trainer_client.tools import execute_tool_call, parse_tool_calls

MAX_TOOL_TURNS = 8
_CLIENTS = ClientPerLoop(service_address())


END_OF_TURN = "<|im_end|>"


def tool_turn(responses: list[str], turn_ended: bool = True) -> str:
    """The user turn that carries tool responses (Qwen's chat format, as the model was prompted).

    OpenRLHF appends this text's tokens to the action's tokens. A turn that ended on the
    model's end-of-turn token (its EOS: how a generation without stop strings ends) already holds
    `<|im_end|>` there (vLLM keeps it in the token ids and drops it from the text), so it is not
    repeated; a turn cut by a stop string did not emit it, so the feedback closes the turn first.
    """
    body = "\n".join(f"<tool_response>\n{text}\n</tool_response>" for text in responses)
    close = "" if turn_ended else END_OF_TURN
    return f"{close}\n<|im_start|>user\n{body}{END_OF_TURN}\n<|im_start|>assistant\n"


def ended_on_end_of_turn(states: dict[str, Any]) -> bool:
    """Whether the action ended on the model's EOS: always, unless stop strings are configured
    (then a turn may end on one of them, without an EOS)."""
    return not getattr(states.get("sampling_params"), "stop", None)


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.session: Session | None = None
        self.tool_turns = 0

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.session = _CLIENTS.get().session()
        self.tool_turns = 0
        return {"observation": states["observation"]}

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        assert self.session is not None, "reset() first"
        calls = parse_tool_calls(states["action_text"])
        if calls and self.tool_turns < MAX_TOOL_TURNS:
            self.tool_turns += 1
            client = _CLIENTS.get()
            responses = [
                await execute_tool_call(client, call, session_id=self.session.id, max_chars=2048)
                for call in calls
            ]
            feedback = tool_turn(responses, ended_on_end_of_turn(states))
            return self._result(0.0, feedback, done=False, states=states)
        (score,) = await grade_responses(
            [states["action_text"]], [states["label"]], address=_CLIENTS.address
        )
        await self.session.close()
        return self._result(score, "", done=True, states=states)

    def _result(
        self, reward: float, feedback: str, *, done: bool, states: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "rewards": torch.tensor(reward),
            "scores": torch.tensor(reward),
            "environment_feedback": feedback,
            "done": done,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": {"tool_turns": torch.tensor(float(self.tool_turns))},
        }


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self) -> None:
        super().__init__(AgentInstance)
