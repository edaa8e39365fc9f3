"""docs/integrations.md stays true to the example files it quotes and names."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "integrations.md").read_text()


def test_every_quoted_file_is_quoted_exactly() -> None:
    quoted = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", DOC, flags=re.DOTALL)
    assert len(quoted) >= 2
    for path, text in quoted:
        assert (REPO / path).read_text() == text, path


def test_every_named_example_and_test_exists() -> None:
    named = set(re.findall(r"`((?:examples|tests)/[\w/.-]+\.(?:py|yaml|sh))`", DOC))
    assert {"examples/trl_grpo.py", "examples/openrlhf_agent_func.py"} <= named
    assert [path for path in sorted(named) if not (REPO / path).exists()] == []


def test_the_trainer_flags_shown_are_those_of_the_script() -> None:
    block = DOC.split("### Trainer flags", 1)[1].split("```", 2)[1]
    script = (REPO / "examples" / "verl" / "run_grpo.sh").read_text()
    keys = [line.split("=", 1)[0] for line in block.strip().splitlines()]
    assert keys and [key for key in keys if f"  {key}=" not in script] == []
