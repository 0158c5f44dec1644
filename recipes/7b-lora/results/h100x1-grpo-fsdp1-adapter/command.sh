#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/gpus-0/runs/7b-lora/h100x1-grpo-fsdp1-adapter --config-name verl_config
