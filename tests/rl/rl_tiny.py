"""A tiny policy for tests: tokenizer and model built here, optionally taught a few answers."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any

import torch

from rl.data.tasks import Demonstration, tool_call_text
from rl.rollout.loop import HFCodec
from rl.rollout.template import PromptTemplate, demonstration
from rl.run.tiny import build_model, build_tokenizer
from rl.sft import SFTExample, sft_step

TEMPLATE = PromptTemplate(system="Use the tool.", user_prefix="", include_tools=False)

PRODUCT = Demonstration(
    "What is 123 * 456?",
    (
        "Let me compute it.</reason>" + tool_call_text("print(123 * 456)"),
        "It printed 56088.</reason><answer>\\boxed{56088}</answer>",
    ),
)
DIVISION = Demonstration(
    "What is 7 / 0?",
    (
        "Let me compute it.</reason>" + tool_call_text("print(7 / 0)"),
        "It failed.</reason><answer>\\boxed{0}</answer>",
    ),
)
SUCCESS = "Tool call success\nstdout: 56088\n\nexecution time: {t:.2f}s"
FAILURE = (
    "Tool call failure\nreason: \nstderr: Traceback (most recent call last):\n"
    '  File "main.py", line 1, in <module>\nZeroDivisionError: division by zero\n'
    "execution time: {t:.2f}s"
)


@functools.cache
def _tokenizer() -> Any:
    corpus = [TEMPLATE.prompt(d.question) for d in (PRODUCT, DIVISION)]
    for demo, text in ((PRODUCT, SUCCESS), (DIVISION, FAILURE)):
        corpus += [t for t, _ in demonstration(TEMPLATE, list(demo.turns), [text.format(t=0)])]
    return build_tokenizer(corpus * 4, 600)


def tiny_policy(seed: int = 0) -> tuple[Any, Any, HFCodec]:
    """An untrained model and a tokenizer trained on the demonstrations' text (built once)."""
    # One intra-op thread: the sandbox's workers share these two cores, and oversubscribed
    # threads slow tiny forwards down tenfold.
    torch.set_num_threads(1)
    tokenizer = _tokenizer()
    model = build_model(
        len(tokenizer),
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        max_positions=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        seed=seed,
    )
    return tokenizer, model, HFCodec(tokenizer)


def examples(codec: HFCodec, demo: Demonstration, response: str) -> list[SFTExample]:
    """The demonstration with the tool's execution time varied (0.00 s to 0.95 s), so that the
    model ignores it: on a loaded machine the real time is not always 0.01 s."""
    out = []
    for ms in range(0, 1000, 50):
        ids: list[int] = []
        mask: list[int] = []
        pieces = demonstration(TEMPLATE, list(demo.turns), [response.format(t=ms / 1000)])
        for text, trained in pieces:
            piece = codec.encode(text)
            ids += piece
            mask += [int(trained)] * len(piece)
        out.append(SFTExample(codec.encode(TEMPLATE.prompt(demo.question)), ids, mask))
    return out


def memorise(model: Any, codec: HFCodec, pad_id: int, steps: int = 80) -> float:
    """Overfit the model on PRODUCT and DIVISION; returns the last loss."""
    data = examples(codec, PRODUCT, SUCCESS) + examples(codec, DIVISION, FAILURE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    rng = random.Random(0)
    loss = float("inf")
    for _ in range(steps):
        batch: Sequence[SFTExample] = rng.sample(data, 8)
        loss = sft_step(model, optimizer, batch, pad_id=pad_id, micro_batch_size=16)["loss"]
    model.eval()
    return loss
