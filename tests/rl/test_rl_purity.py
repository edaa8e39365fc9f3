"""rl/ is a pure core: no service imports, and the trainer process never loads sympy for it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rl
from rl.config import GRPOConfig

RL_DIR = Path(rl.__file__).resolve().parent
FORBIDDEN = {"fastapi", "rq", "redis", "httpx", "uvicorn", "sandbox_service", "trainer_client"}
EDGES = {
    # The rollout loop reads tool calls and renders results with trainer_client's pure helpers
    # and sends them through any object with SandboxClient.execute.
    "rollout/loop.py": {"trainer_client"},
    "rollout/demonstrations.py": {"trainer_client"},  # tool calls of demonstrations
    "data/tasks.py": {"trainer_client"},  # the tool's name, for demonstrations
    "run/trainer.py": {"trainer_client"},  # creates the SandboxClient
    "run/evaluate.py": {"trainer_client"},  # creates the SandboxClient
    "run/build.py": {"trainer_client"},  # the tool's schema, for the template
    "run/collect.py": {"trainer_client"},  # the Executes protocol
    "run/context.py": {"trainer_client"},  # the Executes protocol
    "reward/grading.py": {"trainer_client"},  # the /verify wire models, for the service grader
    "reward/answer.py": {"trainer_client"},  # the boxed-answer reader (standard library only)
    "engines/openai_api.py": {"httpx"},  # the OpenAI-compatible server client
    "run/local_service.py": {"sandbox_service"},  # starts the trainer's private service
    # The parent-death helper (standard library only), imported in the pool's process only:
    # the import test below keeps the checker itself free of it.
    "reward/verify_worker.py": {"sandbox_service"},
}
"""The modules that touch an outside system, and the one each may touch."""


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


MODULES = sorted(p.relative_to(RL_DIR).as_posix() for p in RL_DIR.rglob("*.py"))


@pytest.mark.parametrize("module", MODULES)
def test_no_module_imports_a_service(module: str) -> None:
    assert not imported_roots(RL_DIR / module) & (FORBIDDEN - EDGES.get(module, set()))


def test_every_edge_names_a_module() -> None:
    assert set(EDGES) <= set(MODULES)


def test_importing_the_selection_and_reward_code_loads_nothing_heavy() -> None:
    code = (
        "import json, sys\n"
        "import rl.reward.outcome, rl.roc, rl.penalties, rl.config\n"
        "import rl.reward.answer, rl.reward.verifier\n"
        "print(json.dumps(sorted(m for m in sys.modules if '.' not in m)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(RL_DIR.parent)),
    )
    loaded = set(json.loads(out.stdout))
    # trainer_client's standard-library helpers may load (the package imports lazily), not what
    # the client depends on
    heavy = {"sympy", "math_verify", "torch", "numpy", "pydantic", *FORBIDDEN} - {"trainer_client"}
    assert not loaded & heavy


def test_config_defaults_are_the_papers() -> None:
    c = GRPOConfig()
    assert (c.group_size, c.rollouts_per_prompt, c.min_pos, c.min_neg) == (16, 32, 2, 2)
    assert (c.eps_low, c.eps_high, c.dual_clip) == (0.2, 0.28, None)
    assert (c.roc_mode, c.err_detector, c.format_rule) == ("paper", "structured", "paper")
    assert (c.learning_rate, c.warmup_steps, c.prompts_per_step, c.max_turns) == (1e-6, 20, 512, 10)


def test_config_fields_each_have_a_docstring() -> None:
    tree = ast.parse((RL_DIR / "config.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[i + 1]
            assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), ast.dump(node)


@pytest.mark.parametrize(
    "bad",
    [
        {"min_pos": 10, "min_neg": 10},
        {"roc_mode": "greedy"},
        {"err_detector": "regex"},
        {"eps_low": 1.5},
        {"dual_clip": 1.0},
        {"sample_eps": 0.0},
        {"verify_timeout_s": 0.0},
    ],
)
def test_config_refuses_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GRPOConfig(**bad)  # type: ignore[arg-type]
