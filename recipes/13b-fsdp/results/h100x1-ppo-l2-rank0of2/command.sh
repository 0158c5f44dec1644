#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=0/2 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/ctl/runs/13b-fsdp/h100x1-ppo-l2-rank0of2 --config-name verl_config
