"""`rl-sandbox run`: one program in the jail, no service, the result printed as JSON."""

from __future__ import annotations

import argparse
import json
import sys
import uuid

from sandbox_service.execution import ExecutionSpec
from sandbox_service.jail import JailExecutor, compiled
from sandbox_service.jobs import result_to_wire
from sandbox_service.settings import Settings


def run_once(args: argparse.Namespace) -> int:
    """Run the program named by the arguments; exit 0 when it ran (whatever its status)."""
    settings = Settings()
    if args.file == "-":
        code = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as f:
            code = f.read()
    limits = settings.limits(timeout_s=args.timeout, memory_mb=args.memory_mb)
    spec = ExecutionSpec(code=code, stdin=args.stdin, limits=limits, execution_id=uuid.uuid4().hex)
    # One program: a cold jail (no preload to pay for, no next jail to start ahead).
    executor = JailExecutor(settings, slot=0, mode=args.mode or "cold", start_ahead=False)
    try:
        if args.language == "python":
            result = executor.run(spec)
        else:
            result = compiled.run_program(
                args.language,
                spec,
                executor.run,
                compiled.default_cache(),
                "default",
                settings.compile_timeout_s,
            )
    finally:
        executor.close()
    json.dump(result_to_wire(result, spec.execution_id), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
