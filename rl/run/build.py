"""Building a run's parts from its config: device, template, task, policy, engines.

Each function returns values; nothing here trains or records. A resumed run builds the same
parts, with the policy read back from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rl.data.datasets import Columns, load_problem_file
from rl.data.tasks import (
    Demonstration,
    Problem,
    arithmetic_demonstration,
    arithmetic_demonstrations,
    arithmetic_problems,
    load_demonstrations,
)
from rl.engines.base import Engine
from rl.rollout.template import PromptTemplate, demonstration, rstar2_template
from rl.run.train_config import TRANSFORMERS_CAPACITY_TOKENS, TrainConfig
from trainer_client.tools import python_tool_schema

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """ "auto": the accelerator torch sees (CUDA or ROCm both answer to "cuda"), else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_template(config: TrainConfig) -> PromptTemplate:
    """The release's template with the config's overrides."""
    base = rstar2_template([python_tool_schema()])
    overrides: dict[str, Any] = {"include_tools": config.template.include_tools}
    if config.template.system is not None:
        overrides["system"] = config.template.system
    if config.template.user_prefix is not None:
        overrides["user_prefix"] = config.template.user_prefix
    return dataclasses.replace(base, **overrides)


def load_tokenizer(path: str, auto: Any) -> Any:
    """The tokenizer saved with a model; a plain tokenizers one (our tiny model's) as it was.

    AutoTokenizer would pick the model type's tokenizer class (Qwen2's for the tiny model) and
    replace the saved pre-tokenizer with that class's, changing how numbers are split.
    """
    config = Path(path) / "tokenizer_config.json"
    if config.exists():
        saved = json.loads(config.read_text()).get("tokenizer_class")
        if saved in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(path)
    return auto.from_pretrained(path)


def load_task(config: TrainConfig) -> tuple[list[Problem], list[Demonstration]]:
    """The problems to train on and the SFT demonstrations (prompt-length cap not yet applied)."""
    task, seed = config.task, config.seed
    if task.kind != "arithmetic":
        columns = Columns(question=task.question_field, answer=task.answer_field)
        problems, report = load_problem_file(
            task.train_file,
            task.kind,
            columns,
            integer_answers_only=task.integer_answers_only,
        )
        print(
            f"task: {report.kept} of {report.rows} problems from {task.train_file}"
            f" ({report.not_integer} without an integer answer dropped)",
            flush=True,
        )
        demos = load_demonstrations(task.sft_file) if task.sft_file else []
        return problems, demos
    shape = {"min_digits": task.min_digits, "max_digits": task.max_digits}
    problems = arithmetic_problems(task.num_problems, seed=seed, modulus=task.modulus, **shape)
    # Demonstrations on other problems (another seed): SFT teaches the format, not answers.
    sft_problems = arithmetic_problems(
        task.num_problems, seed=seed + 1, modulus=task.modulus, **shape
    )
    demos = arithmetic_demonstrations(sft_problems, tool_fraction=task.sft_tool_fraction, seed=seed)
    return problems, demos


def cap_prompt_length(
    problems: list[Problem], template: PromptTemplate, tokenizer: Any, max_tokens: int
) -> list[Problem]:
    """The problems whose rendered prompt has at most max_tokens tokens (0: all of them)."""
    if not max_tokens:
        return problems
    kept = [
        p
        for p in problems
        if len(tokenizer.encode(template.prompt(p.question), add_special_tokens=False))
        <= max_tokens
    ]
    print(f"task: {len(problems) - len(kept)} prompts over {max_tokens} tokens dropped", flush=True)
    if not kept:
        raise ValueError(f"task.max_prompt_tokens = {max_tokens} drops every problem")
    return kept


def build_policy(
    config: TrainConfig,
    run_dir: Path,
    corpus: Iterator[str],
    *,
    checkpoint: Path | None = None,
    device: torch.device | None = None,
    save_tokenizer: bool = True,
) -> tuple[Any, Any]:
    """(tokenizer, model) on device (None: the config's): from the checkpoint when resuming,
    else new (a tiny model's tokenizer saved to the run when save_tokenizer)."""
    m = config.model
    dtype = DTYPES[config.dtype]
    model: Any
    tokenizer: Any
    if checkpoint is not None or m.source == "pretrained":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(checkpoint) if checkpoint is not None else m.path
        tokenizer = load_tokenizer(path, AutoTokenizer)
        kwargs: dict[str, Any] = {"dtype": dtype}
        if m.attn_implementation:
            kwargs["attn_implementation"] = m.attn_implementation
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    else:
        from rl.run.tiny import build_model, build_tokenizer

        tokenizer = build_tokenizer(corpus, m.vocab_size)
        if save_tokenizer:
            tokenizer.save_pretrained(run_dir / "tokenizer")
        model = build_model(
            len(tokenizer),
            hidden_size=m.hidden_size,
            num_layers=m.num_layers,
            num_heads=m.num_heads,
            intermediate_size=m.intermediate_size,
            max_positions=m.max_positions,
            eos_token_id=int(tokenizer.eos_token_id),
            pad_token_id=int(tokenizer.pad_token_id),
            seed=config.seed,
        ).to(dtype)
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return tokenizer, model.to(device or resolve_device(config.device))


def build_trained(
    config: TrainConfig, model: Any, device: torch.device, world_size: int
) -> torch.nn.Module:
    """The module the update trains: a LogProbModel over the LM, FSDP2-sharded over the
    ranks under torchrun (bfloat16 forwards, float32 reductions on accelerators; float32 on
    CPU, gloo)."""
    from rl.logprobs import LogProbModel
    from rl.parallel.distributed import shard_model

    policy = LogProbModel(model, chunk_tokens=config.trainer.logprob_chunk_tokens)
    if world_size > 1:
        shard_model(policy, param_dtype=torch.bfloat16 if device.type != "cpu" else None)
    return policy


def tokenizer_corpus(
    config: TrainConfig,
    template: PromptTemplate,
    problems: list[Problem],
    demos: list[Demonstration],
) -> Iterator[str]:
    """Text like what the tiny model will read and write, to train its BPE on."""
    samples = (
        "Tool call success\nstdout: 1234567\nexecution time: 0.01s",
        "Tool call failure\nreason: \nstderr: Traceback (most recent call last):\n"
        "  File \"main.py\", line 1, in <module>\nNameError: name 'x' is not defined\n"
        "execution time: 0.02s",
        "Tool call failure\nreason: worker_timeout\nexecution time: 4.00s",
        "Failed to decode tool call: Expecting ',' delimiter: line 1 column 48 (char 47)",
    )
    arithmetic = config.task.kind == "arithmetic"
    for i, problem in enumerate(problems[:2000]):
        yield template.prompt(problem.question)
        if arithmetic:
            demo = arithmetic_demonstration(problem, use_tool=i % 2 == 0)
            responses = [samples[0].replace("1234567", problem.answer)] * (len(demo.turns) - 1)
            for text, _ in demonstration(template, list(demo.turns), responses):
                yield text
    for demo in demos[:2000] if not arithmetic else []:
        yield template.prompt(demo.question)
        yield from demo.turns
    yield from samples


def stop_token_ids(tokenizer: Any, template: PromptTemplate) -> tuple[int, ...]:
    """The end-of-turn token and the EOS, where the tokenizer has them."""
    end = tokenizer.convert_tokens_to_ids(template.turn_end)
    stops = {int(end)} if isinstance(end, int) and end >= 0 else set()
    if tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    return tuple(sorted(stops))


def pad_token_id(tokenizer: Any) -> int:
    """The pad token, else the EOS."""
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def build_engines(
    config: TrainConfig,
    model: Any,
    tokenizer: Any,
    *,
    pad_id: int,
    amp: torch.dtype | None,
    model_path: str,
    rank: int = 0,
    local_rank: int = 0,
    world_size: int = 1,
) -> list[Engine]:
    """The configured engines (this rank's, under torchrun: seeded apart from the other
    ranks'); transformers ones share the trainer's model, vLLM loads model_path (the
    checkpoint's, when resuming) on this rank's GPU (local_rank)."""
    seed = config.seed + 1009 * rank
    from rl.engines.hf import TransformersEngine

    engines: list[Engine] = []
    for i, e in enumerate(config.rollout.engines):
        name = e.name or f"{e.kind}{i}"
        if e.kind == "transformers":
            engines.append(
                TransformersEngine(
                    model,
                    tokenizer,
                    name=name,
                    capacity_tokens=e.capacity_tokens or TRANSFORMERS_CAPACITY_TOKENS,
                    max_cohorts=e.max_cohorts,
                    pad_token_id=pad_id,
                    seed=seed + i,
                    autocast_dtype=amp,
                )
            )
        else:
            from rl.engines.vllm_colocated import VLLMEngine

            engines.append(
                VLLMEngine.create(
                    model_path,
                    name=name,
                    capacity_tokens=e.capacity_tokens,
                    gpu_memory_utilization=e.gpu_memory_utilization,
                    tensor_parallel_size=e.tensor_parallel_size,
                    bucket_mb=e.bucket_mb,
                    seed=seed + i,
                    local_rank=local_rank,
                    world_size=world_size,
                    rank=rank,
                    top_p=config.rollout.top_p,
                    placement=e.placement,
                    engine_devices=e.engine_devices,
                )
            )
    return engines
