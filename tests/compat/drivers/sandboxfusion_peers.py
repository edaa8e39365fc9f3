"""tinker-cookbook's and skyrl-agent's own SandboxFusion code against rl-sandbox, configured by
their environment variables (SANDBOX_URL, SANDBOX_FUSION_URL). Prints one JSON object."""

import asyncio
import importlib.util
import json
import os
import sysconfig
from pathlib import Path

from tinker_cookbook.recipes.code_rl.code_grading import sandbox_check_correctness

SUM = "a, b = map(int, input().split())\nprint(a + b)"
TESTS = [
    {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
    {"input": "5 7\n", "output": "12\n", "testtype": "stdin"},
]
seen = {}

# tinker-cookbook: the code-RL reward's grading call (SANDBOX_URL), right and wrong programs
right, details = asyncio.run(sandbox_check_correctness(TESTS, SUM))
seen["tinker_right"] = right
seen["tinker_right_status"] = details.get("status")
wrong, details = asyncio.run(sandbox_check_correctness(TESTS, "print(0)"))
seen["tinker_wrong"] = wrong
seen["tinker_wrong_status"] = details.get("status")

# skyrl-agent: its code_interpreter tool's call, `_process_single_case(0, None, None,
# SANDBOX_FUSION_URL + "/run_code", code, 30, 1024, language)`. The package's __init__ imports
# its agent runner (litellm...), so the module is loaded from its file.
site = Path(sysconfig.get_paths()["purelib"])
path = site / "skyrl-agent/skyrl_agent/tasks/verifiers/sandbox_fusion/utils.py"
spec = importlib.util.spec_from_file_location("skyrl_sandbox_fusion_utils", path)
utils = importlib.util.module_from_spec(spec)
spec.loader.exec_module(utils)
url = os.environ["SANDBOX_FUSION_URL"] + "/run_code"
_, metadata = utils._process_single_case(0, None, None, url, "print(6 * 7)", 30, 1024, "python")
seen["skyrl_tool"] = [metadata["run_status"], metadata["stdout"]]
_, graded = utils._process_single_case(0, "1 2\n", "3\n", url, SUM, 30, 1024, "python")
seen["skyrl_graded"] = graded["status"]
_, failed = utils._process_single_case(0, "1 2\n", "3\n", url, "print(0)", 30, 1024, "python")
seen["skyrl_wrong"] = failed["status"]
print(json.dumps(seen))
