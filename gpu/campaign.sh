#!/usr/bin/env bash
# Run a list of recipe runs one after another on a GPU host, each under a time limit, and keep
# going past failures so one bad configuration does not cost the others' GPU time.
#
# usage: gpu/campaign.sh PLAN OUT_DIR
#   PLAN: lines of `name|timeout_s|requires|verl-recipes train arguments...`; `requires` is
#         `-` or the name of an earlier run that must have passed; `#` starts a comment.
#   OUT_DIR/status.tsv gets one line per run: name, exit code, seconds, run folder.
# Every run folder keeps its own log, config, provenance and measurements (verl-recipes train).
set -euo pipefail

plan=${1:?usage: gpu/campaign.sh PLAN OUT_DIR}
out=${2:?usage: gpu/campaign.sh PLAN OUT_DIR}
[[ -f "$plan" ]] || { echo "campaign: no plan file $plan" >&2; exit 2; }
command -v verl-recipes >/dev/null || { echo "campaign: verl-recipes is not on PATH; install the wheelhouse first" >&2; exit 2; }
mkdir -p "$out/runs"
status="$out/status.tsv"
touch "$status"

passed() { awk -F'\t' -v n="$1" '$1 == n && $2 == 0 { found = 1 } END { exit !found }' "$status"; }

while IFS='|' read -r name limit requires args; do
  [[ -z "${name// }" || "$name" == \#* ]] && continue
  if [[ "$requires" != "-" ]] && ! passed "$requires"; then
    printf '%s\t%s\t%s\t%s\n' "$name" skipped 0 "needs $requires" >>"$status"
    continue
  fi
  echo "== campaign: $name (limit ${limit}s): verl-recipes train $args"
  start=$(date +%s)
  rc=0
  # shellcheck disable=SC2086  # the plan's arguments are split on purpose
  timeout --kill-after=30 "$limit" verl-recipes train $args --run-dir "$out/runs/$name" --quiet || rc=$?
  # A timed-out run leaves Ray and vLLM behind; the next run needs the GPU back.
  ray stop --force >/dev/null 2>&1 || true
  pkill -9 -f 'VLLM::EngineCore|vllm.entrypoints|ray::' >/dev/null 2>&1 || true
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$out/runs/$name" >>"$status"
done <"$plan"
echo "== campaign done"
touch "$out/DONE"
