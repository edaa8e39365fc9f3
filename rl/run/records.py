"""What a run writes as it goes: JSON lines, the progress bar, and optional metric sinks.

metrics.jsonl (one line per RL step), sft.jsonl (one per SFT step) and samples.jsonl (two
rollouts per RL step) are always written; TensorBoard event files (tensorboardX, in the `rl`
extra) and a Weights & Biases run in offline mode (`pip install wandb`; `wandb sync` uploads it
later) are written beside them when the config asks. A sink gets every numeric field of a line,
nested ones flattened with "/" (`engines/transformers0/rollouts`), under "rl/" or "sft/".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self


class Sink(Protocol):
    """Somewhere scalar metrics go, keyed by a global step."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Record values at step."""
        ...

    def close(self) -> None:
        """Flush and release."""
        ...


def flat_scalars(line: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric fields of a metrics line, nested mappings flattened with "/"."""
    out: dict[str, float] = {}
    for key, value in line.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_scalars(value, f"{name}/"))
        elif isinstance(value, int | float):  # bool too: a flag as 0/1
            out[name] = float(value)
    return out


class TensorBoardSink:
    """Event files under <run>/tensorboard, readable by `tensorboard --logdir`."""

    def __init__(self, log_dir: Path) -> None:
        from tensorboardX import SummaryWriter  # type: ignore[import-untyped,unused-ignore]

        self._writer = SummaryWriter(logdir=str(log_dir))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One scalar per value."""
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        """Flush the event file."""
        self._writer.close()


class WandbSink:
    """A Weights & Biases run, offline: files under <run>/wandb, uploaded later by `wandb sync`."""

    def __init__(
        self, run_dir: Path, *, project: str, name: str, config: Mapping[str, Any]
    ) -> None:
        import wandb  # type: ignore[import-not-found,unused-ignore]

        self._run = wandb.init(
            project=project, name=name, dir=str(run_dir), mode="offline", config=dict(config)
        )

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One history row per call."""
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        """Finish the run (writes its summary)."""
        self._run.finish()


class Recorder:
    """The run's outputs; a context manager that closes the sinks."""

    def __init__(self, run_dir: Path, sinks: list[Sink], *, progress: bool) -> None:
        self.metrics_path = run_dir / "metrics.jsonl"
        self.sft_path = run_dir / "sft.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.sinks = sinks
        self.progress = progress
        self._sft_steps = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sink in self.sinks:
            sink.close()

    def start_fresh(self) -> None:
        """A new run: no lines left from an earlier run in the same directory."""
        for path in (self.metrics_path, self.sft_path, self.samples_path):
            path.unlink(missing_ok=True)

    def keep_only(
        self, keep_rl: Callable[[dict[str, Any]], bool], keep_sft: Callable[[dict[str, Any]], bool]
    ) -> None:
        """A resumed run: drop the lines written after the checkpoint it resumes from."""
        for path, keep in (
            (self.metrics_path, keep_rl),
            (self.samples_path, keep_rl),
            (self.sft_path, keep_sft),
        ):
            if path.exists():
                lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
                path.write_text("".join(json.dumps(x) + "\n" for x in lines if keep(x)))
        if self.sft_path.exists():
            self._sft_steps = len(self.sft_path.read_text().splitlines())

    def rl_step(self, line: dict[str, Any]) -> None:
        """One RL step's metrics."""
        _append(self.metrics_path, line)
        for sink in self.sinks:
            sink.scalars(int(line["step"]), flat_scalars(line, "rl/"))

    def sft_step(self, line: dict[str, Any]) -> None:
        """One SFT step's metrics (sinks count SFT steps across SFT stages)."""
        _append(self.sft_path, line)
        self._sft_steps += 1
        for sink in self.sinks:
            sink.scalars(self._sft_steps, flat_scalars(line, "sft/"))

    def sample(self, line: dict[str, Any]) -> None:
        """One rollout shown as text."""
        _append(self.samples_path, line)

    def bar(self, total: int, description: str, initial: int = 0) -> Any:
        """A tqdm progress bar (silent without progress)."""
        from tqdm import tqdm  # type: ignore[import-untyped]

        return tqdm(total=total, initial=initial, desc=description, disable=not self.progress)


def _append(path: Path, line: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
