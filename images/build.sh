#!/usr/bin/env bash
# Build the verl-recipes images: the base image, optionally the DeepSpeed image and recipe images.
#
#   images/build.sh [--stack gpu|cpu] [--recipe ID]... [--all-recipes] [--deepspeed]
#                   [--ca-bundle FILE] [--build-arg NAME=VALUE]... [--no-cache] [--python X.Y]
#
#   --stack cpu      the light CI variant (no torch, vLLM, verl); tags end in -cpu. Default: gpu.
#   --recipe ID      also build recipes/ID/Dockerfile FROM the base (or the DeepSpeed image).
#   --all-recipes    every recipes/*/Dockerfile.
#   --deepspeed      also build images/deepspeed/Dockerfile (GPU stack only).
#   --ca-bundle FILE let pip in the builder stages trust FILE (a TLS-intercepting proxy's CA bundle);
#                    also from VERL_RECIPES_CA_BUNDLE. The final images never contain it.
#   --base-image TAG the OS image to build on instead of the pinned one (a mirror's copy, a local
#                    image with the same Python); it must exist here or be pullable.
#   --build-arg N=V  passed to every `docker build` after ours (e.g. to see a wrong pin refused).
#   --python X.Y     the full GPU stack on Python X.Y instead of versions.toml [python] gpu, from
#                    images/lock/gpu-pyXY.txt (`nox -s lock-py311`), on python:X.Y-slim-bookworm
#                    (3.11: Debian 12's own, made here); base image only, tagged ...-pyXY and
#                    labelled verl-recipes.python=X.Y. For a host with no Python 3.12 image
#                    (`nox -s image-gpu` on this build machine).
#
# Versions, tags and the base image come from images/versions.toml through
# `python3 -m verl_recipes.pins_check build-info`. When the base OS image (BASE_IMAGE) is missing:
# the CPU variant's python:3.11-slim-bookworm is made here from Debian 12 with mmdebstrap and
# `docker import` (Docker Hub is not needed); the GPU variant's python:3.12-slim-bookworm is pulled.
# Uses the classic builder (DOCKER_BUILDKIT=0) and `--network host` for pip.
set -euo pipefail

die() { echo "build.sh: $*" >&2; exit 2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
stack=gpu
recipes=()
deepspeed=0
ca_bundle="${VERL_RECIPES_CA_BUNDLE:-}"
extra_args=()
no_cache=()
base_image=""
python_version=""

while (($# > 0)); do
  case "$1" in
    --stack) [[ $# -ge 2 ]] || die "--stack needs gpu or cpu"; stack="$2"; shift 2 ;;
    --recipe) [[ $# -ge 2 ]] || die "--recipe needs a recipe id"; recipes+=("$2"); shift 2 ;;
    --all-recipes)
      for f in "$root"/recipes/*/Dockerfile; do recipes+=("$(basename "$(dirname "$f")")"); done
      shift ;;
    --deepspeed) deepspeed=1; shift ;;
    --ca-bundle) [[ $# -ge 2 ]] || die "--ca-bundle needs a file"; ca_bundle="$2"; shift 2 ;;
    --base-image) [[ $# -ge 2 ]] || die "--base-image needs an image tag"; base_image="$2"; shift 2 ;;
    --build-arg) [[ $# -ge 2 ]] || die "--build-arg needs NAME=VALUE"; extra_args+=(--build-arg "$2"); shift 2 ;;
    --no-cache) no_cache=(--no-cache); shift ;;
    --python) [[ $# -ge 2 ]] || die "--python needs X.Y"; python_version="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[[ "$stack" == gpu || "$stack" == cpu ]] || die "--stack must be gpu or cpu, got '$stack'"
[[ "$deepspeed" == 0 || "$stack" == gpu ]] || die "the DeepSpeed image is GPU-only (drop --deepspeed or use --stack gpu)"
[[ -z "$python_version" || "$python_version" =~ ^3\.[0-9]+$ ]] || die "--python must be X.Y (e.g. 3.11), got '$python_version'"
[[ -z "$python_version" || "$stack" == gpu ]] || die "--python is for the GPU stack (the light variant is on Debian 12's Python already)"
[[ -z "$ca_bundle" || -s "$ca_bundle" ]] || die "CA bundle '$ca_bundle' does not exist or is empty"
command -v "$python" >/dev/null 2>&1 || die "no '$python' to read images/versions.toml (set PYTHON=...)"
command -v docker >/dev/null 2>&1 || die "no docker client; run .ci/docker-up.sh"
docker info >/dev/null 2>&1 || die "dockerd does not answer; run .ci/docker-up.sh (as root)"
for id in "${recipes[@]}"; do
  [[ -f "$root/recipes/$id/Dockerfile" ]] || die "recipe '$id' has no recipes/$id/Dockerfile"
done

export DOCKER_BUILDKIT=0  # no buildx here; the classic builder needs no frontend image

# --- versions and tags, from versions.toml and pyproject.toml (python, not grep) -----------------
build_info() {  # build_info [extra pins_check options...]: prints NAME=VALUE lines
  PYTHONPATH="$root/common" "$python" -m verl_recipes.pins_check build-info \
    --versions "$root/images/versions.toml" --stack "$stack" --pyproject "$root/pyproject.toml" "$@"
}
declare -A info=()
while IFS='=' read -r key value; do info["$key"]="$value"; done < <(build_info)
for key in VERL_VERSION VLLM_VERSION TORCH_VERSION CUDA_VERSION DEEPSPEED_VERSION BASE_IMAGE \
           CPU_BASE_IMAGE BASE_REF DEEPSPEED_REF PROJECT_VERSION SOURCE; do
  [[ -v "info[$key]" ]] || die "pins_check build-info did not print $key"
done

# --python X.Y other than the pinned one: the same Dockerfile, told (FALLBACK_PYTHON) that the GPU
# stack may build on X.Y; it installs images/lock/gpu-pyXY.txt, picked by the base image's Python.
fallback_args=()
gpu_python="$(PYTHONPATH="$root/common" "$python" -c 'import sys; from verl_recipes.versions import load_pins
print(load_pins(sys.argv[1])["python"]["gpu"])' "$root/images/versions.toml")"
if [[ -n "$python_version" && "$python_version" != "$gpu_python" ]]; then
  ((${#recipes[@]} == 0 && deepspeed == 0)) \
    || die "--python $python_version builds the base image only (the DeepSpeed and recipe images are for Python $gpu_python)"
  [[ -s "$root/images/lock/gpu-py${python_version/./}.txt" ]] \
    || die "--python $python_version needs images/lock/gpu-py${python_version/./}.txt (nox -s lock-py${python_version/./})"
  info[BASE_IMAGE]="python:${python_version}-slim-bookworm"
  info[BASE_REF]="${info[BASE_REF]}-py${python_version/./}"
  fallback_args=(--build-arg "FALLBACK_PYTHON=$python_version"
    --label "verl-recipes.python=$python_version (fallback: versions.toml [python] gpu is $gpu_python)")
  echo "build.sh: the GPU stack on Python $python_version (images/lock/gpu-py${python_version/./}.txt), not $gpu_python: tag ${info[BASE_REF]}"
fi
[[ -z "$base_image" ]] || info[BASE_IMAGE]="$base_image"

revision=unknown
if git -C "$root" rev-parse --verify -q HEAD >/dev/null 2>&1; then
  revision="$(git -C "$root" rev-parse HEAD)"
  git -C "$root" diff --quiet HEAD -- 2>/dev/null || revision="${revision}-dirty"
fi
source_url="${info[SOURCE]:-$(git -C "$root" config --get remote.origin.url 2>/dev/null || true)}"
source_url="${source_url:-unknown}"

common_args=(
  --network host
  --force-rm
  --build-arg "VERL_VERSION=${info[VERL_VERSION]}"
  --build-arg "VLLM_VERSION=${info[VLLM_VERSION]}"
  --build-arg "TORCH_VERSION=${info[TORCH_VERSION]}"
  --build-arg "CUDA_VERSION=${info[CUDA_VERSION]}"
  --build-arg "PROJECT_VERSION=${info[PROJECT_VERSION]}"
  --build-arg "REVISION=$revision"
  --build-arg "SOURCE=$source_url"
  --build-arg "USE_CA_BUNDLE=$([[ -n "$ca_bundle" ]] && echo 1 || echo 0)"
)

work="$(mktemp -d "${TMPDIR:-/tmp}/verl-recipes-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# --- the base OS image -------------------------------------------------------------------------
ensure_os_image() {
  local tag="$1"
  docker image inspect "$tag" >/dev/null 2>&1 && return 0
  if [[ "$tag" != "${info[CPU_BASE_IMAGE]}" ]]; then
    echo "build.sh: $tag is not here; pulling it"
    docker pull "$tag" || die "cannot pull $tag. The GPU variant needs the Python its lock is for (images/versions.toml [python] gpu); Debian 12 has only 3.11, so mmdebstrap cannot make it here. 'docker load' the image, or pass --base-image <a local image with that Python>"
    return 0
  fi
  command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is missing; run .ci/docker-up.sh (it installs it)"
  echo "build.sh: making $tag from Debian 12 (bookworm) with mmdebstrap"
  local start=$SECONDS
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --aptopt='APT::Install-Recommends "false"' --dpkgopt=force-unsafe-io \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    bookworm "$work/rootfs.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'LABEL verl-recipes.os-image="Debian 12 (bookworm) minbase + python3 3.11, made by mmdebstrap in images/build.sh"' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$tag" >/dev/null
  rm -f "$work/rootfs.tar"
  echo "build.sh: made $tag in $((SECONDS - start)) s"
}

# --- build contexts: only what each Dockerfile copies --------------------------------------------
stage_common() {  # stage_common DIR: the files the base and DeepSpeed Dockerfiles copy
  local dir="$1"
  mkdir -p "$dir/images/lock" "$dir/ca"
  cp "$root/pyproject.toml" "$dir/"
  [[ ! -f "$root/README.md" ]] || cp "$root/README.md" "$dir/"
  tar -C "$root" --exclude=__pycache__ --exclude='*.egg-info' -cf - common | tar -C "$dir" -xf -
  cp "$root/images/versions.toml" "$dir/images/"
  if compgen -G "$root/images/lock/*.txt" >/dev/null; then cp "$root"/images/lock/*.txt "$dir/images/lock/"; fi
  [[ -z "$ca_bundle" ]] || cp "$ca_bundle" "$dir/ca/ca.crt"
}

build() {  # build REF CONTEXT [docker build args...]
  local ref="$1" ctx="$2" start=$SECONDS
  shift 2
  echo "build.sh: building $ref"
  docker build "${no_cache[@]}" "${common_args[@]}" "$@" "${extra_args[@]}" -t "$ref" "$ctx"
  echo "build.sh: built $ref in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$ref") bytes"
}

ensure_os_image "${info[BASE_IMAGE]}"

ctx="$work/base"
stage_common "$ctx"
cp "$root/images/base/Dockerfile" "$ctx/Dockerfile"
build "${info[BASE_REF]}" "$ctx" --build-arg "STACK=$stack" --build-arg "BASE_IMAGE=${info[BASE_IMAGE]}" \
  "${fallback_args[@]}"

need_ds=$deepspeed
for id in "${recipes[@]}"; do
  base_kind="$(build_info --recipe-dockerfile "$root/recipes/$id/Dockerfile" | sed -n 's/^RECIPE_BASE=//p')"
  [[ "$base_kind" != deepspeed || "$stack" != gpu ]] || need_ds=1
done
if ((need_ds)); then
  ctx="$work/deepspeed"
  stage_common "$ctx"
  cp "$root/images/deepspeed/Dockerfile" "$ctx/Dockerfile"
  build "${info[DEEPSPEED_REF]}" "$ctx" --build-arg "BASE_IMAGE=${info[BASE_REF]}" \
    --build-arg "DEEPSPEED_VERSION=${info[DEEPSPEED_VERSION]}"
fi

for id in "${recipes[@]}"; do
  base_kind="$(build_info --recipe-dockerfile "$root/recipes/$id/Dockerfile" | sed -n 's/^RECIPE_BASE=//p')"
  from="${info[BASE_REF]}"
  [[ "$base_kind" != deepspeed || "$stack" != gpu ]] || from="${info[DEEPSPEED_REF]}"
  ctx="$work/recipe-$id"
  src="$root/recipes/$id"
  dst="$ctx/recipes/$id"
  mkdir -p "$dst"
  cp "$src/Dockerfile" "$ctx/Dockerfile"
  # Only the recipe's metadata, configs, launch script and expected bounds: no results or notes.
  for f in "$src"/recipe.yaml "$src"/config*.yaml "$src"/launch.sh; do [[ ! -f "$f" ]] || cp -p "$f" "$dst/"; done
  [[ ! -d "$src/expected" ]] || cp -rp "$src/expected" "$dst/"
  build "verl-recipes/$id:${info[BASE_REF]#*:}" "$ctx" --build-arg "BASE_IMAGE=$from"
done
