#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=0/8 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/gpus-0/runs/grpo-qwen2-7b-seq-balance/h100x1-grpo-rank0of8 --config-name verl_config
