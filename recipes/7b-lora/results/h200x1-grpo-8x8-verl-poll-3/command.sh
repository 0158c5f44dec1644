#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/rollout/runs/grpo-8x8-verl-poll --config-name verl_config
