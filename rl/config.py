"""GRPO-RoC settings, one docstring line per field; defaults from the rStar2-Agent paper.

Values that exist only in the released code, or in neither, say so on their line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RocMode = Literal["paper", "release"]
ErrDetector = Literal["structured", "release"]
FormatRule = Literal["paper", "release"]
AnswerKind = Literal["math", "code"]


@dataclass(frozen=True, slots=True)
class GRPOConfig:
    """Everything that shapes one GRPO-RoC step."""

    # rollouts and Resample-on-Correct
    group_size: int = 16
    """G: rollouts kept per question after down-sampling."""
    oversample: int = 2
    """Rollouts generated per question = oversample * group_size (paper: 2G = 32)."""
    roc_mode: RocMode = "paper"
    """"paper": positives drawn with p ~ 1/(penalty+eps), negatives uniformly; "release": sorted."""
    min_pos: int = 2
    """Fewest positives kept when a group has them (release's min_non_zero_reward_trace_num)."""
    min_neg: int = 2
    """Fewest negatives kept when a group has them (release's min_zero_reward_trace_num)."""
    sample_eps: float = 0.1
    """eps in the paper-mode weight 1/(penalty + eps); not in the paper, which leaves 1/0 open."""
    use_err_penalty: bool = True
    """Add p_err (failed tool calls) to a positive's penalty (release: roc_error_ratio)."""
    use_format_penalty: bool = True
    """Add p_format (answer tags) to a positive's penalty (release: roc_answer_format)."""
    err_detector: ErrDetector = "structured"
    """"structured": tool-result statuses; "release": substring "error" in <tool_response> text."""
    format_rule: FormatRule = "paper"
    """"paper": (answers - 1) / turns; "release": regex turn count that misses the first turn."""

    # reward
    answer_kind: AnswerKind = "math"
    """"math": the last \\boxed{} against the truth; "code": the last code block's POST /grade."""
    fallback_to_last_boxed: bool = False
    """Grade the last \\boxed{} (code: fenced block) anywhere when <answer> holds none (release)."""
    verify_timeout_s: float = 5.0
    """Hard wall-clock limit of one answer check, enforced by killing its worker process."""
    verify_workers: int = 2
    """Worker processes of the answer verifier; a killed one is replaced."""
    verify_rel_tol: float = 1e-6
    """Relative tolerance when comparing non-integer numbers; integers must match exactly."""

    # policy loss (Eq. 6-7)
    eps_low: float = 0.2
    """Lower clip range: ratio is clipped at 1 - eps_low."""
    eps_high: float = 0.28
    """Upper clip range (Clip-Higher): ratio is clipped at 1 + eps_high."""
    dual_clip: float | None = None
    """Dual-clip constant c for negative advantages; None in the paper, 3.0 in the release."""
    adv_eps: float = 1e-6
    """Added to the unbiased std of a group's rewards before dividing."""

    # optimisation and rollout recipe (§5.1)
    learning_rate: float = 1e-6
    """AdamW learning rate, constant after warm-up."""
    warmup_steps: int = 20
    """Linear learning-rate warm-up, in RL steps."""
    weight_decay: float = 0.01
    """AdamW weight decay (release script)."""
    grad_clip: float = 1.0
    """Gradient-norm clip (release script)."""
    prompts_per_step: int = 512
    """Questions per RL step."""
    temperature: float = 1.0
    """Rollout sampling temperature."""
    max_turns: int = 10
    """Assistant turns per trajectory (stages 1-2; 15 in stage 3)."""
    max_response_tokens: int = 8192
    """Response budget per trajectory, tool responses included (stage 1; 12K in stages 2-3)."""

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.oversample < 1:
            raise ValueError("group_size and oversample must be at least 1")
        if self.min_pos < 0 or self.min_neg < 0 or self.min_pos + self.min_neg > self.group_size:
            raise ValueError("need 0 <= min_pos, min_neg and min_pos + min_neg <= group_size")
        if self.roc_mode not in ("paper", "release"):
            raise ValueError(f"roc_mode {self.roc_mode!r} is not 'paper' or 'release'")
        if self.err_detector not in ("structured", "release"):
            raise ValueError(f"err_detector {self.err_detector!r} is not 'structured' or 'release'")
        if self.format_rule not in ("paper", "release"):
            raise ValueError(f"format_rule {self.format_rule!r} is not 'paper' or 'release'")
        if self.answer_kind not in ("math", "code"):
            raise ValueError(f"answer_kind {self.answer_kind!r} is not 'math' or 'code'")
        if self.sample_eps <= 0:
            raise ValueError("sample_eps must be positive")
        if not 0 < self.eps_low < 1 or self.eps_high <= 0:
            raise ValueError("need 0 < eps_low < 1 and eps_high > 0")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError("dual_clip must be greater than 1")
        if self.verify_timeout_s <= 0 or self.verify_workers < 1:
            raise ValueError("verify_timeout_s must be positive and verify_workers at least 1")

    @property
    def rollouts_per_prompt(self) -> int:
        """Rollouts generated per question before Resample-on-Correct (2G)."""
        return self.group_size * self.oversample
