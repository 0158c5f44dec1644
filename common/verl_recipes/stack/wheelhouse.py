"""`verl-recipes wheelhouse`: the pinned stack as files for a host with no internet.

The GPU host can only receive files carried in the working tree, at most 64 MiB per transfer, and
already has most of the stack (torch, CUDA libraries). So we resolve the hashed lock for the
target's Python and platform (verl_recipes.stack.lock), drop what the target already has at the same
version (`--have`, its `pip freeze`), leave out what images/wheelhouse-excludes.toml says is not
needed (each with a reason), build sdist-only packages into pure-Python wheels here, and pack the
rest into one xz-compressed tar split into chunks. install.sh checks every chunk and every wheel
against sha256 sums embedded in it, and can gather chunks that arrive in separate transfers.

`--with GROUP` adds a versions.toml table that is not in the lock (e.g. [megatron] for recipe
70b-3d): its wheels come from PyPI for the target's tags, or, for entries marked `local_build`,
from `--local-wheels` (a wheel PyPI has only as an sdist, built elsewhere against the target's
Python and packages). install.sh installs each group in one `pip install --no-deps` call of its
own after the rest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from verl_recipes import RecipeError, __version__
from verl_recipes.paths import repo_root
from verl_recipes.stack.lock import (
    Pin,
    Target,
    canonical,
    compile_lock,
    parse_freeze,
    parse_lock,
    stack_requirements,
)
from verl_recipes.stack.lock import refresh_lock as refresh_lock  # `nox -s lock` calls it from here
from verl_recipes.stack.pins import load_pins

INDEX = "https://pypi.org/simple"
CHUNK_PREFIX = "wheelhouse.tar.xz.part-"
PROJECT = "verl-recipes"
PINNED = "pinned (images/versions.toml [gpu] or pyproject dependencies)"
CACHE = Path(os.environ.get("VERL_RECIPES_CACHE", Path.home() / ".cache" / "verl-recipes")) / "wheels"


# --------------------------------------------------------------------------- excludes


@dataclass(frozen=True)
class Strip:
    package: str
    path: str  # glob on the path inside the wheel
    reason: str


@dataclass
class Excludes:
    packages: dict[str, str]  # canonical name -> reason
    strips: list[Strip]


def load_excludes(path: Path) -> Excludes:
    """Read images/wheelhouse-excludes.toml; every rule must carry a reason."""
    raw = load_pins(path)
    packages: dict[str, str] = {}
    for rule in raw.get("package", []):
        if not rule.get("name") or not rule.get("reason"):
            raise RecipeError(f"{path}: every [[package]] needs name and reason; fix {rule}")
        packages[canonical(rule["name"])] = str(rule["reason"])
    strips = []
    for rule in raw.get("strip", []):
        if not rule.get("package") or not rule.get("path") or not rule.get("reason"):
            raise RecipeError(f"{path}: every [[strip]] needs package, path and reason; fix {rule}")
        strips.append(Strip(canonical(rule["package"]), str(rule["path"]), str(rule["reason"])))
    return Excludes(packages, strips)


# --------------------------------------------------------------------------- choosing files


def target_tags(target: Target, local: bool = False) -> list[str]:
    """Wheel tags the target accepts, best first (what pip would compute there).

    `local=True` adds plain `linux_<arch>` (pip accepts it on any Linux of that arch): a wheel
    built for the target but not audited for manylinux, taken only from --local-wheels.
    """
    major, minor, arch = target.platform.split("_", 3)[1:]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    plats: list[str] = []
    for m in range(int(minor), 4, -1):
        plats.append(f"manylinux_{major}_{m}_{arch}")
        if m in legacy:
            plats.append(f"{legacy[m]}_{arch}")
    if local:
        plats.append(f"linux_{arch}")
    py = (3, int(target.py_nodot[1:]))
    tags = [*cpython_tags(py, platforms=plats), *compatible_tags(py, f"cp{target.py_nodot}", plats)]
    return [str(t) for t in tags]


def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or None)


def index_files(name: str) -> list[dict[str, Any]]:
    """The project's files on PyPI, from the JSON simple API (PEP 691)."""
    req = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60, context=_ssl_context()) as r:
            return list(json.load(r)["files"])
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise RecipeError(f"{name} is not on PyPI ({INDEX}/{name}/ answers 404); check the name") from e
        raise RecipeError(f"cannot read {INDEX}/{name}/ ({e}); this step needs PyPI, run it online") from e
    except OSError as e:
        raise RecipeError(f"cannot read {INDEX}/{name}/ ({e}); this step needs PyPI, run it online") from e


def choose_file(pin: Pin, files: list[dict[str, Any]], tags: list[str]) -> dict[str, Any]:
    """The best wheel for the target, else the sdist (built here); hashes must match the lock."""
    rank = {t: i for i, t in enumerate(tags)}
    best: tuple[int, dict[str, Any]] | None = None
    sdist = None
    for f in files:
        fn = f["filename"]
        if f.get("yanked") or (pin.hashes and f["hashes"].get("sha256") not in pin.hashes):
            continue
        if fn.endswith(".whl"):
            _, ver, _, wtags = parse_wheel_filename(fn)
            score = min((rank[str(t)] for t in wtags if str(t) in rank), default=None)
            if ver == Version(pin.version) and score is not None and (best is None or score < best[0]):
                best = (score, f)
        elif fn.endswith((".tar.gz", ".zip")) and fn.rsplit("-", 1)[-1].startswith(pin.version + "."):
            sdist = f
    if best:
        return best[1]
    if sdist:
        arch = tags[0].rsplit("_", 1)[-1]
        newer = [
            f["filename"] for f in files if f["filename"].endswith(f"_{arch}.whl") and "manylinux_2_" in f["filename"]
        ]
        hint = f"; wheels exist for newer glibc ({newer[0]}): give --platform of the target's glibc" if newer else ""
        return {**sdist, "hint": hint}
    raise RecipeError(f"{pin.name}=={pin.version} has no wheel for {tags[0]} and no sdist; change the pin")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(f: dict[str, Any]) -> Path:
    """Fetch one file into the cache (kept across runs), checking its sha256."""
    CACHE.mkdir(parents=True, exist_ok=True)
    dest = CACHE / f["filename"]
    want = f["hashes"]["sha256"]
    if dest.is_file() and _sha256(dest) == want:
        return dest
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.part")  # concurrent builds share the cache
    h = hashlib.sha256()
    with urllib.request.urlopen(f["url"], timeout=300, context=_ssl_context()) as r, open(tmp, "wb") as out:
        for block in iter(lambda: r.read(1 << 20), b""):
            h.update(block)
            out.write(block)
    if h.hexdigest() != want:
        tmp.unlink()
        raise RecipeError(f"{f['filename']}: sha256 differs from PyPI's; retry, or check the network path")
    tmp.rename(dest)
    return dest


def _pip_wheel(src: Path, dest: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`pip wheel` of one source with this interpreter, no dependencies and no build isolation."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(src)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)


def build_sdist(sdist: Path, sha: str, hint: str = "") -> Path:
    """Build a pure-Python wheel from an sdist with this interpreter (DS_BUILD_OPS=0 for deepspeed).

    No build isolation: deepspeed's setup.py imports torch, which this environment has. A result
    tied to this machine's Python or platform could not run on the target, so it is refused.
    """
    out = CACHE / "built" / sha[:16]
    found = list(out.glob("*.whl"))
    if not found:
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        proc = _pip_wheel(sdist, out, env)
        found = list(out.glob("*.whl"))
        if proc.returncode != 0 or not found:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise RecipeError(f"building {sdist.name} failed: {tail}{hint or '; pin a version with a wheel'}")
    wheel = found[0]
    if any(t.platform != "any" or t.abi != "none" for t in parse_wheel_filename(wheel.name)[3]):
        raise RecipeError(f"{sdist.name} builds a platform wheel ({wheel.name}); pin a version with a wheel")
    return wheel


def build_project_wheel(root: Path, dest: Path) -> Path:
    """This checkout as a wheel, built from a copy so the tree gets no build/ or egg-info."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(root / "common", src / "common", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (root / name).is_file():
                shutil.copy2(root / name, src / name)
        # A fixed zip timestamp: the same checkout gives the same wheel, so chunks already carried
        # stay valid when the wheelhouse is rebuilt.
        proc = _pip_wheel(src, dest, {**os.environ, "SOURCE_DATE_EPOCH": "315532800"})
        if proc.returncode != 0:
            raise RecipeError(f"building the verl-recipes wheel failed: {proc.stderr.strip().splitlines()[-1:]}")
    return next(dest.glob("verl_recipes-*.whl"))


def repack_wheel(
    wheel: Path, dest: Path, globs: list[str] | None = None, stored: bool = False
) -> tuple[Path, list[str], int]:
    """Copy `wheel` into `dest` without the members matching `globs` (dropped from RECORD too).

    `stored=True` writes the members uncompressed: wheels are deflated, which hides their bytes
    from xz; stored, the shared libraries and kernels compress to about 0.6x of deflate's size.
    RECORD hashes the files, not the zip, so a repacked wheel stays valid.
    """
    globs = globs or []
    out = dest / wheel.name
    mode = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(wheel) as zin:
        infos = zin.infolist()
        removed = [i.filename for i in infos if any(fnmatch.fnmatch(i.filename, g) for g in globs)]
        gone = set(removed)
        with zipfile.ZipFile(out, "w", mode) as zout:
            for info in infos:
                if info.filename in gone:
                    continue
                new = zipfile.ZipInfo(info.filename, info.date_time)
                new.external_attr, new.compress_type = info.external_attr, mode
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = zin.read(info).decode().splitlines(keepends=True)
                    zout.writestr(new, "".join(ln for ln in lines if ln.split(",", 1)[0] not in gone))
                    continue
                with zin.open(info) as src, zout.open(new, "w", force_zip64=True) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    return out, removed, sum(i.file_size for i in infos if i.filename in gone)


# --------------------------------------------------------------------------- extra groups (--with)

# versions.toml tables that describe the locked stack, the images or the host; every other table
# is a group of extra wheels that `--with NAME` adds.
CORE_TABLES = frozenset({"python", "gpu", "cpu", "driver"})


@dataclass(frozen=True)
class GroupPin:
    """One wheel of a --with group: from PyPI, or (local_build set) from --local-wheels."""

    group: str
    name: str  # canonical
    version: str
    local_build: str | None = None  # where its build is described


def load_groups(versions: Path, names: list[str]) -> list[GroupPin]:
    """The pins of the --with groups: `name = "VERSION"` or `name = { version, local_build }`."""
    if not names:
        return []
    pins = load_pins(versions)
    known = sorted(k for k, v in pins.items() if k not in CORE_TABLES and isinstance(v, dict))
    out: list[GroupPin] = []
    for g in names:
        if g in CORE_TABLES or not isinstance(pins.get(g), dict) or not re.fullmatch(r"[A-Za-z0-9_-]+", g):
            raise RecipeError(
                f"--with {g}: not a group table of {versions}; groups there: {', '.join(known) or 'none'}"
            )
        for name, spec in pins[g].items():
            if isinstance(spec, str):
                out.append(GroupPin(g, canonical(name), spec))
            elif (
                isinstance(spec, dict)
                and set(spec) == {"version", "local_build"}
                and isinstance(spec["version"], str)
                and isinstance(spec["local_build"], str)
                and spec["local_build"].strip()
            ):
                out.append(GroupPin(g, canonical(name), spec["version"], spec["local_build"].strip()))
            else:
                raise RecipeError(
                    f'{versions} [{g}] {name}: give "VERSION", or {{ version = "VERSION", local_build = '
                    f'"where its build is described" }} for a wheel PyPI lacks; fix {spec!r}'
                )
        if not any(q.group == g for q in out):
            raise RecipeError(f"--with {g}: the table in {versions} is empty")
    seen: dict[str, str] = {}
    for q in out:
        if q.name in seen:
            raise RecipeError(f"{q.name} is in both [{seen[q.name]}] and [{q.group}] of {versions}; keep it in one")
        seen[q.name] = q.group
    return out


def list_local_wheels(paths: list[Path]) -> list[Path]:
    """The .whl files given with --local-wheels: files, or every *.whl directly in a folder."""
    found: list[Path] = []
    for p in paths:
        if p.is_dir():
            found.extend(sorted(p.glob("*.whl")))
        elif p.is_file() and p.name.endswith(".whl"):
            found.append(p)
        else:
            raise RecipeError(f"--local-wheels {p}: no such .whl file or folder")
    return found


def _wheel_file_tags(path: Path) -> set[str]:
    """The `Tag:` lines of a wheel's WHEEL file (what the build wrote, whatever the file is called)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n)]
            if len(names) != 1:
                raise RecipeError(f"--local-wheels {path}: not a wheel (no single .dist-info/WHEEL); rebuild it")
            text = z.read(names[0]).decode()
    except zipfile.BadZipFile as e:
        raise RecipeError(f"--local-wheels {path}: not a zip file ({e}); rebuild it") from e
    return {t for line in text.splitlines() if line.startswith("Tag:") for t in _expand(line[4:].strip())}


def _expand(tag: str) -> list[str]:
    """`cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64` -> one tag per platform."""
    interp, abi, plats = tag.split("-")
    return [f"{i}-{a}-{p}" for i in interp.split(".") for a in abi.split(".") for p in plats.split(".")]


def build_hint(gp: GroupPin, target: Target) -> str:
    """How to build a local-build wheel, for the error lines."""
    arch = target.platform.split("_", 3)[3]
    return (
        f"build it with `python{target.python} -m pip wheel --no-deps --no-build-isolation -w DIR "
        f"{gp.name.replace('-', '_')}=={gp.version}` in a Python {target.python} environment on {arch} that has "
        f"the target's packages (e.g. its torch), see {gp.local_build}; then pass --local-wheels DIR"
    )


def pick_local_wheel(gp: GroupPin, files: list[Path], target: Target) -> Path:
    """The --local-wheels file for a local-build entry; refused unless its tags fit the target."""
    mine: list[tuple[Path, Version, frozenset[Any]]] = []
    for f in files:
        try:
            name, ver, _, wtags = parse_wheel_filename(f.name)
        except InvalidWheelFilename:
            continue
        if canonical(name) == gp.name:
            mine.append((f, ver, wtags))
    right = [m for m in mine if m[1] == Version(gp.version)]
    if not right:
        others = sorted({str(m[1]) for m in mine})
        given = f"--local-wheels has only {', '.join(others)}" if others else "--local-wheels gives no such wheel"
        raise RecipeError(
            f"--with {gp.group}: {gp.name}=={gp.version} is a local build (PyPI has no wheel for it) and {given}; "
            f"{build_hint(gp, target)}"
        )
    rank = {t: i for i, t in enumerate(target_tags(target, local=True))}
    scored = sorted(
        (min((rank[str(t)] for t in wtags if str(t) in rank), default=len(rank)), f.name, f) for f, _, wtags in right
    )
    score, _, best = scored[0]
    if score == len(rank):
        arch = target.platform.split("_", 3)[3]
        py = f"cp{target.py_nodot}"
        raise RecipeError(
            f"--local-wheels {best.name}: {_misfit(parse_wheel_filename(best.name)[3], target)}, the target is "
            f"Python {target.python} on {target.platform}; pass instead a "
            f"{gp.name.replace('-', '_')}-{gp.version}-{py}-{py}-linux_{arch}.whl (or manylinux_2_N_{arch} with "
            f"N <= {target.platform.split('_')[2]}): {build_hint(gp, target)}"
        )
    written = _wheel_file_tags(best)
    named = {str(t) for t in parse_wheel_filename(best.name)[3]}
    if written != named:
        raise RecipeError(
            f"--local-wheels {best.name}: its name says {','.join(sorted(named))} but its WHEEL file says "
            f"{','.join(sorted(written))} (renamed?); pass the wheel as `pip wheel` wrote it, "
            f"or {build_hint(gp, target)}"
        )
    return best


def _misfit(wtags: frozenset[Any], target: Target) -> str:
    """Why a wheel's tags do not fit the target, in words (the Python, else the platform)."""
    ok = [t.split("-") for t in target_tags(target, local=True)]
    pythons, plats = {(i, a) for i, a, _ in ok}, {p for _, _, p in ok}
    if not any((t.interpreter, t.abi) in pythons for t in wtags):
        return f"it is built for {','.join(sorted({f'{t.interpreter}-{t.abi}' for t in wtags}))}"
    if not any(t.platform in plats for t in wtags):
        return f"it is built for {','.join(sorted({t.platform for t in wtags}))}"
    return f"its tags {','.join(sorted(str(t) for t in wtags))} do not fit together"


def group_pypi_file(gp: GroupPin, tags: list[str]) -> dict[str, Any]:
    """The PyPI wheel of a group entry for the target (sha256 from PyPI); no sdist builds here."""
    f = choose_file(Pin(gp.name, gp.version), index_files(gp.name), tags)
    if not f["filename"].endswith(".whl"):
        raise RecipeError(
            f"--with {gp.group}: {gp.name}=={gp.version} has no wheel on PyPI for {tags[0]} (only {f['filename']}); "
            f'build one, mark it {{ version = "{gp.version}", local_build = "..." }} in versions.toml '
            f"[{gp.group}] and pass it with --local-wheels"
        )
    return f


def wheel_top_levels(path: Path) -> set[str]:
    """What a wheel puts at the top of a `pip install --target` folder, .dist-info aside.

    `pip install --target DIR --upgrade` replaces each such entry of DIR whole, so two pip calls
    into one DIR must not share any (the second would delete the first's files).
    """
    tops: set[str] = set()
    with zipfile.ZipFile(path) as z:
        for n in z.namelist():
            parts = n.split("/")
            if parts[0].endswith(".dist-info"):
                if parts[-1] == "entry_points.txt" and re.search(
                    r"^\[(console|gui)_scripts\]", z.read(n).decode(), re.M
                ):
                    tops.add("bin")
                continue
            if parts[0].endswith(".data") and len(parts) > 2:
                kind = parts[1]
                tops.add({"scripts": "bin", "headers": "include"}.get(kind, parts[2]))
                continue
            if len(parts) > 1 or parts[0]:
                tops.add(parts[0])
    return tops


def check_separate_calls(sets: dict[str, list[Path]]) -> None:
    """Refuse when wheels installed in separate pip calls (the rest, each group) share a top entry."""
    owner: dict[str, tuple[str, str]] = {}
    for label, wheels in sets.items():
        for w in wheels:
            for top in sorted(wheel_top_levels(w)):
                if top in owner and owner[top][0] != label:
                    other_label, other = owner[top]
                    raise RecipeError(
                        f"{w.name} ({label}) and {other} ({other_label}) both install {top}/, but in separate "
                        f"pip calls: `install.sh --target` would let the second delete the first's; "
                        "put both in one group"
                    )
                owner.setdefault(top, (label, w.name))


# --------------------------------------------------------------------------- packing


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


# --------------------------------------------------------------------------- install.sh

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

args=(-m pip install --no-index --no-deps --no-compile --disable-pip-version-check -q)
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
# A group's wheels only work together (a split install can drop files), so all in one call.
note=""
for group in ${EXTRA_GROUPS[@]+"${EXTRA_GROUPS[@]}"}; do  # (bash < 4.4 and set -u: an empty array)
  wheels=("$work/wheels/$group"/*.whl)
  "$PYTHON" "${args[@]}" "${wheels[@]}" || die "pip install of the $group wheels failed (see above)"
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


# --------------------------------------------------------------------------- the build


@dataclass
class Plan:
    """Every locked distribution sorted into: carried, already on the target, or left out."""

    carry: list[Pin] = field(default_factory=list)
    on_target: list[Pin] = field(default_factory=list)
    excluded: list[tuple[Pin, str]] = field(default_factory=list)


def plan(lock: dict[str, Pin], have: dict[str, str], excludes: Excludes, only: set[str] | None) -> Plan:
    p = Plan()
    if only:
        unknown = sorted(only - set(lock) - {PROJECT})
        if unknown:
            raise RecipeError(f"--only {','.join(unknown)}: not in the lock; names must be locked distributions")
    for name, pin in sorted(lock.items()):
        if only is not None and name not in only:
            continue
        if have.get(name) == pin.version:
            p.on_target.append(pin)
        elif name in excludes.packages:
            p.excluded.append((pin, excludes.packages[name]))
        else:
            p.carry.append(pin)
    return p


def _fetch(pin: Pin, tags: list[str]) -> tuple[Path, dict[str, Any]]:
    f = choose_file(pin, index_files(pin.name), tags)
    return download(f), f


def _stage_wheel(
    path: Path, name: str, dest: Path, excludes: Excludes, stored: bool, strips_done: list[dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """Copy (or repack, for xz or a strip rule) one wheel into the stage; its `stripped` record."""
    globs = [s for s in excludes.strips if s.package == name]
    dest.mkdir(parents=True, exist_ok=True)
    if globs or stored:
        out, removed, freed = repack_wheel(path, dest, [s.path for s in globs], stored)
    else:
        out, removed, freed = Path(shutil.copy2(path, dest / path.name)), [], 0
    for s in globs:
        hit = [r for r in removed if fnmatch.fnmatch(r, s.path)]
        if not hit:  # a stale rule would silently carry what it meant to remove
            print(f"warning: strip rule {s.package}:{s.path} matched nothing in {out.name}", file=sys.stderr)
        strips_done.append({"package": name, "path": s.path, "reason": s.reason, "removed_files": len(hit)})
    return out, ({"stripped": {"files": len(removed), "bytes_uncompressed": freed}} if removed else {})


def build(
    target: Target,
    have_file: Path,
    out: Path,
    chunk_mib: float = 60,
    only: set[str] | None = None,
    lock_file: Path | None = None,
    relock: bool = False,
    root: Path | None = None,
    xz_level: int | None = 6,
    with_groups: list[str] | None = None,
    local_wheels: list[Path] | None = None,
    versions_file: Path | None = None,
) -> dict[str, Any]:
    """Build the wheelhouse in `out`; returns the manifest (also written to out/manifest.json)."""
    root = root or repo_root()
    if chunk_mib <= 0 or chunk_mib > 64:
        raise RecipeError(f"--chunk-mib {chunk_mib}: give more than 0 and at most 64 (one transfer's limit)")
    # The groups first, and their local wheels: a group that cannot be carried fails before any download.
    versions_file = versions_file or root / "images" / "versions.toml"
    groups = load_groups(versions_file, list(dict.fromkeys(with_groups or [])))
    local_files = list_local_wheels(local_wheels or [])
    if local_wheels and not groups:
        raise RecipeError("--local-wheels is only read for --with groups; add --with GROUP or drop it")
    local = {q.name: pick_local_wheel(q, local_files, target) for q in groups if q.local_build}

    have = parse_freeze(have_file)
    lock_file = lock_file or target.default_lock(root)
    if relock or not lock_file.is_file():
        compile_lock(target, lock_file, stack_requirements(root), seed=have_file)
    lock = parse_lock(lock_file)
    for q in groups:
        if q.name in lock:
            raise RecipeError(
                f"--with {q.group}: {q.name} is in the lock already ({lock[q.name].version}, {_rel(lock_file, root)}); "
                f"a group adds what the lock lacks, so drop it from [{q.group}] of {versions_file}"
            )
    excludes = load_excludes(root / "images" / "wheelhouse-excludes.toml")
    only_c = {canonical(n) for n in only} if only else None
    p = plan(lock, have, excludes, only_c)
    stored = xz_level is not None  # xz only pays off on uncompressed wheel members
    tags = target_tags(target)

    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        # The group's PyPI files are looked up before anything is downloaded.
        from_pypi = [q.name for q in groups if not q.local_build]
        found = pool.map(lambda q: group_pypi_file(q, tags), [q for q in groups if not q.local_build])
        group_files = dict(zip(from_pypi, found, strict=True))
        got = pool.map(download, group_files.values())
        fetched = dict(zip([q.name for q in p.carry], pool.map(lambda q: _fetch(q, tags), p.carry), strict=True))
        group_paths = dict(zip(group_files, got, strict=True))

    out.mkdir(parents=True, exist_ok=True)
    stage = out / ".stage"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "wheels").mkdir(parents=True)
    entries: list[dict[str, Any]] = []
    strips_done: list[dict[str, Any]] = []

    for pin in p.carry:
        path, f = fetched[pin.name]
        why = [re.sub(r"^-r \S*requirements\.in$", PINNED, v) for v in pin.via] or [PINNED]
        entry: dict[str, Any] = {"name": pin.name, "version": pin.version, "why": why}
        if pin.name in have:
            entry["target_has"] = have[pin.name]
        if f["filename"].endswith(".whl"):
            entry["origin"] = "pypi"
            entry["source"] = {"pypi": f["filename"], "sha256": f["hashes"]["sha256"]}
        else:
            entry["origin"] = "sdist built here"
            entry["source"] = {"built_from_sdist": f["filename"], "sha256": f["hashes"]["sha256"]}
            path = build_sdist(path, f["hashes"]["sha256"], f.get("hint", ""))
        path, stripped = _stage_wheel(path, pin.name, stage / "wheels", excludes, stored, strips_done)
        entries.append({**entry, **stripped, "file": path.name})
    if only_c is None or PROJECT in only_c:
        with tempfile.TemporaryDirectory() as tmp:
            built = build_project_wheel(root, Path(tmp))
            wheel = (
                repack_wheel(built, stage / "wheels", stored=True)[0]
                if stored
                else Path(shutil.copy2(built, stage / "wheels" / built.name))
            )
        entries.append(
            {
                "name": PROJECT,
                "version": __version__,
                "why": ["this checkout"],
                "origin": "this checkout",
                "file": wheel.name,
            }
        )
    for q in groups:
        entry = {"name": q.name, "version": q.version, "group": q.group}
        entry["why"] = [f"--with {q.group}: {_rel(versions_file, root)} [{q.group}]"]
        if q.name in have:
            entry["target_has"] = have[q.name]
        if q.local_build:
            path = local[q.name]
            entry["origin"] = "local build"
            entry["why"].append(f"PyPI has no wheel for it; built locally ({q.local_build})")
            entry["source"] = {"local_build": path.name, "from": str(path.parent), "sha256": _sha256(path)}
        else:
            path, f = group_paths[q.name], group_files[q.name]
            entry["origin"] = "pypi"
            entry["source"] = {"pypi": f["filename"], "sha256": f["hashes"]["sha256"]}
        path, stripped = _stage_wheel(path, q.name, stage / "wheels" / q.group, excludes, stored, strips_done)
        entries.append({**entry, **stripped, "file": f"{q.group}/{path.name}"})
    if not entries:
        raise RecipeError("nothing to carry: the target already has every selected package at the locked version")
    sets: dict[str, list[Path]] = {}
    for e in entries:
        w = stage / "wheels" / e["file"]
        e["sha256"], e["size"] = _sha256(w), w.stat().st_size
        sets.setdefault(f"--with {e['group']}" if e.get("group") else "the rest", []).append(w)
    if groups:
        check_separate_calls(sets)

    chunks = pack(stage, out, int(chunk_mib * 2**20), xz_level)
    group_rows = [
        {
            "group": g,
            "from": f"{_rel(versions_file, root)} [{g}]",
            "wheels": [e["file"] for e in entries if e.get("group") == g],
            "bytes": sum(e["size"] for e in entries if e.get("group") == g),
            "install": "one `pip install --no-deps` call after the rest (install.sh)",
        }
        for g in dict.fromkeys(q.group for q in groups)
    ]
    manifest: dict[str, Any] = {
        "tool": f"verl-recipes {__version__} wheelhouse",
        "target": {"python": target.python, "platform": target.platform, "tags_best_first": tags[:3]},
        "lock": {"file": _rel(lock_file, root), "sha256": _sha256(lock_file)},
        "have": {"file": _rel(have_file, root), "sha256": _sha256(have_file)},
        "only": sorted(only_c) if only_c else None,
        "with": group_rows,
        "total_wheel_bytes": sum(e["size"] for e in entries),
        "total_chunk_bytes": sum(c["size"] for c in chunks),
        "compression": f"xz -{xz_level} of wheels repacked uncompressed"
        if stored
        else "none (tar of the wheels as downloaded)",
        "chunks": chunks,
        "wheels": sorted(entries, key=lambda e: e["name"]),
        "excluded": [{"name": q.name, "version": q.version, "reason": r} for q, r in p.excluded],
        "stripped": strips_done,
        "on_target": [f"{q.name}=={q.version}" for q in p.on_target],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    script = out / "install.sh"
    script.write_text(render_install_sh(chunks, entries))
    script.chmod(0o755)
    (out / "READY").write_text(ready_text(manifest))
    shutil.rmtree(stage)
    return manifest


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def ready_text(m: dict[str, Any]) -> str:
    """The short summary the lead reads before carrying: sizes, chunks, the biggest wheels."""
    biggest = sorted(m["wheels"], key=lambda e: -e["size"])[:15]

    def local_builds(group: str) -> list[str]:
        return [e["file"] for e in m["wheels"] if e.get("group") == group and e.get("origin") == "local build"]

    lines = [
        f"target: Python {m['target']['python']} {m['target']['platform']}",
        f"wheels: {len(m['wheels'])} ({_mib(m['total_wheel_bytes'])}); "
        f"on target already: {len(m['on_target'])}; left out: {len(m['excluded'])}",
        f"chunks: {len(m['chunks'])} ({_mib(m['total_chunk_bytes'])} in all, {m['compression']})",
        f"carry: every {m['chunks'][0]['file'][:-3]}* plus install.sh and manifest.json",
        "install: PYTHON=/path/to/python3 ./install.sh --target DIR  (or --stage/--install per transfer)",
        "differs from the target (the --target copy shadows it on PYTHONPATH): "
        + (
            ", ".join(f"{e['name']} {e['target_has']}->{e['version']}" for e in m["wheels"] if "target_has" in e)
            or "none"
        ),
        *(
            f"--with {g['group']}: {len(g['wheels'])} wheels ({_mib(g['bytes'])}), one pip call after the rest; "
            f"local builds: {', '.join(local_builds(g['group'])) or 'none'}"
            for g in m.get("with") or []
        ),
        "biggest wheels:",
        *(f"  {_mib(e['size']):>10}  {e['file']}" for e in biggest),
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI


def _run(args: argparse.Namespace) -> int:
    target = Target(python=args.python, platform=args.platform)
    root = repo_root()
    out = Path(args.out) if args.out else root / "wheelhouse" / f"py{target.py_nodot}-{target.platform}"
    only = {n.strip() for n in args.only.split(",") if n.strip()} if args.only else None
    lock = Path(args.lock) if args.lock else None
    xz_level = None if args.no_xz else args.xz_level
    groups = [g.strip() for arg in args.with_groups or [] for g in arg.split(",") if g.strip()]
    local = [Path(x).expanduser() for x in args.local_wheels or []]
    versions = Path(args.versions) if args.versions else None
    m = build(
        target, Path(args.have), out, args.chunk_mib, only, lock, args.relock, root, xz_level, groups, local, versions
    )
    extra = "".join(f"; --with {g['group']}: {len(g['wheels'])} wheels, {_mib(g['bytes'])}" for g in m["with"])
    print(
        f"wheelhouse: {len(m['wheels'])} wheels, {len(m['chunks'])} chunks, "
        f"{_mib(m['total_chunk_bytes'])} in {out}{extra} (see READY, manifest.json)"
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("wheelhouse", help="build an offline wheelhouse of the pinned stack for a target")
    p.add_argument("--python", required=True, help="target Python major.minor, e.g. 3.12")
    p.add_argument(
        "--platform",
        required=True,
        help="target platform tag for its glibc, e.g. manylinux_2_39_x86_64 (glibc 2.39)",
    )
    p.add_argument("--have", required=True, help="the target's `pip freeze` output; those versions are not carried")
    p.add_argument("--chunk-mib", type=float, default=60, help="chunk size in MiB (default 60, at most 64)")
    p.add_argument("--out", help="output folder (default wheelhouse/py<XY>-<platform>, ignored by git)")
    p.add_argument("--only", help="comma-separated distributions to carry (default: everything needed)")
    p.add_argument("--lock", help="lock file to use or write (default images/lock/gpu-py<XY>.txt)")
    p.add_argument("--relock", action="store_true", help="re-resolve the lock even if it exists")
    p.add_argument(
        "--with",
        dest="with_groups",
        action="append",
        metavar="GROUP",
        help="also carry a group table of versions.toml that the lock lacks, e.g. megatron (repeatable or a,b); "
        "install.sh installs each group in one pip --no-deps call after the rest",
    )
    p.add_argument(
        "--local-wheels",
        action="append",
        metavar="PATH",
        help="a .whl or a folder of them (repeatable) for the group entries marked local_build, which PyPI has "
        "no wheel of; each must fit the target's Python and platform (linux_<arch> accepted here only)",
    )
    p.add_argument("--versions", help="versions.toml to read the --with groups from (default images/versions.toml)")
    p.add_argument("--xz-level", type=int, default=6, choices=range(10), metavar="0-9", help="xz preset (default 6)")
    p.add_argument(
        "--no-xz",
        action="store_true",
        help="split a plain tar of the wheels as downloaded: fast, about 1.5x the size of the default, "
        "which repacks the wheels uncompressed and runs xz (about 1 CPU-second per MB)",
    )
    p.set_defaults(func=_run)
