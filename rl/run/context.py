"""The state one training run's stages share, built once, passed to every stage function."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl.config import GRPOConfig
from rl.data.tasks import Demonstration, Problem
from rl.engines.base import Engine
from rl.grpo import MicroBatching
from rl.parallel.distributed import Topology
from rl.reward.grading import CodeGrader, Grader, LocalGrader, ServiceClient, ServiceGrader
from rl.reward.verifier import VerifierPool
from rl.rollout.loop import HFCodec, RolloutSettings
from rl.rollout.scheduler import RolloutScheduler
from rl.rollout.template import PromptTemplate
from rl.run.checkpoint import Progress
from rl.run.records import Recorder
from rl.run.train_config import TrainConfig
from rl.trajectory import Trajectory
from trainer_client.tools import Executes


@dataclass(eq=False, slots=True)
class RunContext:
    """One run's parts (fixed once built) and its moving state (progress, optimizer)."""

    config: TrainConfig
    run_dir: Path
    template: PromptTemplate
    tokenizer: Any
    model: Any
    """The causal LM (the engines' when they share it); under torchrun, sharded inside policy."""
    policy: torch.nn.Module
    """The trained module: a LogProbModel over model, FSDP2-sharded under torchrun."""
    topology: Topology
    codec: HFCodec
    pad_id: int
    stop_token_ids: tuple[int, ...]
    amp: torch.dtype | None
    problems: list[Problem]
    demos: list[Demonstration]
    engines: list[Engine]
    scheduler: RolloutScheduler[Trajectory]
    tools: Executes
    verifier: VerifierPool | None
    """The local verifier pool (reward.verifier = "local"); None when the service grades."""
    verify_client: ServiceClient | None
    """The service that grades (reward.verifier = "service"); None when the pool does."""
    records: Recorder
    rng: random.Random
    """Resample-on-Correct's ties and the mini-batch shuffle."""
    progress: Progress
    optimizer: torch.optim.Optimizer | None = None
    """The GRPO optimizer, carried across GRPO stages (SFT stages have their own)."""
    schedule: torch.optim.lr_scheduler.LambdaLR | None = None
    warmup_steps: int = 0
    """The warm-up the GRPO schedule was made with (a resume remakes it the same)."""
    policy_version: int = 0
    """Optimizer steps taken by this process (SFT and GRPO): the weights' version."""
    synced_version: int = 0
    """The version the engines with their own weights hold (they start from the run's)."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Mixed-precision forwards when amp_dtype is set."""
        if self.amp is None:
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device
        return torch.autocast(device.type, dtype=self.amp)

    def grader(self, grpo: GRPOConfig) -> Grader:
        """How a stage's rollouts are graded: by the service as each ends, or by the pool."""
        if grpo.answer_kind == "code":
            if self.verify_client is None:
                raise ValueError(
                    'answer_kind "code" is graded by the service: reward.verifier "service"'
                )
            return CodeGrader(
                self.verify_client, fallback_to_last_block=grpo.fallback_to_last_boxed
            )
        if self.verify_client is not None:
            return ServiceGrader(
                self.verify_client,
                timeout_s=grpo.verify_timeout_s,
                rel_tol=grpo.verify_rel_tol,
                fallback_to_last_boxed=grpo.fallback_to_last_boxed,
            )
        if self.verifier is None:
            raise RuntimeError("the run has neither a verifier pool nor a service to grade")
        return LocalGrader(self.verifier, grpo.fallback_to_last_boxed)

    def batching(self) -> MicroBatching:
        """The update's micro-batches, from the trainer config."""
        t = self.config.trainer
        return MicroBatching(t.micro_batch_tokens or 1 << 62, t.micro_batch_size)

    def rollout_settings(self, grpo: GRPOConfig) -> RolloutSettings:
        """Rollout limits of a stage."""
        r = self.config.rollout
        return RolloutSettings(
            max_turns=grpo.max_turns,
            max_response_tokens=grpo.max_response_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            tool_timeout_s=r.tool_timeout_s,
            tool_response_chars=r.tool_response_chars or None,
            stop_token_ids=self.stop_token_ids,
        )
