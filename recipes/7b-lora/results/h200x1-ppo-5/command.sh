#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/rollout/runs/ppo --config-name verl_config
