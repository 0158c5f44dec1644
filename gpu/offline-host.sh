#!/usr/bin/env bash
# Drive a GPU host that has no internet, from a checkout that travels to it in pieces.
# Every GPU number in this repository is measured this way (gpu/README.md).
#
#   gpu/offline-host.sh stage CHUNK_DIR     add the wheelhouse chunks present in CHUNK_DIR to the staging dir
#   gpu/offline-host.sh pieces CHUNK_DIR OUT SIZE
#                                           (where the wheelhouse is built) cut its chunks again into pieces
#                                           of SIZE (split's units: 47M), for transfers that hold less than
#                                           a chunk beside the tree; OUT (new) gets piece-NNN, PIECES (their
#                                           sha256), install.sh and manifest.json
#   gpu/offline-host.sh gather PIECE_DIR    keep the pieces present in PIECE_DIR (carried with PIECES);
#                                           once all are here with install.sh and manifest.json, rebuild
#                                           the chunks and stage them as `stage` does
#   gpu/offline-host.sh install             verify and install the staged wheelhouse into $SITE
#   gpu/offline-host.sh start CAMPAIGN [GPUS [NAME]]
#                                           start gpu/campaign.sh CAMPAIGN in the background (survives
#                                           this shell); with GPUS (e.g. 0 or 0,1) it runs on those GPUs only,
#                                           in $CAMPAIGN_DIR/gpus-GPUS (or $CAMPAIGN_DIR/NAME), so one campaign
#                                           per GPU set, or two small ones on one GPU, run at once;
#                                           VERL_RECIPES_GIT_COMMIT (the carried tree's commit) is required
#   gpu/offline-host.sh exec CMD [ARGS...]  run CMD in the same environment (e.g. the GPU-marked tests)
#   gpu/offline-host.sh wait SECONDS [OUT]  wait for every campaign (at most SECONDS), print their status,
#                                           and pack the results into OUT/results.tgz
#
# Environment: STAGE (default /tmp/wh-stage), SITE (default /tmp/site), CAMPAIGN_DIR (default /tmp/campaign),
# PYCACHE (default $SITE-pycache), HOST_SITE (default: the host interpreter's own site-packages).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
STAGE=${STAGE:-/tmp/wh-stage}
SITE=${SITE:-/tmp/site}
CAMPAIGN_DIR=${CAMPAIGN_DIR:-/tmp/campaign}
PYCACHE=${PYCACHE:-$SITE-pycache}
# where `install` wrote the bytecode of a host that never writes it (see install): every process
# started from here reads it
if [[ -d "$PYCACHE" ]]; then export PYTHONPYCACHEPREFIX="$PYCACHE"; fi

# The checkout's own code wins over the wheel of this project, so a fix travels with the tree.
export PYTHONPATH="$root/common:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
export VERL_RECIPES_ROOT="$root"
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# NVLink multicast stays off on shared multi-GPU hosts (NCCL, torch symmetric memory, NVSHMEM).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
# Some VMs grow MemTotal as memory is used; Ray's OOM killer would read that as pressure and kill
# workers of a healthy run. The kernel's limit still applies.
export RAY_memory_monitor_refresh_ms=${RAY_memory_monitor_refresh_ms:-0}

cmd=${1:?usage: gpu/offline-host.sh stage|install|start|wait ...}
shift
case "$cmd" in
  stage)
    chunks=${1:?usage: gpu/offline-host.sh stage CHUNK_DIR}
    bash "$chunks/install.sh" --stage "$chunks" --into "$STAGE"
    ;;
  pieces)
    src=${1:?usage: gpu/offline-host.sh pieces CHUNK_DIR OUT SIZE}
    out=${2:?usage: gpu/offline-host.sh pieces CHUNK_DIR OUT SIZE}
    size=${3:?usage: gpu/offline-host.sh pieces CHUNK_DIR OUT SIZE (e.g. 47M)}
    [[ -f "$src/manifest.json" && -f "$src/install.sh" ]] || { echo "pieces: $src has no manifest.json and install.sh: not a wheelhouse" >&2; exit 2; }
    [[ ! -e "$out" ]] || { echo "pieces: $out exists; name a new folder" >&2; exit 2; }
    [[ "$size" =~ ^[1-9][0-9]*[KMG]?$ ]] || { echo "pieces: size $size: give bytes or K, M, G (47M)" >&2; exit 2; }
    mapfile -t files < <(python3 -c 'import json, sys; [print(c["file"]) for c in json.load(open(sys.argv[1]))["chunks"]]' "$src/manifest.json")
    for f in "${files[@]}"; do [[ -f "$src/$f" ]] || { echo "pieces: $src/$f is missing" >&2; exit 2; }; done
    mkdir -p "$out"
    (cd "$src" && cat "${files[@]}") | split -b "$size" -d -a 3 - "$out/piece-"
    (cd "$out" && sha256sum piece-* >PIECES)
    cp "$src/install.sh" "$src/manifest.json" "$out/"
    echo "$(wc -l <"$out/PIECES") pieces of at most $size in $out: carry each with PIECES (install.sh and manifest.json once), then gpu/offline-host.sh gather on each arrival"
    ;;
  gather)
    src=${1:?usage: gpu/offline-host.sh gather PIECE_DIR}
    keep="$STAGE-pieces"
    [[ -f "$src/PIECES" ]] || { echo "gather: no PIECES in $src; carry it with every piece" >&2; exit 2; }
    mkdir -p "$keep"
    if [[ -f "$keep/PIECES" ]] && ! cmp -s "$src/PIECES" "$keep/PIECES"; then
      echo "gather: $src/PIECES lists other pieces than the ones gathered in $keep; remove $keep to start over" >&2
      exit 2
    fi
    cp "$src/PIECES" "$keep/PIECES"
    for f in "$src"/piece-*; do
      [[ -e "$f" ]] || continue
      name=$(basename "$f")
      want=$(awk -v n="$name" '$2 == n {print $1}' "$keep/PIECES")
      [[ -n "$want" ]] || { echo "gather: $name is not in PIECES" >&2; exit 2; }
      [[ "$(sha256sum "$f" | cut -d' ' -f1)" == "$want" ]] || { echo "gather: $f is corrupt (sha256 mismatch); carry it again" >&2; exit 2; }
      cp "$f" "$keep/$name"
    done
    for f in install.sh manifest.json; do [[ -f "$src/$f" ]] && cp "$src/$f" "$keep/$f"; done
    missing=()
    have=0
    while read -r _ name; do
      if [[ -f "$keep/$name" ]]; then have=$((have + 1)); else missing+=("$name"); fi
    done <"$keep/PIECES"
    [[ -f "$keep/install.sh" ]] || missing+=(install.sh)
    [[ -f "$keep/manifest.json" ]] || missing+=(manifest.json)
    if ((${#missing[@]})); then
      echo "gathered $have of $(wc -l <"$keep/PIECES") pieces in $keep; still missing: ${missing[*]}"
      exit 0
    fi
    # every piece is here: cut the stream back at the manifest's chunk size (every chunk but the
    # last has it) under the chunks' own names; install.sh checks each one's sha256
    read -r csize cprefix < <(python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["chunks"][0]; print(c["size"], c["file"].rsplit("-", 1)[0] + "-")' "$keep/manifest.json")
    rm -rf "$keep/chunks"
    mkdir "$keep/chunks"
    mapfile -t names < <(awk '{print $2}' "$keep/PIECES")
    (cd "$keep" && cat "${names[@]}") | split -b "$csize" -d -a 3 - "$keep/chunks/$cprefix"
    cp "$keep/install.sh" "$keep/manifest.json" "$keep/chunks/"
    bash "$keep/chunks/install.sh" --stage "$keep/chunks" --into "$STAGE"
    rm -rf "$keep"
    ;;
  install)
    [[ -f "$STAGE/install.sh" ]] || { echo "install: no wheelhouse staged in $STAGE; carry the pieces (gather says which are missing) or the chunks (stage) first" >&2; exit 2; }
    bash "$STAGE/install.sh" --install "$STAGE" --target "$SITE"
    # The wheels go in without bytecode (--no-compile), and a host that never writes it
    # (PYTHONDONTWRITEBYTECODE) may ship its own torch without any: then every new process (verl's
    # workers, vLLM's server, engine core and GPU worker) compiles each module it imports from
    # source, at every start. Write it once, for the wheelhouse and the host's own packages, into
    # PYCACHE (the host's folders stay as they are), which every process started from here reads.
    if python3 -c 'import sys; sys.exit(0 if sys.dont_write_bytecode else 1)'; then
      host_site=${HOST_SITE:-$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}
      t0=$(date +%s)
      PYTHONPYCACHEPREFIX="$PYCACHE" python3 -m compileall -q -j 0 "$SITE" "$host_site" >/dev/null 2>&1 || true
      echo "bytecode of $SITE and $host_site written into $PYCACHE in $(( $(date +%s) - t0 )) s (this host sets PYTHONDONTWRITEBYTECODE)"
    fi
    python3 -m verl_recipes.cli --version
    ;;
  start)
    campaign=${1:?usage: gpu/offline-host.sh start CAMPAIGN [GPUS [NAME]]}
    gpus=${2:-}
    dir="$CAMPAIGN_DIR/${3:-gpus-${gpus:-all}}"
    [[ -e "$dir/campaign.log" && ! -e "$dir/DONE" ]] && { echo "$dir is running; give another NAME" >&2; exit 2; }
    # what campaign.sh would refuse in the background is refused here, where the caller sees it
    [[ -f "$campaign" ]] || { echo "start: no campaign file $campaign" >&2; exit 2; }
    command -v verl-recipes >/dev/null || { echo "start: verl-recipes is not on PATH (nothing installed in $SITE); run gpu/offline-host.sh install first" >&2; exit 2; }
    # The tree travels without an up-to-date .git, so `git rev-parse` here names an old commit:
    # every run's provenance.json takes the commit from VERL_RECIPES_GIT_COMMIT, given by the side
    # that carried the tree (its `git rev-parse HEAD`, with -dirty for uncommitted changes).
    commit=${VERL_RECIPES_GIT_COMMIT:-}
    [[ "$commit" =~ ^[0-9a-f]{7,40}(-dirty)?$ ]] || { echo "start: set VERL_RECIPES_GIT_COMMIT to the commit of the tree you carried (\`git rev-parse HEAD\` on your side, -dirty appended for uncommitted changes), not '${commit}': this host's .git names another" >&2; exit 2; }
    export VERL_RECIPES_GIT_COMMIT="$commit"
    mkdir -p "$dir"
    if [[ -n "$gpus" ]]; then export CUDA_VISIBLE_DEVICES="$gpus"; fi
    # A finished campaign of the same NAME goes on in the same folder: its runs, status and log
    # stay, and its DONE goes (else `wait` would answer CAMPAIGN DONE at once for the new one).
    if [[ -e "$dir/DONE" ]]; then
      rm -f "$dir/DONE"
      echo "campaign $(basename "$dir") had ended; its runs and log stay, the new lines follow them"
    fi
    setsid nohup bash "$here/campaign.sh" "$campaign" "$dir" >>"$dir/campaign.log" 2>&1 </dev/null &
    echo "$commit" >"$dir/COMMIT"
    echo "campaign started at commit $commit: $dir/campaign.log"
    ;;
  exec)
    [[ $# -gt 0 ]] || { echo "usage: gpu/offline-host.sh exec CMD [ARGS...]" >&2; exit 2; }
    if [[ -z "${VERL_RECIPES_GIT_COMMIT:-}" ]]; then
      echo "exec: VERL_RECIPES_GIT_COMMIT is not set: a run made here records this host's .git commit, not the carried tree's" >&2
    fi
    exec "$@"
    ;;
  wait)
    limit=${1:?usage: gpu/offline-host.sh wait SECONDS [OUT]}
    out=${2:-${OUT:-/tmp/out}}
    deadline=$(( $(date +%s) + limit ))
    # A lent host can be taken back between two calls; the next call then lands on a bare one with
    # no campaign, where waiting would only spend the limit on nothing.
    if ! compgen -G "$CAMPAIGN_DIR/*/" >/dev/null; then
      echo "gpu/offline-host.sh wait: no campaign under $CAMPAIGN_DIR on this host (a fresh host: was the one that ran it given back?); carry the wheelhouse and start the campaign again" >&2
      exit 2
    fi
    all_done() { local d; for d in "$CAMPAIGN_DIR"/*/; do [[ -e "$d/DONE" ]] || return 1; done; }
    pack() {
      mkdir -p "$out"
      local excl=(--exclude='checkpoints' --exclude='*.safetensors')
      tar -czf "$out/results.tgz" -C "$CAMPAIGN_DIR" "${excl[@]}" . || true
      # what comes back is also capped in all (64 MiB here): over PACK_MAX_MIB, the profiler's raw
      # traces stay on the host and their summary (profile/summary.md) travels
      if [[ -f "$out/results.tgz" && $(stat -c %s "$out/results.tgz") -gt $(( ${PACK_MAX_MIB:-56} * 1024 * 1024 )) ]]; then
        tar -czf "$out/results.tgz" -C "$CAMPAIGN_DIR" "${excl[@]}" --exclude='profile/*.json.gz' --exclude='profile/*.json' . || true
        echo "results over ${PACK_MAX_MIB:-56} MiB: profiler traces left in $CAMPAIGN_DIR, their summaries packed"
      fi
      # what comes back from such a host is often capped per file (16 MiB here): split a larger archive
      if [[ -f "$out/results.tgz" && $(stat -c %s "$out/results.tgz") -gt $((15 * 1024 * 1024)) ]]; then
        split -b 15M -d "$out/results.tgz" "$out/results.tgz.part-" && rm "$out/results.tgz"
        echo "results split: cat results.tgz.part-* > results.tgz"
      fi
    }
    # a wait stopped from outside (a time limit) still brings home what is there
    trap 'pack; exit 143' TERM INT
    while ! all_done && [[ $(date +%s) -lt $deadline ]]; do sleep 5; done
    trap - TERM INT
    pack
    for d in "$CAMPAIGN_DIR"/*/; do
      at=""
      if [[ -f "$d/COMMIT" ]]; then at=" at commit $(cat "$d/COMMIT")"; fi
      echo "=== $(basename "$d")$at"
      echo "--- status"; cat "$d/status.tsv" 2>/dev/null || true
      echo "--- campaign.log (tail)"; tail -n 8 "$d/campaign.log" 2>/dev/null || true
      # shellcheck disable=SC2012  # newest run folder; names are ours
      latest=$(ls -td "$d"/runs/*/ 2>/dev/null | head -n 1 || true)
      if [[ -n "$latest" ]]; then
        echo "--- $latest (newest log, tail)"
        # shellcheck disable=SC2012
        log=$(ls -t "$latest"/train.log "$latest"/pytest.log "$latest"/*/train.log 2>/dev/null | head -n 1 || true)
        [[ -n "$log" ]] && tail -n 25 "$log" | cut -c1-300
      fi
    done
    for d in "$CAMPAIGN_DIR"/*/; do
      rc=$(cat "$d/DONE" 2>/dev/null || true)
      if [[ -n "$rc" && "$rc" != 0 ]]; then echo "CAMPAIGN $(basename "$d") ENDED EARLY (exit $rc): see its campaign.log above"; fi
    done
    all_done && echo "CAMPAIGN DONE" || echo "CAMPAIGN RUNNING"
    ;;
  *)
    echo "gpu/offline-host.sh: unknown command $cmd (stage, install, start, exec, wait)" >&2
    exit 2
    ;;
esac
