#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl.trainer.main_ppo --config-path /tmp/campaign/24gib/runs/cap22.5-grpo --config-name verl_config
