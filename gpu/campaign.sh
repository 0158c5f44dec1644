#!/usr/bin/env bash
# Run a list of recipe runs one after another on a GPU host, each under a time limit, and keep
# going past failures so one bad configuration does not cost the others' GPU time.
#
# usage: gpu/campaign.sh CAMPAIGN OUT_DIR
#   CAMPAIGN: lines of `name|timeout_s|requires|what` (gpu/campaigns/*.txt); `#` starts a comment.
#     name:     a `train` line's is `<recipe>/<run name>` (recipes/README.md's rule): its run folder
#               OUT_DIR/runs/<recipe>/<run name> is the one committed under recipes/<recipe>/results/.
#     what:     `verl-recipes train` arguments (`7b-lora --variant grpo --steps 3`), or
#               `pytest ARGS` to run GPU-marked tests whose runs are kept under OUT_DIR/runs/NAME/, or
#               `bash SCRIPT ARGS` to run `bash SCRIPT OUT_DIR/runs/NAME ARGS` (e.g. run-both.sh).
#     requires: `-`; NAME (an earlier run must have passed); `!NAME` (it must have failed: the next
#               step of a bisection).
#   OUT_DIR/status.tsv gets one line per run: name, exit code, seconds, run folder.
#   A `train` line's run name begins with the card it is written for (`h200x1-...`); on a host of
#   another card (CAMPAIGN_CARD, else this host's GPU family from NVML: `h100`) the run folder takes
#   this host's card in its name, said in the log, so no folder names a card it did not run on.
# Several campaigns may share a host, one per GPU set (CUDA_VISIBLE_DEVICES from the caller): after
# each run only that run's own processes are ended (`verl-recipes reap`), never another campaign's.
set -euo pipefail

campaign=${1:?usage: gpu/campaign.sh CAMPAIGN OUT_DIR}
out=${2:?usage: gpu/campaign.sh CAMPAIGN OUT_DIR}
mkdir -p "$out/runs"
# DONE holds the campaign's exit code, written however it ends (its own checks included), so
# `gpu/offline-host.sh wait` stops at once for a campaign that ended early and says how it ended.
trap 'echo "$?" >"$out/DONE"' EXIT
[[ -f "$campaign" ]] || { echo "campaign: no campaign file $campaign" >&2; exit 2; }
command -v verl-recipes >/dev/null || { echo "campaign: verl-recipes is not on PATH; install the wheelhouse first" >&2; exit 2; }
status="$out/status.tsv"
touch "$status"
card=${CAMPAIGN_CARD:-$(python3 -c 'from verl_recipes.job import local_gpus; print(local_gpus()[2])' 2>/dev/null || true)}

# exit code of an earlier run in this campaign ("" if it has not run)
rc_of() { awk -F'\t' -v n="$1" '$1 == n { rc = $2 } END { print rc }' "$status"; }

echo "== campaign on CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all}: $campaign"
while IFS='|' read -r name limit requires what; do
  [[ -z "${name// }" || "$name" == \#* ]] && continue
  if [[ "$requires" == !* ]]; then
    prev=$(rc_of "${requires#!}")
    if [[ -z "$prev" || "$prev" == 0 ]]; then
      printf '%s\t%s\t%s\t%s\n' "$name" skipped 0 "runs only if ${requires#!} failed" >>"$status"
      continue
    fi
  elif [[ "$requires" != "-" && "$(rc_of "$requires")" != 0 ]]; then
    printf '%s\t%s\t%s\t%s\n' "$name" skipped 0 "needs $requires" >>"$status"
    continue
  fi
  run="$out/runs/$name"
  echo "== campaign: $name (limit ${limit}s): $what"
  start=$(date +%s)
  rc=0
  if [[ "$what" == pytest\ * ]]; then
    mkdir -p "$run"
    # shellcheck disable=SC2086  # the campaign line's arguments are split on purpose
    VERL_RECIPES_GPU_RUNS_DIR="$run" timeout --kill-after=30 "$limit" \
      python3 -m pytest -m gpu -p no:cacheprovider ${what#pytest } >"$run/pytest.log" 2>&1 || rc=$?
    verl-recipes reap --under "$run" || true
  elif [[ "$what" == bash\ * ]]; then
    read -r -a words <<<"${what#bash }"
    mkdir -p "$run"
    timeout --kill-after=30 "$limit" bash "${words[0]}" "$run" "${words[@]:1}" >"$run/script.log" 2>&1 || rc=$?
    verl-recipes reap --under "$run" || true
  else
    leaf=${name##*/}
    if [[ -n "$card" && "$leaf" =~ ^([a-z0-9]+)(x[0-9]+-.*)$ && "${BASH_REMATCH[1]}" != "$card" ]]; then
      run="$out/runs/${name%"$leaf"}$card${BASH_REMATCH[2]}"
      echo "== campaign: $name is named for a ${BASH_REMATCH[1]}; this host's card is a $card: its run folder is $run"
    fi
    # shellcheck disable=SC2086
    timeout --kill-after=30 "$limit" verl-recipes train $what --run-dir "$run" --quiet || rc=$?
    [[ -d "$run" ]] && { verl-recipes reap "$run" || true; }
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$run" >>"$status"
done <"$campaign"
echo "== campaign done"
