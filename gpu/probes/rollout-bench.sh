#!/usr/bin/env bash
# One `verl-recipes rollout-bench` record into a campaign's run folder, with whatever arguments the
# campaign line gives (a vLLM engine setting through --set, e.g. another attention backend).
#
# usage: bash gpu/probes/rollout-bench.sh RUN_DIR RECIPE [rollout-bench arguments...]
set -euo pipefail
run=${1:?usage: gpu/probes/rollout-bench.sh RUN_DIR RECIPE [ARGS...]}
shift
mkdir -p "$run"
# three timed calls unless the arguments name their own --calls (the last one given counts)
verl-recipes rollout-bench --calls 3 "$@" --out "$run/rollout-bench.json"
