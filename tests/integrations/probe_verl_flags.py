"""Run in the trainers' environment: which of the given Hydra keys verl's trainer config lacks.

Usage: probe_verl_flags.py JSON_LIST_OF_KEYS; prints the missing ones as JSON. A key given with
`+` (an addition Hydra allows) is not looked up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import omegaconf
import verl

CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"


def known(config: omegaconf.DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = omegaconf.OmegaConf.select(config, parent) if parent else config
    # keys(), not `in`: a mandatory value (`???`, e.g. rollout.name) is not "in" its node
    return isinstance(node, omegaconf.DictConfig) and leaf in node.keys()  # noqa: SIM118


if __name__ == "__main__":
    config = omegaconf.OmegaConf.load(CONFIG)
    assert isinstance(config, omegaconf.DictConfig)
    keys = json.loads(sys.argv[1])
    print(json.dumps([k for k in keys if not k.startswith("+") and not known(config, k)]))
