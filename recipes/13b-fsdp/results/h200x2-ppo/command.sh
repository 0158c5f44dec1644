#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/13b-rank-x2/runs/13b-x2-ppo --config-name verl_config
