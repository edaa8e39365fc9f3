"""Local process management: `rl-sandbox up`, a private Redis, `rl-sandbox run`, child processes."""
