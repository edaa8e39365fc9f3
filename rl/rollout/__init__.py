"""The agentic rollout: chat template, generate-then-execute loop, scheduler over engines."""
