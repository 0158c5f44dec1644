#!/usr/bin/env bash
# Drive a GPU host that has no internet, from a checkout that travels to it in pieces.
# This is how every GPU number in this repository was measured (see gpu/README.md).
#
#   gpu/offline-host.sh stage CHUNK_DIR     add the wheelhouse chunks present in CHUNK_DIR to the staging dir
#   gpu/offline-host.sh install             verify and install the staged wheelhouse into $SITE
#   gpu/offline-host.sh start PLAN          start gpu/campaign.sh PLAN in the background (survives this shell)
#   gpu/offline-host.sh wait SECONDS [OUT]  wait for the campaign (at most SECONDS), print its status, and
#                                           pack its results into OUT/results.tgz
#
# Environment: STAGE (default /tmp/wh-stage), SITE (default /tmp/site), CAMPAIGN (default /tmp/campaign).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
STAGE=${STAGE:-/tmp/wh-stage}
SITE=${SITE:-/tmp/site}
CAMPAIGN=${CAMPAIGN:-/tmp/campaign}

# The checkout's own code wins over the wheel of this project, so a fix travels with the tree.
export PYTHONPATH="$root/common:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
export VERL_RECIPES_ROOT="$root"
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

cmd=${1:?usage: gpu/offline-host.sh stage|install|start|wait ...}
shift
case "$cmd" in
  stage)
    chunks=${1:?usage: gpu/offline-host.sh stage CHUNK_DIR}
    bash "$chunks/install.sh" --stage "$chunks" --into "$STAGE"
    ;;
  install)
    bash "$STAGE/install.sh" --install "$STAGE" --target "$SITE"
    python3 -m verl_recipes.cli --version
    ;;
  start)
    plan=${1:?usage: gpu/offline-host.sh start PLAN}
    mkdir -p "$CAMPAIGN"
    setsid nohup bash "$here/campaign.sh" "$plan" "$CAMPAIGN" >"$CAMPAIGN/campaign.log" 2>&1 </dev/null &
    echo "campaign started: $CAMPAIGN/campaign.log"
    ;;
  wait)
    limit=${1:?usage: gpu/offline-host.sh wait SECONDS [OUT]}
    out=${2:-${OUT:-/tmp/out}}
    deadline=$(( $(date +%s) + limit ))
    while [[ ! -e "$CAMPAIGN/DONE" && $(date +%s) -lt $deadline ]]; do sleep 5; done
    mkdir -p "$out"
    tar -czf "$out/results.tgz" -C "$CAMPAIGN" --exclude='checkpoints' --exclude='*.safetensors' . || true
    echo "--- status"; cat "$CAMPAIGN/status.tsv" 2>/dev/null || true
    echo "--- campaign.log (tail)"; tail -n 40 "$CAMPAIGN/campaign.log" 2>/dev/null || true
    # shellcheck disable=SC2012  # newest run folder; names are ours
    latest=$(ls -td "$CAMPAIGN"/runs/*/ 2>/dev/null | head -n 1 || true)
    if [[ -n "$latest" ]]; then echo "--- $latest/train.log (tail)"; tail -n 60 "$latest/train.log" 2>/dev/null || true; fi
    [[ -e "$CAMPAIGN/DONE" ]] && echo "CAMPAIGN DONE" || echo "CAMPAIGN RUNNING"
    ;;
  *)
    echo "gpu/offline-host.sh: unknown command $cmd (stage, install, start, wait)" >&2
    exit 2
    ;;
esac
