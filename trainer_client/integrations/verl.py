"""verl tools that run code in rl-sandbox: stateless, and one session per trajectory.

Named in verl's tool config (docs/integrations.md): `class_name:
trainer_client.integrations.verl.SandboxCodeTool` (each call a fresh program, rStar2-Agent's
`python_code_with_standard_io` by default) or `...SandboxSessionTool` (calls are cells of one
interpreter, `jupyter_code` by default). This module imports verl; the rest of trainer_client
does not.

verl's ToolAgentLoop calls `create`, `execute` and `release` around every single call, and has
no hook at a trajectory's end. So a session tool keeps one session per trajectory in two ways:

- inside a trajectory scope, which `SandboxToolAgentLoop` (agent name `rl_sandbox_tool_agent`)
  opens around each trajectory: every call of the trajectory is a cell of the trajectory's
  session, and the scope's end ends it (DELETE /sessions/{id}) at once;
- under verl's plain `tool_agent`, by the `agent_data` verl hands `execute` (one per
  trajectory): the session is the trajectory's, and it ends when verl lets go of that
  trajectory's data (its last reference dropped, when `run` returns), else by the server's
  idle TTL.

An instance created and executed by hand, without either (`create`, `execute`..., `release`),
owns its session, which `release` ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

try:
    from verl.experimental.agent_loop.agent_loop import register
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
except ImportError as exc:  # pragma: no cover - the light install has no verl
    raise ImportError(
        "trainer_client.integrations.verl needs verl (pip install verl); the rest of "
        "trainer_client works without it"
    ) from exc

from trainer_client.errors import InvalidRequestError
from trainer_client.integrations.clients import ClientPerLoop
from trainer_client.integrations.reward import service_address
from trainer_client.tools import (
    ResponseStyle,
    format_tool_response,
    jupyter_tool_schema,
    python_tool_schema,
)

AGENT_NAME = "rl_sandbox_tool_agent"


@dataclass
class _Trajectory:
    """The sessions opened by one trajectory's calls, one per tool."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    sessions: dict[int, tuple[SandboxSessionTool, str]] = field(default_factory=dict)

    def session_of(self, tool: SandboxSessionTool) -> str:
        if id(tool) not in self.sessions:
            self.sessions[id(tool)] = (tool, f"verl-{self.id}-{tool.name}")
        return self.sessions[id(tool)][1]


_TRAJECTORY: contextvars.ContextVar[_Trajectory | None] = contextvars.ContextVar(
    "rl_sandbox_trajectory", default=None
)


@contextlib.asynccontextmanager
async def trajectory_scope() -> AsyncIterator[None]:
    """Calls of session tools inside share one session per tool; the scope's end ends them.

    asyncio tasks started inside (verl runs a turn's calls with asyncio.gather) are in it too.
    """
    trajectory = _Trajectory()
    token = _TRAJECTORY.set(trajectory)
    try:
        yield
    finally:
        _TRAJECTORY.reset(token)
        for tool, session_id in trajectory.sessions.values():
            await tool.end_session(session_id)


class SandboxCodeTool(BaseTool):  # type: ignore[misc]  # verl is untyped
    """Each call runs as a fresh program (POST /execute/batch, micro-batched).

    Config (the `config:` of the tool's YAML entry): `sandbox_url` (else RL_SANDBOX_URL),
    `api_key` (else RL_SANDBOX_API_KEY), `default_timeout` (each call's limit, s; 10),
    `response_style` (`rstar2` or `status`, see docs/client.md; `rstar2`).
    """

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None):
        self._clients = ClientPerLoop(
            service_address(config.get("sandbox_url"), config.get("api_key"))
        )
        self.timeout_s = float(config.get("default_timeout", 10.0))
        self.style: ResponseStyle = config.get("response_style", "rstar2")
        super().__init__(config, tool_schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema from the tool config, else rStar2-Agent's `python_code_with_standard_io`."""
        return self.__dict__.get("tool_schema") or OpenAIFunctionToolSchema.model_validate(
            self.default_schema()
        )

    def default_schema(self) -> dict[str, Any]:
        return python_tool_schema()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run the call; the model's mistakes come back as text for it, as verl expects."""
        code, stdin = parameters.get("code"), parameters.get("input") or ""
        if not isinstance(code, str) or not isinstance(stdin, str):
            return ToolResponse(text="Error when executing tool: 'code' must be a string"), 0.0, {}
        try:
            result = await self._clients.get().execute(
                code, stdin=stdin, timeout=self.timeout_s, session_id=self.session_of(instance_id)
            )
        except InvalidRequestError as exc:
            return ToolResponse(text=f"Error when executing tool: {exc.detail}"), 0.0, {}
        text = format_tool_response(result, style=self.style, max_chars=None)
        return ToolResponse(text=text), 0.0, {}

    def session_of(self, instance_id: str) -> str | None:
        """The session a call of this instance runs in: none, for the stateless tool."""
        return None

    async def end_session(self, session_id: str) -> bool:
        """End one session on the service (DELETE /sessions/{id})."""
        return await self._clients.get().end_session(session_id)

    async def aclose(self) -> None:
        """Close this loop's client of the tool (its pooled connections)."""
        await self._clients.aclose()


_AGENT_DATA_SESSIONS = "_rl_sandbox_sessions"
"""Attribute of verl's AgentData holding {tool name: session id} of its trajectory."""


class SandboxSessionTool(SandboxCodeTool):
    """Calls are cells of one interpreter: the instance's, or its trajectory's (see module)."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None):
        self._instances: dict[str, tuple[str, bool]] = {}
        """instance id -> (its session id, whether the instance owns it)."""
        self._ending: set[asyncio.Task[bool]] = set()
        super().__init__(config, tool_schema)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run a cell; under verl's plain tool_agent, in the session of the call's trajectory."""
        agent_data = kwargs.get("agent_data")
        _, owned = self._instances.get(instance_id, (None, False))
        if owned and agent_data is not None:
            self._instances[instance_id] = (self._trajectory_session(agent_data), False)
        return await super().execute(instance_id, parameters, **kwargs)

    def _trajectory_session(self, agent_data: Any) -> str:
        """The session of the trajectory whose verl AgentData this is; ended when it is freed."""
        sessions: dict[str, str] | None = getattr(agent_data, _AGENT_DATA_SESSIONS, None)
        if sessions is None:
            sessions = {}
            setattr(agent_data, _AGENT_DATA_SESSIONS, sessions)
        if self.name not in sessions:
            session_id = f"verl-{uuid.uuid4().hex}-{self.name}"
            sessions[self.name] = session_id
            weakref.finalize(agent_data, self._end_later, asyncio.get_running_loop(), session_id)
        return sessions[self.name]

    def _end_later(self, loop: asyncio.AbstractEventLoop, session_id: str) -> None:
        # A finalizer: it may run in any thread, and must not raise.
        def start() -> None:
            task = asyncio.ensure_future(self.end_session(session_id))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

        with contextlib.suppress(RuntimeError):  # the loop is closed: the idle TTL ends it
            loop.call_soon_threadsafe(start)

    async def wait_ended(self) -> None:
        """Let the ends of freed trajectories' sessions finish (before closing the client)."""
        await asyncio.sleep(0)  # the ends a finalizer has just scheduled start
        while self._ending:
            await asyncio.gather(*self._ending, return_exceptions=True)

    def default_schema(self) -> dict[str, Any]:
        return jupyter_tool_schema()

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """A new instance; in a trajectory scope it shares the trajectory's session."""
        instance_id = instance_id or uuid.uuid4().hex
        trajectory = _TRAJECTORY.get()
        if trajectory is None:
            self._instances[instance_id] = (f"verl-{instance_id}", True)
        else:
            self._instances[instance_id] = (trajectory.session_of(self), False)
        return instance_id, ToolResponse()

    def session_of(self, instance_id: str) -> str | None:
        if instance_id not in self._instances:
            raise KeyError(f"no instance {instance_id!r}: create() it first")
        return self._instances[instance_id][0]

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """End the instance's own session; a trajectory's session ends with its scope."""
        session_id, owned = self._instances.pop(instance_id, (None, False))
        if session_id is not None and owned:
            await self.end_session(session_id)


@register(AGENT_NAME)
class SandboxToolAgentLoop(ToolAgentLoop):  # type: ignore[misc]  # verl is untyped
    """verl's ToolAgentLoop with each trajectory in a trajectory_scope (one session per tool)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        async with trajectory_scope():
            return await super().run(sampling_params, **kwargs)
