#!/usr/bin/env bash
# Build the verl-recipes images: the base image, optionally the DeepSpeed image and recipe images.
#
#   images/build.sh [--stack gpu|cpu] [--recipe ID]... [--all-recipes] [--deepspeed]
#                   [--ca-bundle FILE] [--build-arg NAME=VALUE]... [--no-cache]
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
#
# Versions, tags and the base image come from images/versions.toml through
# `python3 -m verl_recipes.stack.images build-info`. When the base OS image (BASE_IMAGE) is missing:
# the CPU variant's python:3.11-slim-bookworm is made here from Debian 12 with mmdebstrap and
# `docker import` (Docker Hub is not needed); the GPU variant's python:3.12-slim-bookworm is pulled,
# and where that fails, a stand-in is made under that tag: Debian 12 from mmdebstrap plus a CPython
# 3.12 already built on this host (VERL_RECIPES_CPYTHON=PREFIX, else the newest pyenv 3.12.*) in
# /usr/local, labelled verl-recipes.os-image=stand-in... (images/README.md).
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
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[[ "$stack" == gpu || "$stack" == cpu ]] || die "--stack must be gpu or cpu, got '$stack'"
[[ "$deepspeed" == 0 || "$stack" == gpu ]] || die "the DeepSpeed image is GPU-only (drop --deepspeed or use --stack gpu)"
[[ -z "$ca_bundle" || -s "$ca_bundle" ]] || die "CA bundle '$ca_bundle' does not exist or is empty"
command -v "$python" >/dev/null 2>&1 || die "no '$python' to read images/versions.toml (set PYTHON=...)"
command -v docker >/dev/null 2>&1 || die "no docker client; run .ci/docker-up.sh"
docker info >/dev/null 2>&1 || die "dockerd does not answer; run .ci/docker-up.sh (as root)"
for id in "${recipes[@]}"; do
  [[ -f "$root/recipes/$id/Dockerfile" ]] || die "recipe '$id' has no recipes/$id/Dockerfile"
done

export DOCKER_BUILDKIT=0  # no buildx here; the classic builder needs no frontend image

# --- versions and tags, from versions.toml and pyproject.toml (python, not grep) -----------------
build_info() {  # build_info [extra build-info options...]: prints NAME=VALUE lines
  PYTHONPATH="$root/common" "$python" -m verl_recipes.stack.images build-info \
    --versions "$root/images/versions.toml" --stack "$stack" --pyproject "$root/pyproject.toml" "$@"
}
declare -A info=()
while IFS='=' read -r key value; do info["$key"]="$value"; done < <(build_info)
for key in VERL_VERSION VLLM_VERSION TORCH_VERSION CUDA_VERSION DEEPSPEED_VERSION BASE_IMAGE \
           CPU_BASE_IMAGE BASE_REF DEEPSPEED_REF PROJECT_VERSION SOURCE; do
  [[ -v "info[$key]" ]] || die "images build-info did not print $key"
done
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
# Debian 12 (bookworm) minbase from deb.debian.org, as the official slim images have it.
debian_opts=(
  --quiet --variant=minbase
  --aptopt='APT::Install-Recommends "false"' --dpkgopt=force-unsafe-io
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
)
debian_mirrors=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)

local_cpython() {  # local_cpython X.Y: the prefix of a CPython X.Y build on this host, or nothing
  local ver="$1" cand
  local cands=()
  [[ -z "${VERL_RECIPES_CPYTHON:-}" ]] || cands+=("$VERL_RECIPES_CPYTHON")
  while IFS= read -r cand; do cands+=("$cand"); done \
    < <(compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/$ver.*" | sort -rV || true)
  for cand in "${cands[@]}"; do
    if [[ -x "$cand/bin/python$ver" ]] && "$cand/bin/python$ver" -c \
        "import sys, ssl, venv, ensurepip; sys.exit(sys.version_info[:2] != tuple(map(int, '$ver'.split('.'))))" 2>/dev/null; then
      echo "$cand"
      return 0
    fi
  done
  return 1
}

make_python_standin() {  # make_python_standin TAG X.Y PREFIX: Debian 12 + that CPython in /usr/local
  local tag="$1" ver="$2" prefix="$3" start=$SECONDS rootfs="$work/rootfs" full
  full="$("$prefix/bin/python$ver" -c 'import platform; print(platform.python_version())')"
  echo "build.sh: making a stand-in for $tag: Debian 12 (bookworm) + CPython $full from $prefix"
  # The run-time libraries CPython's extension modules link against (tkinter left out, as in slim).
  mmdebstrap "${debian_opts[@]}" \
    --include=ca-certificates,netbase,tzdata,libbz2-1.0,libexpat1,libffi8,liblzma5,libncursesw6,libnsl2,libreadline8,libsqlite3-0,libssl3,libtinfo6,libtirpc3,libuuid1,zlib1g \
    bookworm "$rootfs" "${debian_mirrors[@]}"
  # The interpreter, its shared library, standard library and headers; no site-packages (whatever
  # the host installed stays out: pip comes from ensurepip below), no tests, tkinter or byte code.
  tar -C "$prefix" -cf - \
    --exclude="lib/python$ver/site-packages/*" --exclude='test' --exclude='tests' --exclude='idle_test' \
    --exclude="lib/python$ver/tkinter" --exclude="lib/python$ver/idlelib" --exclude="lib/python$ver/turtledemo" \
    --exclude='_tkinter*' --exclude='__pycache__' --exclude='*.pyc' --exclude='libpython*.a' \
    "bin/python$ver" lib include | tar -C "$rootfs/usr/local" -xf -
  # Paths the host build recorded (sysconfig, pkg-config, the config Makefile) now name /usr/local.
  grep -rlIF "$prefix" "$rootfs/usr/local/lib" | xargs -r sed -i "s#$prefix#/usr/local#g"
  ln -s "python$ver" "$rootfs/usr/local/bin/python3"
  ln -s python3 "$rootfs/usr/local/bin/python"
  chroot "$rootfs" /sbin/ldconfig
  # (ensurepip drops PIP_* settings, so its warning about running as root shows; it is harmless here)
  chroot "$rootfs" /usr/local/bin/python3 -m ensurepip --default-pip >/dev/null
  find "$rootfs/usr/local" -depth -name __pycache__ -type d -exec rm -rf {} +
  chroot "$rootfs" /usr/local/bin/python3 -c \
    "import sys, ssl, sqlite3, ctypes, lzma, bz2, zlib, venv, uuid, readline, pip; print(sys.version.split()[0], ssl.OPENSSL_VERSION, 'pip', pip.__version__)" \
    || die "the stand-in's Python does not start or lacks a module; see above"
  tar -C "$rootfs" -cf - . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "ENV PYTHON_VERSION=$full" \
    --change "LABEL verl-recipes.os-image=\"stand-in for $tag: Debian 12 (bookworm) minbase + CPython $full copied from $prefix on the build host into /usr/local, made by mmdebstrap in images/build.sh\"" \
    --change 'CMD ["python3"]' \
    - "$tag" >/dev/null
  rm -rf "$rootfs"
  echo "build.sh: made $tag (stand-in, CPython $full) in $((SECONDS - start)) s"
}

ensure_os_image() {
  local tag="$1" ver prefix
  docker image inspect "$tag" >/dev/null 2>&1 && return 0
  if [[ "$tag" != "${info[CPU_BASE_IMAGE]}" ]]; then
    echo "build.sh: $tag is not here; pulling it"
    docker pull "$tag" && return 0
    # No registry: a stand-in made from Debian 12 and a CPython of that version built on this host.
    [[ "$tag" =~ ^python:(3\.[0-9]+)-slim-bookworm$ ]] || die "cannot pull $tag; 'docker load' it"
    ver="${BASH_REMATCH[1]}"
    command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is missing; run .ci/docker-up.sh (it installs it)"
    prefix="$(local_cpython "$ver")" || die "cannot pull $tag, and no CPython $ver on this host to make a stand-in from (Debian 12 ships only 3.11). Point VERL_RECIPES_CPYTHON at a CPython $ver install prefix, 'docker load' the image, or pass --base-image <a local image with that Python>"
    make_python_standin "$tag" "$ver" "$prefix"
    return 0
  fi
  command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is missing; run .ci/docker-up.sh (it installs it)"
  echo "build.sh: making $tag from Debian 12 (bookworm) with mmdebstrap"
  local start=$SECONDS
  mmdebstrap "${debian_opts[@]}" --include=python3,python3-venv,ca-certificates \
    bookworm "$work/rootfs.tar" "${debian_mirrors[@]}"
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
build "${info[BASE_REF]}" "$ctx" --build-arg "STACK=$stack" --build-arg "BASE_IMAGE=${info[BASE_IMAGE]}"

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
