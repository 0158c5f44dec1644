#!/usr/bin/env bash
# The Slurm pre-submit check on a GPU node, with no GPU named: it asks NVML what the node's GPU is
# and the planner whether 13b-fsdp on that one GPU fits it (on an H100 80GB it does not: one line,
# exit 2, naming the knobs that fit; on an H200 it fits, "check ok ... plan: fits h200-141g (NVML:
# ...)"). The check's line and exit status go to RUN_DIR/check.txt; the probe fails only when the
# check crashes (an exit other than 0 or 2) or names no NVML GPU.
#
# usage: bash gpu/probes/slurm-fits.sh RUN_DIR
set -euo pipefail
run=${1:?usage: gpu/probes/slurm-fits.sh RUN_DIR}
mkdir -p "$run/model"
echo '{}' > "$run/model/config.json"
rc=0
env DRY_RUN=1 SLURM_JOB_NODELIST="$(hostname -s)" SLURM_JOB_ID=1 SLURM_GPUS_ON_NODE=1 \
  RECIPE=13b-fsdp TP=1 PP=1 MODEL_PATH="$run/model" JOB_DIR="$run/job" \
  TRAIN_CMD='verl-recipes train 13b-fsdp --gpus 1' \
  verl-recipes ray-slurm check --runtime bare > "$run/check.txt" 2>&1 || rc=$?
echo "exit $rc" >> "$run/check.txt"
cat "$run/check.txt"
[[ $rc == 0 || $rc == 2 ]] && grep -q "(NVML: " "$run/check.txt"
