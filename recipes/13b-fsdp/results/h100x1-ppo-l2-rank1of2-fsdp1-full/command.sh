#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=1/2 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/gpus-0/runs/13b-fsdp/h100x1-ppo-l2-rank1of2-fsdp1-full --config-name verl_config
