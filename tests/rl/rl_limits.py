"""Time limits of the verifier pools in tests/rl (a module of its own: `conftest` is not
importable by name once several test folders have one)."""

LIMIT_S = 1.0
"""The hard time limit the tests' pools enforce."""

MARGIN_S = 2.5
"""Slack over the limit for killing a worker, scheduling on a busy 2-core machine and pytest.
A check that ignored the limit would take minutes, or never end."""
