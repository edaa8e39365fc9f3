"""rl-sandbox execution service: jailed Python for agentic RL tool calls."""

__version__ = "0.1.0"
