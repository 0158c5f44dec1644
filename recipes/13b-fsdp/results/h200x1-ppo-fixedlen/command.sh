#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/rank-followups-2/runs/13b-h200x1-ppo-fixedlen --config-name verl_config
