"""`rl-sandbox train`: the run configuration, the stage loop, its private service, its records."""
