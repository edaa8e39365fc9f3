#!/usr/bin/env bash
# GPU check of the colocated vLLM engine: a short GRPO-RoC run of a small real model (e.g.
# Qwen2.5-0.5B-Instruct) with weight sync, then vLLM's log-probs against the trainer's after a
# sync, and throughput. Needs a GPU, the `rl` and `vllm` extras, and a local model directory:
#   scripts/gpu_check.sh /models/Qwen2.5-0.5B-Instruct      (or MODEL_PATH=... scripts/gpu_check.sh)
# Writes runs/gpu-check/; exits non-zero when the log-probs disagree (mean |diff| > 0.02 nats).
set -euo pipefail
MODEL_PATH="${1:-${MODEL_PATH:-}}"
if [ -z "$MODEL_PATH" ] || [ ! -d "$MODEL_PATH" ]; then
  echo "usage: $0 MODEL_DIR   (a local transformers model directory, Qwen2.5-0.5B-class)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -c "import torch, sys; sys.exit(0 if torch.accelerator.is_available() else 'no GPU visible to torch')"
"$PY" -c "import vllm; print('vllm', vllm.__version__)"
"$PY" - "$MODEL_PATH" <<'PY'
import asyncio, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from rl.engines.base import SamplingParams
from rl.engines.vllm_colocated import VLLMEngine
from rl.logprobs import pad_responses, response_logprobs

path = sys.argv[1]
device = torch.accelerator.current_accelerator()
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device)
engine = VLLMEngine.create(path, gpu_memory_utilization=0.4, seed=0)

async def main() -> None:
    # Perturb the trainer's weights so that a sync that does nothing is caught.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    await engine.release_memory()
    await engine.sync_weights(model.named_parameters())
    prompts = [tok.encode(f"What is {a} times {a + 7}? Answer:") for a in range(32)]
    params = SamplingParams(max_new_tokens=128, temperature=0.7)
    t0 = time.monotonic()
    gens = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    dt = time.monotonic() - t0
    tokens = sum(len(g.token_ids) for g in gens)
    print(f"vLLM generation: {tokens} tokens in {dt:.2f} s = {tokens / dt:.0f} tokens/s")
    batch = pad_responses(prompts, [g.token_ids for g in gens],
                          [[1] * len(g.token_ids) for g in gens], pad_id=tok.pad_token_id or 0,
                          device=device)
    with torch.no_grad():
        mine = response_logprobs(model, batch, temperature=0.7)
    theirs = torch.zeros_like(mine)
    for i, g in enumerate(gens):
        theirs[i, : len(g.logprobs)] = torch.tensor(g.logprobs, device=device)
    diff = float(((mine - theirs).abs() * batch.loss_mask).sum() / batch.loss_mask.sum())
    print(f"mean |log p_trainer - log p_vllm| after a sync: {diff:.4f} nats")
    await engine.aclose()
    sys.exit(0 if diff < 0.02 else 1)

asyncio.run(main())
PY
# The end-to-end run: SFT then GRPO-RoC on the colocated engine, a handful of steps.
mkdir -p runs/gpu-check
cat > runs/gpu-check/config.toml <<TOML
name = "gpu-check"
amp_dtype = "bfloat16"
[model]
source = "pretrained"
path = "$MODEL_PATH"
[task]
num_problems = 64
[grpo]
group_size = 4
oversample = 2
prompts_per_step = 8
max_response_tokens = 1024
max_turns = 4
warmup_steps = 1
[[rollout.engines]]
kind = "vllm"
capacity_tokens = 0
gpu_memory_utilization = 0.35
[[stages]]
name = "sft"
kind = "sft"
steps = 4
batch_size = 8
[[stages]]
name = "grpo"
steps = 3
TOML
start=$(date +%s)
"$PY" -m sandbox_service.cli train --config runs/gpu-check/config.toml
echo "end-to-end: $(( $(date +%s) - start )) s; per-step times in runs/gpu-check/metrics.jsonl"
