"""smolagents' CodeAgent, one step, with its E2BExecutor against rl-sandbox (E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY from the environment), run in a client environment with only
smolagents[e2b]. The model is scripted: it answers one code action. Prints one JSON object."""

import json

from smolagents import CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model

ACTION = """Thought: compute it in the sandbox.
<code>
import numpy as np
from PIL import Image
values = np.arange(7) * 6
print("computed", int(values[-1]))
final_answer(int(values[-1]))
</code>"""


class ScriptedModel(Model):
    """A model that always answers the one code action above."""

    def generate(self, messages, stop_sequences=None, response_format=None, **kwargs):
        return ChatMessage(role=MessageRole.ASSISTANT, content=ACTION)


agent = CodeAgent(
    tools=[],
    model=ScriptedModel(model_id="scripted"),
    executor_type="e2b",
    additional_authorized_imports=["numpy", "PIL"],
    max_steps=1,
)
seen = {}
try:
    seen["answer"] = agent.run("What is 6 times 6?")
    steps = [s for s in agent.memory.steps if getattr(s, "observations", None)]
    seen["observations"] = [s.observations for s in steps]
finally:
    agent.cleanup()
print(json.dumps(seen, default=str))
