#!/usr/bin/env bash
# Re-measure the image build figures in images/README.md and keep the logs they come from.
#
#   images/measure.sh OUT_DIR
#
# 1. the light (CPU) variant built cold: the local OS image and every layer removed first;
# 2. the GPU variant's stack in parts (its python:3.12 base cannot be had here): download every
#    locked distribution but the sdist-only DeepSpeed and antlr4 for CPython 3.12 with hashes checked, then install them.
# Each step's command, wall time and sizes go to OUT_DIR/*.log; OUT_DIR/summary.txt lists them.
set -euo pipefail
out=${1:?usage: images/measure.sh OUT_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
docker info >/dev/null 2>&1 || { echo "measure.sh: no dockerd; run .ci/docker-up.sh first" >&2; exit 2; }
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() {  # name, command...: run it, log it, time it
  local name=$1; shift
  local t0 t1
  t0=$(date +%s)
  { echo "# date: $(date -u +%FT%TZ)  host: $(hostname)  cores: $(nproc)  load: $(cut -d' ' -f1 /proc/loadavg)"
    echo "# command: $*"; "$@"; } >"$out/$name.log" 2>&1
  t1=$(date +%s)
  echo "$name: $((t1 - t0)) s  ($*)" | tee -a "$out/summary.txt"
}

: >"$out/summary.txt"
# 1. light variant, cold (SKIP_LIGHT=1 measures only the GPU stack)
if [[ "${SKIP_LIGHT:-0}" != 1 ]]; then
docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^(verl-recipes/|python:3\.11-slim-bookworm)' \
  | xargs -r docker rmi -f >/dev/null
docker builder prune -af >/dev/null 2>&1 || true
step light-cold bash "$root/images/build.sh" --stack cpu --recipe 7b-lora --ca-bundle "$ca"
docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(verl-recipes/|python:3\.11)' \
  | tee -a "$out/summary.txt"
fi

# 2. the GPU stack in parts
python3 - "$root/images/lock/gpu-py312.txt" "$work/lock-no-deepspeed.txt" <<'PY'
import re, sys
src, dst = sys.argv[1], sys.argv[2]
blocks, cur = [], []
for line in open(src):
    if re.match(r"^[A-Za-z0-9]", line) and cur:
        blocks.append(cur); cur = []
    cur.append(line)
blocks.append(cur)
# sdist-only pins (built in the image, not downloadable as wheels for another Python): left out here
skip = ("deepspeed==", "antlr4-python3-runtime==")
open(dst, "w").writelines(l for b in blocks if not b[0].startswith(skip) for l in b)
PY
tags=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for n in $(seq 39 -1 17); do tags+=(--platform "manylinux_2_${n}_x86_64"); done
tags+=(--platform manylinux2014_x86_64 --platform linux_x86_64)
step gpu-download python3 -m pip download -q --no-cache-dir --no-deps --require-hashes --only-binary=:all: \
  "${tags[@]}" -r "$work/lock-no-deepspeed.txt" -d "$work/wheels"
echo "gpu wheels: $(find "$work/wheels" -name '*.whl' | wc -l) files, $(du -sb "$work/wheels" | cut -f1) bytes" | tee -a "$out/summary.txt"
step gpu-install python3 -m pip install -q --no-deps --no-index --find-links "$work/wheels" --target "$work/site" \
  --only-binary=:all: --ignore-requires-python "${tags[@]}" --require-hashes -r "$work/lock-no-deepspeed.txt"
echo "gpu site: $(du -sb "$work/site" | cut -f1) bytes" | tee -a "$out/summary.txt"
