#!/usr/bin/env bash
# Re-measure the image build figures in images/README.md and keep the logs they come from.
#
#   images/measure.sh OUT_DIR
#
# 1. the light (CPU) variant built cold: the local OS image and every layer removed first;
# 2. the GPU variant's stack in parts: download every locked distribution but the sdist-only
#    DeepSpeed and antlr4 for CPython 3.12 with hashes checked, then install them;
# 3. the full GPU base image built cold through `nox -s image-gpu` (no GPU image, no OS image or
#    stand-in, no dangling layers first), then its size, tags, labels, layers and `verify --json`.
# 4. the DeepSpeed image and every recipe image on the GPU base, as
#    `images/build.sh --stack gpu --deepspeed --all-recipes` builds them (the base from 3's layers,
#    or built here first), then per image: size, tags, labels, `verify --json` (and for a recipe
#    image `verify --json --recipe ID`) with its exit code and failed checks, and DeepSpeed's
#    version inside the DeepSpeed image.
# SKIP_LIGHT=1, SKIP_GPU_PARTS=1, SKIP_GPU_FULL=1, SKIP_GPU_ALL=1 leave a part out (3 took 25 GB of
# disk here). APPEND=1 adds to OUT_DIR/summary.txt instead of starting it anew.
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

[[ "${APPEND:-0}" == 1 ]] || : >"$out/summary.txt"
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
if [[ "${SKIP_GPU_PARTS:-0}" != 1 ]]; then
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
rm -rf "$work/wheels" "$work/site"
fi

# 3. the full GPU base image, cold, as `nox -s image-gpu` builds it
if [[ "${SKIP_GPU_FULL:-0}" != 1 ]]; then
info=$(PYTHONPATH="$root/common" python3 -m verl_recipes.stack.images build-info \
  --versions "$root/images/versions.toml" --stack gpu)
ref=$(sed -n 's/^BASE_REF=//p' <<<"$info")
os_image=$(sed -n 's/^BASE_IMAGE=//p' <<<"$info")
docker rmi -f "$ref" "$os_image" >/dev/null 2>&1 || true
docker image prune -f >/dev/null
echo "gpu-full: free on /var/lib/docker before: $(df -B1 --output=avail /var/lib/docker | tail -n 1) bytes" \
  | tee -a "$out/summary.txt"
step gpu-full "${NOX:-nox}" -f "$root/noxfile.py" -s image-gpu -- --ca-bundle "$ca"
echo "gpu-full: free on /var/lib/docker after: $(df -B1 --output=avail /var/lib/docker | tail -n 1) bytes" \
  | tee -a "$out/summary.txt"
docker image inspect -f "$ref: {{.Size}} bytes; tags {{json .RepoTags}}" "$ref" | tee -a "$out/summary.txt"
docker image inspect -f "$os_image: {{.Size}} bytes" "$os_image" | tee -a "$out/summary.txt"
docker image inspect -f '{{json .Config.Labels}}' "$ref" >"$out/gpu-full-labels.json"
docker history --format '{{.Size}}\t{{.CreatedSince}}\t{{printf "%.110s" .CreatedBy}}' "$ref" >"$out/gpu-full-history.txt"
docker run --rm --network none --entrypoint python "$ref" -c '
import importlib.metadata as m, platform
print("python", platform.python_version(), *(f"{d} {m.version(d)}" for d in ("torch", "vllm", "verl", "ray", "transformers", "verl-recipes")), sep="; ")
print("distributions:", len(list(m.distributions())))' | tee -a "$out/summary.txt"
rc=0
docker run --rm --network none "$ref" verify --json >"$out/gpu-full-verify.json" 2>"$out/gpu-full-verify.stderr" || rc=$?
echo "gpu-full: docker run --rm --network none $ref verify --json: exit $rc (gpu-full-verify.json)" | tee -a "$out/summary.txt"
docker system df >"$out/gpu-full-docker-df.txt"
fi

# 4. the DeepSpeed image and the recipe images on the GPU base
if [[ "${SKIP_GPU_ALL:-0}" != 1 ]]; then
info=$(PYTHONPATH="$root/common" python3 -m verl_recipes.stack.images build-info \
  --versions "$root/images/versions.toml" --stack gpu)
tag=$(sed -n 's/^TAG=//p' <<<"$info")
refs=("$(sed -n 's/^BASE_REF=//p' <<<"$info")" "$(sed -n 's/^DEEPSPEED_REF=//p' <<<"$info")")
for df in "$root"/recipes/*/Dockerfile; do refs+=("verl-recipes/$(basename "$(dirname "$df")"):$tag"); done
echo "gpu-all: free on /var/lib/docker before: $(df -B1 --output=avail /var/lib/docker | tail -n 1) bytes" \
  | tee -a "$out/summary.txt"
step gpu-all bash "$root/images/build.sh" --stack gpu --deepspeed --all-recipes --ca-bundle "$ca"
echo "gpu-all: free on /var/lib/docker after: $(df -B1 --output=avail /var/lib/docker | tail -n 1) bytes" \
  | tee -a "$out/summary.txt"
grep -E '^build\.sh: built ' "$out/gpu-all.log" | sed 's/^/gpu-all: /' | tee -a "$out/summary.txt"
checks() {  # checks FILE: the failed and warned checks of a verify --json report
  python3 - "$1" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except ValueError as e:
    sys.exit(f"no JSON ({e})")
by = lambda s: ",".join(c["name"] for c in r["checks"] if c["status"] == s) or "-"
print(f"ok={r['ok']}; failed: {by('fail')}; warned: {by('warn')}")
PY
}
for ref in "${refs[@]}"; do
  name=${ref%%:*}; name=${name#verl-recipes/}
  docker image inspect -f "$ref: {{.Size}} bytes; tags {{json .RepoTags}}" "$ref" | tee -a "$out/summary.txt"
  docker image inspect -f '{{json .Config.Labels}}' "$ref" >"$out/gpu-all-$name-labels.json"
  rc=0
  docker run --rm --network none "$ref" verify --json >"$out/gpu-all-$name-verify.json" \
    2>"$out/gpu-all-$name-verify.stderr" || rc=$?
  echo "gpu-all: docker run --rm --network none $ref verify --json: exit $rc; $(checks "$out/gpu-all-$name-verify.json")" \
    | tee -a "$out/summary.txt"
  if [[ -f "$root/recipes/$name/Dockerfile" ]]; then
    rc=0
    docker run --rm --network none "$ref" verify --json --recipe "$name" >"$out/gpu-all-$name-verify-recipe.json" \
      2>"$out/gpu-all-$name-verify-recipe.stderr" || rc=$?
    echo "gpu-all: docker run --rm --network none $ref verify --json --recipe $name: exit $rc; $(checks "$out/gpu-all-$name-verify-recipe.json")" \
      | tee -a "$out/summary.txt"
  fi
done
docker run --rm --network none --entrypoint python "${refs[1]}" -c \
  'import deepspeed; print("deepspeed", deepspeed.__version__)' 2>"$out/gpu-all-deepspeed-import.stderr" \
  | sed "s#^#gpu-all: ${refs[1]}: #" | tee -a "$out/summary.txt"
rc=0
docker run --rm --network none --entrypoint ds_report "${refs[1]}" >"$out/gpu-all-ds_report.txt" 2>&1 || rc=$?
echo "gpu-all: docker run --rm --network none --entrypoint ds_report ${refs[1]}: exit $rc (gpu-all-ds_report.txt)" \
  | tee -a "$out/summary.txt"
docker system df >"$out/gpu-all-docker-df.txt"
fi
