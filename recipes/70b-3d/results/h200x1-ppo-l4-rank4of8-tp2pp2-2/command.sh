#!/usr/bin/env bash
set -euo pipefail
VERL_RECIPES_RANK_REHEARSAL=4/8 /opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/host2/runs/megatron-rank-test/70b-tp2pp2-rank4of8-l4 --config-name verl_config
