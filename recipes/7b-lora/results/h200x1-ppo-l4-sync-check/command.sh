#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl.trainer.main_ppo --config-path /tmp/campaign/speed/runs/sync-check/7b-lora-L4-sync-probe --config-name verl_config
