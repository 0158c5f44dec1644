#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=0/1 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/rank-followups-2/runs/13b-h200x1-ppo-fixedlen-rank0of1 --config-name verl_config
