"""The worker processes: one jailed executor slot each, serving jobs and session cells from RQ."""
