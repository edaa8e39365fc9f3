"""GRPO-RoC, the RL algorithm of rStar2-Agent: reward, penalties, Resample-on-Correct, loss.

Pure functions and tensors, no services. Importing this package loads nothing heavy: torch is
imported by `rl.advantages` and `rl.loss` only, sympy and math-verify only inside the
verifier's worker processes (`rl.reward.verify_worker`).
"""
