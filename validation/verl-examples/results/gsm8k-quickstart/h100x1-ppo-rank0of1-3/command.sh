#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=0/1 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/gpus-0/runs/quickstart-rank-test/gsm8k-quickstart/h100x1-ppo-rank0of1 --config-name verl_config
