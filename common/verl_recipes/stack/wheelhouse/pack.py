"""The carried form of a wheelhouse: one tar (xz-compressed or not) split into chunks, and install.sh.

install.sh embeds every chunk's and every wheel's sha256, so it is the only file that must travel
with the chunks; it can gather chunks that arrive in separate transfers.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError

CHUNK_PREFIX = "wheelhouse.tar.xz.part-"


def chunk_prefix(xz_level: int | None) -> str:
    return CHUNK_PREFIX if xz_level is not None else CHUNK_PREFIX.replace(".xz", "")


def pack(stage: Path, out: Path, chunk_bytes: int, xz_level: int | None = 6) -> list[dict[str, Any]]:
    """tar `stage/wheels` | xz -T<cores> -<level>, split into chunks; name, size, sha256 of each.

    `xz_level=None` skips xz: wheels are zip-deflated already, so xz gains well under 1% on them
    and costs about half a CPU-second per MB here; the tar is then split as it is.
    """
    prefix = chunk_prefix(xz_level)
    for old in [*out.glob(CHUNK_PREFIX + "*"), *out.glob(chunk_prefix(None) + "*")]:
        old.unlink()
    tar_cmd = [
        "tar",
        "--sort=name",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "--mtime=@0",
        "-cf",
        "-",
        "-C",
        str(stage),
        "wheels",
    ]
    tar = subprocess.Popen(tar_cmd, stdout=subprocess.PIPE)
    procs = [tar]
    stream = tar.stdout
    if xz_level is not None:
        xz = subprocess.Popen(
            ["xz", f"-T{os.cpu_count() or 2}", f"-{xz_level}", "-c"], stdin=tar.stdout, stdout=subprocess.PIPE
        )
        assert tar.stdout is not None
        tar.stdout.close()
        procs.append(xz)
        stream = xz.stdout
    assert stream is not None
    chunks: list[dict[str, Any]] = []
    while True:
        name, h, size = f"{prefix}{len(chunks):03d}", hashlib.sha256(), 0
        with open(out / name, "wb") as fh:
            # BufferedReader.read(n) returns n bytes unless the stream ends.
            while size < chunk_bytes and (block := stream.read(min(1 << 20, chunk_bytes - size))):
                fh.write(block)
                h.update(block)
                size += len(block)
        if size == 0:
            (out / name).unlink()
            break
        chunks.append({"file": name, "size": size, "sha256": h.hexdigest()})
        if size < chunk_bytes:
            break
    if any(p.wait() != 0 for p in procs):
        raise RecipeError("tar | xz failed while packing the wheelhouse; check free disk space in --out")
    return chunks


INSTALL_SH = r"""#!/usr/bin/env bash
# Install the offline wheelhouse these chunks carry (written by `verl-recipes wheelhouse`).
#
#   install.sh --target DIR | --system        all chunks are next to this script
#   install.sh --stage SRC --into STAGING     gather the chunks present in SRC (one transfer)
#   install.sh --install STAGING --target DIR finish once every chunk is in STAGING
#
# Every chunk and every wheel is checked against the sha256 sums below. PYTHON picks the
# interpreter (default python3); --target DIR installs there (put DIR first on PYTHONPATH),
# --system into that interpreter's environment. TARGET_DIR=DIR works like --target DIR.
set -euo pipefail

COMPRESSION=@COMPRESSION@
CHUNK_SUMS='@CHUNK_SUMS@'
WHEEL_SUMS='@WHEEL_SUMS@'
# --with groups: wheels/GROUP/*.whl, each group installed in one pip call of its own after the rest
EXTRA_GROUPS=(@EXTRA_GROUPS@)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
die() { echo "install.sh: $*" >&2; exit 1; }
usage() { sed -n '4,6p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }

mode=install src=$HERE into="" target=${TARGET_DIR:-} system=0
while (($# > 0)); do
  case $1 in
    --stage) mode=stage; src=${2:-}; [[ -n $src ]] || die "--stage needs a folder"; shift 2 ;;
    --into) into=${2:-}; [[ -n $into ]] || die "--into needs a folder"; shift 2 ;;
    --install) mode=install; src=${2:-}; [[ -n $src ]] || die "--install needs a folder"; shift 2 ;;
    --target) target=${2:-}; [[ -n $target ]] || die "--target needs a folder"; shift 2 ;;
    --system) system=1; shift ;;
    -h | --help) usage ;;
    *) die "unknown argument '$1'; run install.sh --help" ;;
  esac
done

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
chunk_names() { printf '%s\n' "$CHUNK_SUMS" | awk 'NF { print $2 }'; }
want_sha() { printf '%s\n' "$CHUNK_SUMS" | awk -v f="$1" '$2 == f { print $1 }'; }

if [[ $mode == stage ]]; then
  [[ -n $into ]] || die "--stage needs --into STAGING (where the chunks gather)"
  [[ -d $src ]] || die "--stage $src: no such folder"
  mkdir -p "$into"
  for f in install.sh manifest.json; do
    if [[ -f $src/$f && ! $src/$f -ef $into/$f ]]; then
      cp "$src/$f" "$into/$f.tmp" && mv "$into/$f.tmp" "$into/$f"
    fi
  done
  if [[ ! -f $into/install.sh ]]; then cp "${BASH_SOURCE[0]}" "$into/install.sh"; fi
  have=0 missing=()
  while read -r name; do
    want=$(want_sha "$name")
    if [[ -f $into/$name && $(sha_of "$into/$name") == "$want" ]]; then
      have=$((have + 1))
    elif [[ -f $src/$name ]]; then
      [[ $(sha_of "$src/$name") == "$want" ]] || die "$src/$name is corrupt (sha256 mismatch); carry it again"
      cp "$src/$name" "$into/$name.tmp" && mv "$into/$name.tmp" "$into/$name"
      have=$((have + 1))
    else
      missing+=("$name")
    fi
  done < <(chunk_names)
  if ((${#missing[@]} > 0)); then
    echo "staged $have of $((have + ${#missing[@]})) chunks in $into; still missing: ${missing[*]}"
  else
    echo "all $have chunks staged in $into; next: $into/install.sh --install $into --target DIR"
  fi
  exit 0
fi

[[ -d $src ]] || die "$src: no such folder"
if ((system == 0)) && [[ -z $target ]]; then
  die "no destination: give --target DIR (or set TARGET_DIR=DIR), or --system for $PYTHON's environment"
fi
missing=()
while read -r name; do [[ -f $src/$name ]] || missing+=("$name"); done < <(chunk_names)
((${#missing[@]} == 0)) || die "missing chunks in $src: ${missing[*]}; carry them and stage with --stage"
while read -r name; do
  [[ $(sha_of "$src/$name") == "$(want_sha "$name")" ]] \
    || die "$src/$name is corrupt (sha256 mismatch); carry it again"
done < <(chunk_names)

work=$(mktemp -d "${TMPDIR:-/tmp}/wheelhouse.XXXXXX")
trap 'rm -rf "$work"' EXIT
unxz() {
  if command -v xz > /dev/null; then xz -dc; else
    "$PYTHON" -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'
  fi
}
if [[ $COMPRESSION == xz ]]; then
  chunk_names | while read -r name; do cat "$src/$name"; done | unxz | tar -xf - -C "$work"
else
  chunk_names | while read -r name; do cat "$src/$name"; done | tar -xf - -C "$work"
fi
printf '%s\n' "$WHEEL_SUMS" | (cd "$work" && sha256sum --quiet -c -) > /dev/null 2>&1 \
  || die "a wheel inside the chunks does not match its sha256; rebuild the wheelhouse"
count=$(printf '%s\n' "$WHEEL_SUMS" | awk 'NF' | wc -l)
[[ $(find "$work/wheels" -name '*.whl' | wc -l) -eq $count ]] \
  || die "the chunks hold wheels not in the list; rebuild the wheelhouse"

pip=(-m pip install --no-index --no-deps --no-compile --disable-pip-version-check -q)
args=("${pip[@]}")
if ((system == 1)); then
  dest="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
else
  mkdir -p "$target"
  dest=$(cd "$target" && pwd)
  args+=(--upgrade --target "$dest")
fi
shopt -s nullglob
main=("$work"/wheels/*.whl)
if ((${#main[@]} > 0)); then
  "$PYTHON" "${args[@]}" "${main[@]}" || die "pip install failed (see above); is $PYTHON the target interpreter?"
fi
# A group's wheels only work together (a split install can drop files), so all in one call. Into a
# --target folder, each group goes to a folder of its own first and is merged in after: `pip
# install --target --upgrade` replaces a folder the target already has (bin/, a namespace package)
# whole, and without --upgrade it skips it. The wheelhouse refused any file two calls share.
note=""
for group in ${EXTRA_GROUPS[@]+"${EXTRA_GROUPS[@]}"}; do  # (bash < 4.4 and set -u: an empty array)
  wheels=("$work/wheels/$group"/*.whl)
  if ((system == 1)); then
    "$PYTHON" "${args[@]}" "${wheels[@]}" || die "pip install of the $group wheels failed (see above)"
  else
    part="$dest.$group.part"
    rm -rf "$part"
    "$PYTHON" "${pip[@]}" --target "$part" "${wheels[@]}" || die "pip install of the $group wheels failed (see above)"
    cp -a "$part"/. "$dest"/ || die "could not merge the $group wheels from $part into $dest"
    rm -rf "$part"
  fi
  note+=" ($group: ${#wheels[@]} in one pip call)"
done
if ((system == 1)); then
  echo "installed $count wheels$note into $dest"
else
  echo "installed $count wheels$note into $dest; use it with: export PYTHONPATH=$dest\${PYTHONPATH:+:\$PYTHONPATH}"
fi
"""


def render_install_sh(chunks: list[dict[str, Any]], wheels: list[dict[str, Any]]) -> str:
    """install.sh with the chunk and wheel sums embedded, so it is the only file that must travel."""
    chunk_sums = "\n".join(f"{c['sha256']}  {c['file']}" for c in chunks)
    wheel_sums = "\n".join(f"{w['sha256']}  wheels/{w['file']}" for w in wheels)
    compression = "xz" if chunks and chunks[0]["file"].startswith(CHUNK_PREFIX) else "none"
    groups = list(dict.fromkeys(w["group"] for w in wheels if w.get("group")))
    return (
        INSTALL_SH.replace("@COMPRESSION@", compression)
        .replace("@CHUNK_SUMS@", chunk_sums)
        .replace("@WHEEL_SUMS@", wheel_sums)
        .replace("@EXTRA_GROUPS@", " ".join(groups))
    )
