"""The GPU check of the trainer: what a GPU host must pass before a real run (under 5 minutes).

Part (a), torch and transformers only (no download, no vLLM): a Qwen2-architecture model built
from a config on the device in bf16; rollouts sampled by the transformers engine; the engine's
log-probs against the trainer's recomputation; the trainer's SFT step and a GRPO-RoC update
(Resample-on-Correct, clipped loss, AdamW); the same update under FSDP2 on one rank (NCCL; gloo
on the CPU); the vLLM weight push's buckets shared by IPC with a spawned process that rebuilds
them through vLLM's msgpack boundary and the worker extension's own rl_load_bucket (every
tensor's bytes equal, memory released after); throughput; one tool call through the real jail
when a private service can start here (`--jail auto`), else what stood in is printed.
Part (b), only where vLLM is installed: the colocated VLLMEngine started on a small model (the
`--vllm-model` directory, else .gpu-bundle's tiny Qwen2, else one written from a config: nothing
downloaded), the trainer's perturbed weights synced into it, 32 prompts sampled, its log-probs
against the trainer's after the sync, throughput.

Needs torch, transformers, tokenizers, numpy and msgpack only (any Python from 3.11).

    python scripts/gpu_check.py                           # both parts on the GPU
    python scripts/gpu_check.py --vllm-model /models/Qwen2.5-0.5B-Instruct   # part (b) on it
    python scripts/gpu_check.py --device cpu --jail off   # the dry run make test runs
    python scripts/gpu_check.py --bundle                  # make gpu-bundle: .gpu-bundle/

Exits 1 when a check fails (each prints FAIL and its numbers), 0 otherwise. A module with a
guarded main: the spawned processes (the IPC check's, vLLM's engine core) re-import it.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import multiprocessing
import random
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (after the repository is on the path, for rl/)


@dataclass(frozen=True, slots=True)
class Size:
    """The model and rollout shape of a check: large enough on a GPU to time, tiny on a CPU."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    prompts: int
    group: int
    new_tokens: int
    bucket_bytes: int


GPU_SIZE = Size(1024, 12, 16, 2816, 4000, 16, 8, 128, 32 << 20)
CPU_SIZE = Size(64, 2, 4, 128, 400, 4, 4, 12, 64 << 10)

FAILED: list[str] = []


def say(part: str, text: str) -> None:
    print(f"[{part}] {text}", flush=True)


def check(part: str, ok: bool, text: str) -> None:
    """Print a check's result; a failed one is remembered for the exit code."""
    say(part, f"{'ok  ' if ok else 'FAIL'} {text}")
    if not ok:
        FAILED.append(text)


def corpus() -> list[str]:
    rng = random.Random(0)
    lines = []
    for _ in range(400):
        a, b = rng.randrange(10, 1000), rng.randrange(10, 1000)
        lines.append(f"What is {a} * {b}? Let me compute it. The answer is \\boxed{{{a * b}}}.")
    return lines


def build(size: Size, device: torch.device) -> tuple[Any, Any]:
    """(tokenizer, bf16 model on device) from a config: nothing is downloaded."""
    from rl.run.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer(corpus(), size.vocab)
    model = build_model(
        len(tokenizer),
        hidden_size=size.hidden,
        num_layers=size.layers,
        num_heads=size.heads,
        intermediate_size=size.intermediate,
        max_positions=1024,
        eos_token_id=int(tokenizer.eos_token_id),
        pad_token_id=int(tokenizer.pad_token_id),
        seed=0,
    )
    return tokenizer, model.to(device=device, dtype=torch.bfloat16)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


async def rollouts(engine: Any, prompts: list[list[int]], size: Size) -> list[Any]:
    from rl.engines.base import SamplingParams

    params = SamplingParams(max_new_tokens=size.new_tokens, temperature=1.0)
    calls = [engine.generate(p, params) for p in prompts for _ in range(size.group)]
    return list(await asyncio.gather(*calls))


def trajectories_of(prompts: list[list[int]], generations: list[Any], size: Size) -> list[Any]:
    from rl.trajectory import Trajectory

    out = []
    for i, g in enumerate(generations):
        n = len(g.token_ids)
        out.append(
            Trajectory(
                prompts[i // size.group],
                list(g.token_ids),
                [1] * n,
                list(g.logprobs),
                turn_spans=[(0, n)],
                finish_reason="no_tool_call",
                response_text=g.text,
                generated_text=g.text,
                group=i // size.group,
            )
        )
    return out


def part_a(device: torch.device, size: Size, jail: str) -> None:
    from rl.config import GRPOConfig
    from rl.engines.hf import TransformersEngine
    from rl.grpo import policy_update, select_and_weigh
    from rl.logprobs import LogProbModel, pad_responses, response_logprobs
    from rl.run.optim import grpo_optimizer, sft_optimizer
    from rl.sft import SFTExample, sft_step

    t0 = time.monotonic()
    tokenizer, model = build(size, device)
    params = sum(p.numel() for p in model.parameters())
    say("a", f"model: Qwen2 from a config, {params / 1e6:.1f} M parameters, bf16 on {device}")
    pad = int(tokenizer.pad_token_id)
    engine = TransformersEngine(model, tokenizer, capacity_tokens=1 << 20, pad_token_id=pad)
    prompts = [tokenizer.encode(f"What is {17 + i} * {40 + i}?") for i in range(size.prompts)]
    model.eval()
    start = time.monotonic()
    generations = asyncio.run(rollouts(engine, prompts, size))
    sync(device)
    took = time.monotonic() - start
    tokens = sum(len(g.token_ids) for g in generations)
    say(
        "a",
        f"rollouts: {len(generations)} x <= {size.new_tokens} tokens, {tokens} tokens in "
        f"{took:.2f} s = {tokens / took:.0f} tokens/s (transformers engine)",
    )
    trajectories = trajectories_of(prompts, generations, size)

    batch = pad_responses(
        [t.prompt_ids for t in trajectories],
        [t.response_ids for t in trajectories],
        [t.loss_mask for t in trajectories],
        pad_id=pad,
        device=device,
    )
    with torch.no_grad():
        mine = response_logprobs(model, batch, temperature=1.0).float()
    theirs = torch.zeros_like(mine)
    for i, t in enumerate(trajectories):
        theirs[i, : len(t.logprobs)] = torch.tensor(t.logprobs, device=device)
    mask = batch.loss_mask.float()
    diff = float(((mine - theirs).abs() * mask).sum() / mask.sum())
    check(
        "a",
        diff < 0.05,
        f"engine log-probs vs trainer recomputation: mean |diff| {diff:.4f} "
        "nats (bf16; fails at 0.05)",
    )

    policy = LogProbModel(model)
    policy.train()
    examples = [SFTExample(t.prompt_ids, t.response_ids, t.loss_mask) for t in trajectories]
    opt, _ = sft_optimizer(policy, lr=1e-4, weight_decay=0.0, warmup=1, total=1)
    start = time.monotonic()
    sft = sft_step(policy, opt, examples, pad_id=pad, micro_batch_size=16)
    sync(device)
    check(
        "a",
        sft["loss"] == sft["loss"] and sft["loss"] > 0,
        f"SFT step: loss {sft['loss']:.3f} in {time.monotonic() - start:.2f} s",
    )

    grpo = GRPOConfig(group_size=size.group // 2, oversample=2, min_pos=0, min_neg=0)
    rewards = [float(t.response_ids[0] % 2 == 0) for t in trajectories]
    selection = select_and_weigh(trajectories, rewards, grpo, random.Random(0))
    kept = [trajectories[i] for i in selection.kept]
    update_model = copy.deepcopy(policy)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    start = time.monotonic()
    metrics: dict[str, float] = {}
    if kept:
        gopt, _ = grpo_optimizer(policy, lr=1e-4, weight_decay=0.0, warmup=0)
        metrics = policy_update(policy, gopt, kept, selection.advantages, grpo, pad_id=pad)
    sync(device)
    moved = sum(not torch.equal(before[n], p) for n, p in policy.named_parameters())
    update_tokens = sum(len(t.response_ids) for t in kept)
    took = time.monotonic() - start
    check(
        "a",
        bool(kept) and moved > 0,
        f"GRPO-RoC update: {len(kept)} of {len(trajectories)} rollouts kept, loss "
        f"{metrics.get('loss', float('nan')):.4f}, {moved} tensors moved, "
        f"{update_tokens / max(took, 1e-9):.0f} response tokens/s",
    )

    fsdp_one_rank(update_model, kept, selection.advantages, grpo, pad, device)
    ipc_round_trip(model, device, size.bucket_bytes)
    tool_call(jail)
    say("a", f"part (a) took {time.monotonic() - t0:.1f} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fsdp_one_rank(
    policy: Any, kept: list[Any], advantages: list[float], grpo: Any, pad: int, device: torch.device
) -> None:
    """The update under FSDP2 on one rank of a real process group, then the push's buckets."""
    import torch.distributed as dist

    from rl.engines.vllm_cuda import bucketed
    from rl.grpo import policy_update
    from rl.parallel.distributed import full_tensor, shard_model
    from rl.run.optim import grpo_optimizer

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        device_id=device if device.type == "cuda" else None,
    )
    try:
        shard_model(policy, param_dtype=torch.bfloat16)
        opt, _ = grpo_optimizer(policy, lr=1e-4, weight_decay=0.0, warmup=0)
        start = time.monotonic()
        metrics = policy_update(policy, opt, kept, advantages, grpo, pad_id=pad)
        sync(device)
        took = time.monotonic() - start
        pushed = 0
        same = True
        whole = {n: full_tensor(p.detach()) for n, p in policy.named_parameters()}
        for bucket, buffer in bucketed(policy.named_parameters(), 64 << 20, dtype=torch.bfloat16):
            for slot, (_, tensor) in zip(bucket.slots, _by_slot(bucket, whole), strict=True):
                view = buffer[slot.offset : slot.offset + slot.numel]
                same = same and torch.equal(view, tensor.reshape(-1).bfloat16())
                pushed += 1
        check(
            "a",
            metrics["loss"] == metrics["loss"] and same and pushed == len(whole),
            f"FSDP2 on one rank ({backend}): update loss {metrics['loss']:.4f} in {took:.2f} s; "
            f"{pushed} parameters gathered into push buckets, equal to the parameters: {same}",
        )
    finally:
        dist.destroy_process_group()


def _by_slot(bucket: Any, whole: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    from rl.engines.vllm_sync import checkpoint_name

    named = {checkpoint_name(n): t for n, t in whole.items()}
    return [(s.name, named[s.name]) for s in bucket.slots]


def _digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().view(torch.int16).cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


class _LoadedModel:
    """What vLLM's model offers the worker extension (load_weights): here it hashes each
    loaded tensor, so the parent can compare them with its own parameters."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            self.digests[name] = _digest(tensor)


def _load_in_child(wire: list[bytes], out: Any) -> None:
    """The spawned side of the IPC check: each bucket's arguments decoded from msgpack as vLLM's
    engine core decodes them, then loaded by the worker extension's own rl_load_bucket."""
    import msgpack  # type: ignore[import-untyped,unused-ignore]

    from rl.engines.vllm_cuda import VLLMWorkerExtension

    class Runner:
        model = _LoadedModel()

    worker = VLLMWorkerExtension()
    worker.model_runner = Runner()
    loaded = 0
    for packed in wire:
        handle, layout = msgpack.unpackb(packed)
        loaded += worker.rl_load_bucket(handle, layout)
    out.put((loaded, Runner.model.digests))


def ipc_round_trip(model: Any, device: torch.device, bucket_bytes: int) -> None:
    """The push's buckets shared with a spawned process (CUDA IPC on a GPU, shared memory on
    the CPU) through vLLM's msgpack boundary, loaded there by VLLMWorkerExtension.rl_load_bucket:
    every tensor's bytes equal to the parameter's, and the memory back to where it was."""
    import msgpack

    from rl.engines.vllm_cuda import bucketed, layout_wire, release_ipc, share
    from rl.engines.vllm_sync import checkpoint_name

    sync(device)
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    start = time.monotonic()
    held = list(bucketed(model.named_parameters(), bucket_bytes, dtype=torch.bfloat16))
    wire = [msgpack.packb([share(b), layout_wire(bucket)]) for bucket, b in held]
    expected = {
        checkpoint_name(n): _digest(p.detach().to(torch.bfloat16))
        for n, p in model.named_parameters()
    }
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_load_in_child, args=(wire, queue))
    child.start()
    loaded, got = queue.get(timeout=240)
    child.join(60)
    took = time.monotonic() - start
    size = sum(b.numel() * b.element_size() for _, b in held)
    count = len(held)
    del held, wire
    release_ipc(device)
    after = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    kind = (
        "CUDA IPC" if device.type == "cuda" else "shared memory (the CPU's stand-in for CUDA IPC)"
    )
    same = got == expected
    check(
        "a",
        same and loaded == len(expected) and child.exitcode == 0,
        f"push buckets by {kind} through msgpack to a spawned process's rl_load_bucket: "
        f"{count} buckets, {loaded} tensors, {size / 2**20:.1f} MiB, bytes equal: {same}, "
        f"{size / 2**30 / took:.2f} GiB/s with the child's start-up",
    )
    if device.type == "cuda":
        check(
            "a",
            after <= baseline,
            f"memory after the buffers are dropped: {after} bytes "
            f"allocated, {baseline} before them",
        )


def tool_call(jail: str) -> None:
    """One program through a private sandbox service (the real jail), when it starts here."""
    if jail == "off":
        say(
            "a",
            "tool calls: not tried (--jail off); nothing stood in: the rollouts above "
            "were one turn each, without tool calls",
        )
        return
    try:
        from rl.run.local_service import LocalService
        from trainer_client.client import SandboxClient

        with (
            tempfile.TemporaryDirectory() as tmp,
            LocalService(Path(tmp) / "sandbox.log", workers=1) as service,
        ):

            async def run() -> Any:
                async with SandboxClient(service.url) as client:
                    return await client.execute("print(6 * 7)")

            result = asyncio.run(run())
        check(
            "a",
            result.stdout.strip() == "42",
            f"tool call through the real jail: status {result.status}, stdout "
            f"{result.stdout.strip()!r}",
        )
    except Exception as exc:  # the jail needs nsjail, Redis and cgroups: say why not
        say(
            "a",
            f"tool calls: the jail could not start here ({type(exc).__name__}: "
            f"{str(exc)[:200]}); nothing stood in: the rollouts above were one turn each, "
            "without tool calls",
        )


TINY_VLLM = Size(256, 4, 4, 688, 4000, 0, 0, 0, 0)
"""Part (b)'s model when none is given: small enough to carry (bf16, a few MiB), with vLLM's
usual head size (64)."""


def write_tiny_model(directory: Path) -> Path:
    """A Qwen2-architecture model directory as vLLM loads one (config.json, safetensors
    weights, tokenizer), random weights from a config: nothing downloaded."""
    tokenizer, model = build(TINY_VLLM, torch.device("cpu"))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def part_b(model_path: str | None, device: torch.device) -> None:
    """The colocated vLLM engine on a small model (the one given, else the bundle's, else one
    written now): sync, sample, log-probs, throughput."""
    try:
        import vllm  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        say("b", "skipped: vllm is not installed (the `vllm` extra, or docs/rl.md's ROCm path)")
        return
    if device.type != "cuda":
        say("b", "skipped: vLLM needs a GPU")
        return
    with tempfile.TemporaryDirectory() as tmp:
        if model_path is None:
            bundled = BUNDLE / "tiny-qwen2"
            if (bundled / "config.json").exists():
                model_path = str(bundled)
            else:
                model_path = str(write_tiny_model(Path(tmp) / "tiny-qwen2"))
        say("b", f"model: {model_path}")
        asyncio.run(_part_b(model_path, device))


async def _part_b(model_path: str, device: torch.device) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.engines.base import SamplingParams
    from rl.engines.vllm_colocated import VLLMEngine
    from rl.logprobs import pad_responses, response_logprobs

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    model = model.to(device)
    engine = VLLMEngine.create(model_path, gpu_memory_utilization=0.4, seed=0)
    try:
        with torch.no_grad():  # a sync that does nothing is caught: vLLM still has the file's
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        await engine.release_memory()
        start = time.monotonic()
        await engine.sync_weights(model.named_parameters())
        say("b", f"weight sync: {time.monotonic() - start:.2f} s")
        prompts = [tokenizer.encode(f"What is {a} times {a + 7}? Answer:") for a in range(32)]
        params = SamplingParams(max_new_tokens=128, temperature=0.7)
        start = time.monotonic()
        gens = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        took = time.monotonic() - start
        tokens = sum(len(g.token_ids) for g in gens)
        say("b", f"vLLM generation: {tokens} tokens in {took:.2f} s = {tokens / took:.0f} tokens/s")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        batch = pad_responses(
            prompts,
            [g.token_ids for g in gens],
            [[1] * len(g.token_ids) for g in gens],
            pad_id=pad,
            device=device,
        )
        with torch.no_grad():
            mine = response_logprobs(model, batch, temperature=0.7).float()
        theirs = torch.zeros_like(mine)
        for i, g in enumerate(gens):
            assert g.logprobs is not None, "vLLM returned no log-probs"
            theirs[i, : len(g.logprobs)] = torch.tensor(g.logprobs, device=device)
        mask = batch.loss_mask.float()
        diff = float(((mine - theirs).abs() * mask).sum() / mask.sum())
        check(
            "b",
            diff < 0.02,
            f"mean |log p_trainer - log p_vllm| after a sync: {diff:.4f} nats (fails at 0.02)",
        )
    finally:
        await engine.aclose()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--device",
        default=None,
        help="cuda (default when torch sees a GPU) or cpu (a dry run of part a)",
    )
    parser.add_argument(
        "--vllm-model",
        default=None,
        help="a local transformers model directory for part (b) (vLLM only); default: the "
        "bundle's tiny Qwen2, else one written from a config",
    )
    parser.add_argument(
        "--bundle",
        action="store_true",
        help="write .gpu-bundle/ (make gpu-bundle) and print the command to send; no check",
    )
    parser.add_argument(
        "--jail",
        choices=("auto", "off"),
        default="auto",
        help="auto: try one tool call through a private sandbox service",
    )
    return parser.parse_args(argv)


NEEDED = ("transformers", "tokenizers", "numpy", "msgpack")
"""What the check imports beyond torch and the standard library: the model and tokenizer, the
IPC check's digests, vLLM's msgpack boundary. Nothing else may be on its import path
(tests/rl/test_rl_gpu_check.py runs it on a Python with only these and torch)."""


BUNDLE = ROOT / ".gpu-bundle"
"""What `make gpu-bundle` prepares for a GPU host without a package registry: part (b)'s tiny
model directory and a manifest (the commit it was made at, its size). Found here by itself."""
BUNDLE_LIMIT = 64 << 20
SEND = "python3 scripts/gpu_check.py"
"""The one command to send to a lent GPU host, from the repository root, with .gpu-bundle
carried."""


def make_bundle() -> int:
    """Write .gpu-bundle/ afresh, print its size and the command to send; 1 if over the limit."""
    import json
    import shutil
    import subprocess

    shutil.rmtree(BUNDLE, ignore_errors=True)
    write_tiny_model(BUNDLE / "tiny-qwen2")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    files = sorted(p for p in BUNDLE.rglob("*") if p.is_file())
    manifest = {
        "commit": commit,
        "bytes": sum(p.stat().st_size for p in files),
        "files": {str(p.relative_to(BUNDLE)): p.stat().st_size for p in files},
        "command": SEND,
    }
    (BUNDLE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    shown = BUNDLE.relative_to(ROOT) if BUNDLE.is_relative_to(ROOT) else BUNDLE
    print(
        f"{shown}/: {len(files) + 1} files, {size / 2**20:.2f} MiB "
        f"(limit {BUNDLE_LIMIT >> 20} MiB), at commit {commit[:12]}"
    )
    print(f"send, from the repository root, with .gpu-bundle carried:\n  {SEND}")
    return 0 if size <= BUNDLE_LIMIT else 1


def describe_bundle() -> None:
    import json

    manifest = BUNDLE / "manifest.json"
    if not manifest.exists():
        say("env", "no .gpu-bundle here (make gpu-bundle): part (b) writes its own tiny model")
        return
    made = json.loads(manifest.read_text())
    say("env", f".gpu-bundle: {made['bytes'] / 2**20:.2f} MiB, made at {made['commit'][:12]}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.bundle:
        return make_bundle()
    import importlib.util

    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"part (a) needs {', '.join(missing)} beside torch: install or carry them",
            file=sys.stderr,
        )
        return 2
    if args.device is None:
        if not torch.cuda.is_available():
            print("no GPU visible to torch: pass --device cpu for the dry run", file=sys.stderr)
            return 2
        args.device = "cuda"
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
        device = torch.device("cuda", torch.cuda.current_device())
        say(
            "env",
            f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}",
        )
    else:
        torch.set_num_threads(min(torch.get_num_threads(), 2))
        say("env", f"CPU dry run, torch {torch.__version__}")
    import transformers

    say("env", f"transformers {transformers.__version__}, Python {sys.version.split()[0]}")
    describe_bundle()
    from rl.versions import check_torch

    check_torch()
    start = time.monotonic()
    part_a(device, GPU_SIZE if device.type == "cuda" else CPU_SIZE, args.jail)
    part_b(args.vllm_model, device)
    say("end", f"{time.monotonic() - start:.1f} s; {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
