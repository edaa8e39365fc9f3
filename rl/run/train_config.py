"""The training run's configuration: a TOML file read once into frozen dataclasses.

`load_config(path)` checks every key against these classes: an unknown key, a wrong type or an
out-of-range value raises ConfigError naming where it is (`stages[2].steps: ...`), before anything
starts. `[grpo]` holds rl.config.GRPOConfig's fields; a stage overrides the ones it changes.
Pure: no torch, no services.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rl.config import GRPOConfig


class ConfigError(ValueError):
    """The configuration file is invalid; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which policy to train."""

    source: Literal["tiny", "pretrained"] = "tiny"
    """"tiny": a small Qwen2-style LM built here from the fields below, with a tokenizer trained
    on the task's text; "pretrained": a transformers model and tokenizer from `path`."""
    path: str = ""
    """Model directory (or hub id, where the hub is reachable) when source = "pretrained"."""
    hidden_size: int = 128
    """Tiny model: width."""
    num_layers: int = 2
    """Tiny model: transformer blocks."""
    num_heads: int = 4
    """Tiny model: attention heads."""
    intermediate_size: int = 512
    """Tiny model: MLP width."""
    max_positions: int = 512
    """Tiny model: context length."""
    vocab_size: int = 512
    """Tiny model: BPE vocabulary the tokenizer is trained to (special tokens included)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the update (large models)."""
    attn_implementation: str = ""
    """transformers attention backend ("sdpa", "flash_attention_2"); empty: the default."""


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """The problems, and the SFT demonstrations."""

    kind: Literal["arithmetic", "jsonl", "parquet"] = "arithmetic"
    """"arithmetic": generated exact multiplication problems; "jsonl" or "parquet": the rows of
    `train_file` (DAPO-Math-17k is parquet)."""
    train_file: str = ""
    """The problem file (JSON lines, or parquet)."""
    question_field: str = "question"
    """Dotted path of the question in a row; a list of chat messages gives its last user
    message (DAPO-Math-17k: "prompt")."""
    answer_field: str = "answer"
    """Dotted path of the ground truth (DAPO-Math-17k: "reward_model.ground_truth")."""
    integer_answers_only: bool = False
    """Keep only problems whose answer is an integer (the paper's filter, §4.1)."""
    max_prompt_tokens: int = 0
    """Drop problems whose rendered prompt is longer than this many tokens (0: keep all)."""
    sft_file: str = ""
    """JSON lines with "question" and "turns" (assistant turns; all but the last end in a tool
    call, whose responses are produced by running them in the sandbox)."""
    num_problems: int = 4000
    """arithmetic: how many problems to draw."""
    min_digits: int = 3
    """arithmetic: fewest digits of an operand."""
    max_digits: int = 4
    """arithmetic: most digits of an operand."""
    modulus: int = 0
    """arithmetic: ask for the product's remainder by this (0: the product itself)."""
    sft_tool_fraction: float = 0.3
    """arithmetic: share of SFT demonstrations that use the tool (the rest answer directly,
    which a small model cannot do exactly: RL has to discover that the tool pays)."""


@dataclass(frozen=True, slots=True)
class TemplateConfig:
    """The prompt template (rl.rollout.template.PromptTemplate); defaults are the release's."""

    system: str | None = None
    """System instruction; None: the release's."""
    user_prefix: str | None = None
    """Put before each question; None: the release's."""
    include_tools: bool = True
    """List the tool's JSON schema in the system turn."""


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """Where tool calls run."""

    url: str = ""
    """An rl-sandbox API; empty: start a private `rl-sandbox up` for the run and stop it after."""
    api_key_env: str = ""
    """Environment variable holding the API key, if the service needs one."""
    workers: int = 2
    """Workers of the private service."""
    sandbox_uid_base: int = 64000
    """Outside uids of the private service's jailed programs (distinct from other services)."""
    max_batch_size: int = 64
    """Client micro-batch size."""
    max_wait_s: float = 0.005
    """Client micro-batch flush delay."""


@dataclass(frozen=True, slots=True)
class RewardConfig:
    """Where answers are graded (the checker and its limits are [grpo] verify_*)."""

    verifier: Literal["", "service", "local"] = ""
    """"service": the sandbox's POST /verify, each rollout as it ends; "local": a pool of
    checker processes in the trainer, after the rollouts; empty: "service" when the run talks
    to a sandbox (every training run does), else "local"."""

    def resolved(self, *, has_service: bool) -> Literal["service", "local"]:
        """The verifier in use."""
        if self.verifier:
            return self.verifier
        return "service" if has_service else "local"


TRANSFORMERS_CAPACITY_TOKENS = 65536
"""A transformers engine's token capacity when none is configured (it has no paged cache)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One inference engine."""

    kind: Literal["transformers", "vllm"] = "transformers"
    """"transformers": in process, shares the trainer's model; "vllm": colocated vLLM."""
    name: str = ""
    """Name in reports; empty: kind + index."""
    capacity_tokens: int = 0
    """Tokens of KV cache the scheduler may reserve on it; 0: the engine's own (vllm: its
    KV-cache size, asked at start; transformers: TRANSFORMERS_CAPACITY_TOKENS)."""
    max_cohorts: int = 8
    """transformers: concurrent prefill cohorts (one forward each per step)."""
    gpu_memory_utilization: float = 0.5
    """vllm: share of GPU memory for weights and KV cache (the trainer needs the rest)."""
    tensor_parallel_size: int = 1
    """vllm: GPUs one engine spans, the trainer's first (one process only: under torchrun each
    rank's engine runs on that rank's own GPU, and this must be 1)."""
    bucket_mb: int = 512
    """vllm: size of the buckets (in the engine's dtype) the weights are pushed in."""
    placement: Literal["colocated", "separate"] = "colocated"
    """vllm: "colocated" on the trainer's GPU (sleep mode frees it during the update, weights
    by IPC); "separate" on engine_devices, GPUs of its own (no sleep mode: for platforms or
    vLLM releases without it, such as vLLM 0.11.0 on ROCm; weights broadcast over NCCL/RCCL;
    one trainer process only)."""
    engine_devices: str = ""
    """vllm, placement = "separate": the engine's GPUs as the trainer numbers them ("1" or
    "1,2"; never 0, the trainer's), as many as tensor_parallel_size."""


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """Sampling and tools, shared by all stages."""

    temperature: float = 1.0
    """Sampling temperature (paper: 1.0)."""
    top_p: float = 1.0
    """Nucleus mass."""
    tool_timeout_s: float = 4.0
    """Limit of one tool program."""
    tool_response_chars: int = 256
    """Tool responses cut in the middle to this length (0: never)."""
    engines: tuple[EngineConfig, ...] = (EngineConfig(),)
    """The engines the scheduler balances over."""


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """How the update is computed."""

    micro_batch_size: int = 16
    """Sequences per forward/backward at most (gradients accumulate over a step's
    micro-batches); under torchrun, per rank."""
    micro_batch_tokens: int = 0
    """Padded tokens (rows x longest prompt + response) per forward/backward at most, so long
    rollouts go a few at a time and short ones many (0: no token bound)."""
    logprob_chunk_tokens: int = 1024
    """Response positions whose vocabulary logits exist at once per row (rl.logprobs)."""
    minibatches: int = 1
    """Optimizer steps per RL step, over disjoint parts of the kept rollouts (release: 1)."""
    recompute_old_logprobs: bool = True
    """pi_old from a forward of the policy before the update (release); False: sampling ones."""
    checkpoint_every: int = 0
    """Save every this many RL steps (0: only at the end of each stage)."""
    keep_checkpoints: int = 2
    """Periodic (step-N) checkpoints kept, newest first; stage-end ones are always kept."""
    collective_timeout_s: float = 3 * 3600.0
    """Under torchrun: how long a collective waits for the slowest rank (its rollouts, rank
    0's checkpoint) before the run ends; torch's NCCL default is 10 minutes."""


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """Metric sinks beside metrics.jsonl and metrics.png (rl.run.records)."""

    tensorboard: bool = False
    """Write TensorBoard event files to <run>/tensorboard (tensorboardX, in the `rl` extra)."""
    wandb: bool = False
    """Log a Weights & Biases run in offline mode to <run>/wandb (needs `pip install wandb`;
    upload later with `wandb sync`)."""
    wandb_project: str = "rl-sandbox"
    """The W&B project the offline run belongs to."""


StageKind = Literal["sft", "grpo"]


@dataclass(frozen=True, slots=True)
class StageConfig:
    """One stage of the recipe: SFT, or GRPO-RoC with its own limits."""

    name: str
    """Name in logs and checkpoints."""
    kind: StageKind = "grpo"
    """"sft": teach the format on demonstrations; "grpo": GRPO-RoC with tool rollouts."""
    steps: int = 1
    """Optimizer steps (sft) or RL steps (grpo)."""
    learning_rate: float | None = None
    """None: [grpo].learning_rate."""
    warmup_steps: int | None = None
    """None: [grpo].warmup_steps (sft: 4 % of steps)."""
    batch_size: int = 32
    """sft: demonstrations per step."""
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    """sft: after warm-up, "cosine" decays the rate to 0 over the rest of the stage; "constant"
    keeps it until the last `decay_steps`, which decay it to 0 (warm-up, stable, decay)."""
    decay_steps: int = 0
    """sft with lr_schedule = "constant": steps at the end whose rate decays (cosine) to 0."""
    max_response_tokens: int | None = None
    """grpo: response budget (paper: 8K, 12K, 12K); None: [grpo]'s."""
    max_turns: int | None = None
    """grpo: assistant turns (paper: 10, 10, 15); None: [grpo]'s."""
    prompts_per_step: int | None = None
    """grpo: questions per step; None: [grpo]'s."""
    reset_optimizer: bool = False
    """grpo: fresh AdamW state at the start of this stage (paper: stage 3)."""
    drop_solved_samples: int = 0
    """grpo: before the stage, sample each problem this many times and drop those always solved
    (paper's stage-3 filter: 8); 0: no filter."""
    filter_max_problems: int = 0
    """grpo: check at most this many problems in the filter (0: all)."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """A whole run."""

    name: str
    """Run name: outputs go to <runs_dir>/<name>/."""
    stages: tuple[StageConfig, ...]
    """Run in order."""
    runs_dir: str = "runs"
    """Parent of run directories (relative to the working directory)."""
    seed: int = 0
    """Seeds torch, the task and Resample-on-Correct."""
    device: str = "auto"
    """"auto" (cuda, else cpu), or any torch device string."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the policy (keep float32 with AdamW at lr 1e-6: bf16 rounds the
    updates away; use amp_dtype for fast forwards instead)."""
    amp_dtype: Literal["", "bfloat16", "float16"] = ""
    """Autocast dtype of forwards (rollouts and update) on any device; empty: none."""
    torch_threads: int = 0
    """Intra-op threads on CPU (0: torch's default)."""
    plot: bool = True
    """Write metrics.png (reward and tool error ratio per RL step) at the end."""
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    template: TemplateConfig = TemplateConfig()
    sandbox: SandboxConfig = SandboxConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    logging: LoggingConfig = LoggingConfig()
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def stage_grpo(self, stage: StageConfig) -> GRPOConfig:
        """[grpo] with the stage's overrides applied."""
        overrides: dict[str, Any] = {}
        for name in ("learning_rate", "warmup_steps", "max_response_tokens", "max_turns"):
            value = getattr(stage, name)
            if value is not None:
                overrides[name] = value
        if stage.prompts_per_step is not None:
            overrides["prompts_per_step"] = stage.prompts_per_step
        return dataclasses.replace(self.grpo, **overrides)


# --- loading ------------------------------------------------------------------------------------


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a TOML run configuration."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return config_from_dict(raw, source=str(path))


def config_from_dict(raw: dict[str, Any], *, source: str = "config") -> TrainConfig:
    """Validate a parsed configuration (a TOML document as a dict)."""
    try:
        config = _build(TrainConfig, raw, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    assert isinstance(config, TrainConfig)
    _check(config, source)
    return config


def _where(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _build(cls: type[Any], table: object, where: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{where or 'the file'}: expected a table, got {_kind(table)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where or 'top level'}: unknown key {unknown[0]!r}; known keys: {', '.join(fields)}"
        )
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name in table:
            values[name] = _value(hints[name], table[name], _where(where, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{_where(where, name)}: required")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or 'top level'}: {exc}") from None


def _kind(value: object) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _value(hint: Any, value: object, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value(options[0], value, where)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin is tuple:
        (item, _) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected an array, got {_kind(value)}")
        return tuple(_value(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)  # type: ignore[arg-type]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_kind(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_kind(value)} {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {_kind(value)} {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_kind(value)} {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported setting type {hint}")  # a bug in this module


def _check(config: TrainConfig, source: str) -> None:
    problems: list[str] = []
    if not config.name or "/" in config.name or config.name.startswith("."):
        problems.append(f"name: {config.name!r} must be a plain directory name")
    if not config.stages:
        problems.append("stages: at least one [[stages]] table is needed")
    names = [s.name for s in config.stages]
    if len(set(names)) != len(names):
        problems.append(f"stages: names must be unique, got {names}")
    for i, stage in enumerate(config.stages):
        at = f"stages[{i}] ({stage.name})"
        if stage.steps < 1:
            problems.append(f"{at}.steps: must be at least 1, got {stage.steps}")
        if stage.learning_rate is not None and stage.learning_rate <= 0:
            problems.append(f"{at}.learning_rate: must be positive")
        if stage.batch_size < 1:
            problems.append(f"{at}.batch_size: must be at least 1")
        if stage.decay_steps < 0 or stage.decay_steps > stage.steps:
            problems.append(f"{at}.decay_steps: must be between 0 and steps ({stage.steps})")
        if stage.decay_steps and stage.lr_schedule != "constant":
            problems.append(f'{at}.decay_steps: only with lr_schedule = "constant"')
        if stage.kind == "grpo":
            grpo = config.stage_grpo(stage)
            if grpo.max_response_tokens < 1 or grpo.max_turns < 1 or grpo.prompts_per_step < 1:
                problems.append(f"{at}: max_response_tokens, max_turns, prompts_per_step >= 1")
            if config.model.source == "tiny" and grpo.max_response_tokens >= (
                config.model.max_positions
            ):
                problems.append(
                    f"{at}.max_response_tokens: {grpo.max_response_tokens} does not leave room "
                    f"for the prompt in model.max_positions = {config.model.max_positions}"
                )
        if stage.drop_solved_samples < 0 or stage.filter_max_problems < 0:
            problems.append(f"{at}: drop_solved_samples and filter_max_problems must be >= 0")
    if config.grpo.answer_kind == "code" and config.reward.verifier == "local":
        problems.append('reward.verifier: grpo.answer_kind = "code" is graded by the service')
    if config.model.source == "pretrained" and not config.model.path:
        problems.append('model.path: required when model.source = "pretrained"')
    if config.model.source == "tiny" and config.model.hidden_size % config.model.num_heads:
        problems.append("model.hidden_size: must be a multiple of model.num_heads")
    if config.task.kind != "arithmetic" and not config.task.train_file:
        problems.append(f'task.train_file: required when task.kind = "{config.task.kind}"')
    if config.task.max_prompt_tokens < 0:
        problems.append("task.max_prompt_tokens: must be >= 0")
    if config.task.kind == "arithmetic" and not 1 <= config.task.min_digits <= (
        config.task.max_digits
    ):
        problems.append("task: need 1 <= min_digits <= max_digits")
    if config.task.modulus < 0:
        problems.append("task.modulus: must be >= 0")
    if not 0.0 <= config.task.sft_tool_fraction <= 1.0:
        problems.append("task.sft_tool_fraction: must be within [0, 1]")
    if not config.rollout.engines:
        problems.append("rollout.engines: at least one engine is needed")
    engine_names = [e.name or f"{e.kind}{i}" for i, e in enumerate(config.rollout.engines)]
    if len(set(engine_names)) != len(engine_names):
        problems.append(f"rollout.engines: names must be unique, got {engine_names}")
    for i, engine in enumerate(config.rollout.engines):
        if engine.capacity_tokens < 0:
            problems.append(f"rollout.engines[{i}].capacity_tokens: must be 0 or positive")
        if engine.placement == "separate" and (engine.kind != "vllm" or not engine.engine_devices):
            problems.append(
                f'rollout.engines[{i}].placement: "separate" is for vllm engines, with '
                "engine_devices naming the engine's own GPUs"
            )
        if engine.engine_devices and engine.placement != "separate":
            problems.append(
                f'rollout.engines[{i}].engine_devices: only with placement = "separate"'
            )
    if config.trainer.collective_timeout_s <= 0:
        problems.append("trainer: collective_timeout_s must be positive")
    if config.trainer.logprob_chunk_tokens < 1:
        problems.append("trainer: logprob_chunk_tokens must be at least 1")
    if config.trainer.micro_batch_tokens < 0:
        problems.append("trainer: micro_batch_tokens must be 0 (no bound) or positive")
    if config.trainer.micro_batch_size < 1 or config.trainer.minibatches < 1:
        problems.append("trainer: micro_batch_size and minibatches must be at least 1")
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
