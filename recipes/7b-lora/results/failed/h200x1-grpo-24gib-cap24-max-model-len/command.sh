#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl.trainer.main_ppo --config-path /tmp/campaign/lane-0/runs/cap24-grpo --config-name verl_config
