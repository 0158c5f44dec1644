#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl.trainer.main_ppo --config-path /tmp/campaign/lane-1/runs/ds-vs-verl-1gpu/verl --config-name verl_config
