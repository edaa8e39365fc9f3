"""`rl-sandbox bench`: concurrency sweeps on loopback against a fresh-interpreter baseline."""
