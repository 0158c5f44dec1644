#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl.trainer.main_ppo --config-path /tmp/campaign/runs/q05-ppo --config-name verl_config
