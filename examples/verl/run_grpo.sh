#!/usr/bin/env bash
# GRPO with verl, rl-sandbox for the tool calls and the reward. The model, data and GPU flags are
# verl's usual ones (verl's examples/grpo_trainer); the lines that concern rl-sandbox are marked.
# Checked by tests/integrations/test_verl_service.py: the files it names exist and every
# rl-sandbox override names a key of verl's own trainer config.
set -euo pipefail
export RL_SANDBOX_URL=${RL_SANDBOX_URL:-http://127.0.0.1:8000}   # rl-sandbox
HERE=$(cd "$(dirname "$0")" && pwd)

python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$HOME/data/dapo/train.parquet" \
  data.val_files="$HOME/data/aime/test.parquet" \
  actor_rollout_ref.model.path=Qwen/Qwen3-4B \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.multi_turn.enable=true \
  actor_rollout_ref.rollout.multi_turn.format=hermes \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=8 \
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$HERE/session_tool_config.yaml" \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop_config.yaml" \
  actor_rollout_ref.rollout.agent.default_agent_loop=rl_sandbox_tool_agent \
  reward.custom_reward_function.path=pkg://trainer_client.integrations.reward \
  reward.custom_reward_function.name=compute_score \
  +reward.custom_reward_function.reward_kwargs.sandbox_url="$RL_SANDBOX_URL" \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  "$@"
