#!/usr/bin/env bash
# A peer's run of 7b-lora's GRPO workload, as a campaign line: `bash gpu/peers.sh PEER BATCH ROW`
# (gpu/campaign.sh puts the line's run folder first). The run goes to RUN_DIR/PEER: campaign.sh
# writes its script.log into RUN_DIR itself, and a peer's run folder starts empty.
#
# usage: gpu/peers.sh RUN_DIR PEER [BATCH [ROW]]
#   PEER   trl or openrlhf, installed beforehand from its own wheelhouse into /tmp/site-PEER
#          (or VERL_RECIPES_PEER_SITE): gpu/README.md, "The peers"
#   BATCH  the workload's batch: 8x8 (default) or prod
#   ROW    docs (default: the peer's documentation for one GPU), tuned, full (OpenRLHF)
set -euo pipefail

run=${1:?usage: gpu/peers.sh RUN_DIR PEER [BATCH [ROW]]}
peer=${2:?usage: gpu/peers.sh RUN_DIR PEER [BATCH [ROW]]}
batch=${3:-8x8}
row=${4:-docs}
command -v verl-recipes >/dev/null || { echo "peers.sh: verl-recipes is not installed (gpu/offline-host.sh install)" >&2; exit 2; }
exec verl-recipes peers run "$peer" --run-dir "$run/$peer" --batch "$batch" --row "$row"
