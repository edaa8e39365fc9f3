"""A tiny causal LM and its tokenizer, built here from a config: nothing is downloaded.

The tokenizer is a byte-level BPE trained on the run's own text (prompts, demonstrations, tool
responses). Numbers are split into digit pairs from the left, the same wherever they stand
(after a space, a brace or a colon), so copying a number from a tool's stdout into the answer
is copying a few distinctive, frequent tokens, which a two-layer model learns in a few hundred
steps. (Measured on the demo: with one token per digit, ten symbols repeat everywhere and
copying by induction stays ambiguous; with BPE-merged digit runs, rare three-digit tokens are
copied badly.) The chat markers are single added tokens, as in Qwen's vocabulary. The model is
a Qwen2 architecture from transformers, randomly initialised: the same classes a real small chat
model uses, so the engine and the trainer run the same code for both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens: padding, turn start, turn end (EOS)."""
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Single tokens that are not special (Qwen2.5 has them so)."""


def build_tokenizer(corpus: Iterable[str], vocab_size: int) -> Any:
    """A PreTrainedTokenizerFast trained on corpus, with the chat markers as single tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # Digits in pairs from the left ("6874" -> "68" "74"): a number is split the same
            # wherever it stands, and only 110 number tokens exist, each seen often.
            pre_tokenizers.Split(Regex(r"\d{1,2}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *ADDED_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    return fast


def build_model(
    vocab_size: int,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_positions: int,
    eos_token_id: int,
    pad_token_id: int,
    seed: int,
) -> Any:
    """A randomly initialised Qwen2ForCausalLM of the given shape."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
