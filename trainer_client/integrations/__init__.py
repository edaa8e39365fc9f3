"""Adapters for trainers (docs/integrations.md): verl's tools and reward, TRL, OpenRLHF.

Importing this package or its verl-free modules (`answer`, `clients`, `coalesce`, `reward`, `code_reward`) needs only the
client's own dependencies; `trainer_client.integrations.verl` imports verl, and is loaded by
verl's tool and agent-loop registries only.
"""
