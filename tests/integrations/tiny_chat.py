"""Run in the trainers' environment: a tiny chat tokenizer and model, made here, offline.

The tokenizer is a byte-level BPE with Qwen's special tokens and Qwen2.5's own chat template
(the copy TRL ships, so TRL recognises it and parses tool calls as it does for Qwen); the model
a Qwen2 causal LM of a few thousand parameters with random weights. Nothing is downloaded.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
END_OF_TURN = "<|im_end|>"
CHAT_TEMPLATE = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text(
    encoding="utf-8"
)
CORPUS = [
    "system user assistant tool You are Qwen, created by Alibaba Cloud.",
    "You are a helpful assistant.",
    '{"name": "jupyter_code", "arguments": {"code": "v = 6 * 7"}}',
    '{"name": "python", "arguments": {"code": "print(6 * 7)"}}',
    "What is 6 * 7? The answer is \\boxed{42}. Tool call success stdout: 42 execution time",
    "# Tools You may call one or more functions to assist with the user query. <tools></tools>",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ ()[]{}<>=+-*/\\_.,:;'\"\n",
]


@functools.cache
def tokenizer() -> Any:
    """The tokenizer (Qwen's specials, eos `<|im_end|>`, pad `<|endoftext|>`)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 4, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=END_OF_TURN,
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[1:],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def model(seed: int = 0) -> Any:
    """A random tiny Qwen2 causal LM for `tokenizer()`."""
    import torch

    torch.manual_seed(seed)
    tok = tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def ids(text: str) -> list[int]:
    """Token ids of text (special tokens parsed), as a model would produce them."""
    out: list[int] = tokenizer()(text, add_special_tokens=False)["input_ids"]
    return out
