"""metrics.png: reward and tool error ratios per RL step, from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path


def plot_metrics(metrics_path: Path, out_path: Path) -> Path:
    """Draw reward_mean, tool_error_ratio and tool_error_ratio_pos against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(steps, [r["reward_mean"] for r in rows], marker="o", label="reward_mean")
    top.plot(
        steps, [1.0 - r["no_tool_frac"] for r in rows], ls="--", label="rollouts using the tool"
    )
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("share of rollouts")
    top.legend(loc="lower right")
    top.grid(alpha=0.3)
    bottom.plot(steps, [r["tool_error_ratio"] for r in rows], marker=".", label="all tool calls")
    bottom.plot(
        steps,
        [r["tool_error_ratio_pos"] for r in rows],
        marker=".",
        label="calls in correct rollouts",
    )
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_ylabel("tool error ratio")
    bottom.set_xlabel("RL step")
    bottom.legend(loc="upper right")
    bottom.grid(alpha=0.3)
    stages: dict[str, int] = {}
    for r in rows:
        stages.setdefault(r.get("stage", ""), r["step"])
    for name, first in stages.items():
        if first != steps[0]:
            for ax in (top, bottom):
                ax.axvline(first - 0.5, color="grey", lw=0.8)
        top.annotate(name, (first, 1.0), fontsize=8, va="top")
    fig.suptitle(metrics_path.parent.name)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
