#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=0/2 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/gpus-0/runs/grpo-qwen2-5-3b-gsm8k-grpo-lora/h100x1-grpo-rank0of2 --config-name verl_config
