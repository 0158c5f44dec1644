#!/usr/bin/env bash
set -euo pipefail
/opt/torch/.venv/bin/python3 -m verl_recipes.worker.driver --config-path /tmp/campaign/l3/runs/70b-l2-test/70b-tp1-l2 --config-name verl_config
