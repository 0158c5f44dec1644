#!/usr/bin/env bash
# Launch recipe verl-vs-deepspeed: the verl side of the verl-vs-DeepSpeed comparison (the DeepSpeed side: compare.py ds).
# Bare metal: pip install -e '.[gpu]' from a checkout first; in the image verl-recipes is installed.
# Options are `verl-recipes train`'s: --model DIR, --data DIR, --variant V, --steps N, --cap-gib G,
# --set key=value (checked against verl's schema). MODEL_PATH and DATA_DIR work like --model/--data.
# Without a GPU it rehearses everything a CPU can check and says that training needs a GPU.
set -euo pipefail
command -v verl-recipes >/dev/null || { echo "launch.sh: verl-recipes is not installed: pip install -e '.[gpu]' in a checkout, or use the image" >&2; exit 2; }
exec verl-recipes train verl-vs-deepspeed "$@"
