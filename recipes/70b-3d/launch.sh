#!/usr/bin/env bash
# Launch recipe 70b-3d: Llama-2-70B PPO on Megatron, TP4 x PP2 x DP4. Multi-node runs go through slurm/*.sbatch.
# Bare metal: pip install -e '.[gpu]' from a checkout first; in the image verl-recipes is installed.
# Options are `verl-recipes train`'s: --model DIR, --data DIR, --variant V, --steps N, --cap-gib G,
# --set key=value (checked against verl's schema). MODEL_PATH and DATA_DIR work like --model/--data.
# Without a GPU it rehearses everything a CPU can check and says that training needs a GPU.
set -euo pipefail
command -v verl-recipes >/dev/null || { echo "launch.sh: verl-recipes is not installed: pip install -e '.[gpu]' in a checkout, or use the image" >&2; exit 2; }
exec verl-recipes train 70b-3d "$@"
