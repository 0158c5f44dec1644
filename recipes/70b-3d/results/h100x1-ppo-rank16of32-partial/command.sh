#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=16/32 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/gpus-0/runs/70b-rank16of32-fixed --config-name verl_config
