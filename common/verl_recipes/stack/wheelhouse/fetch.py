"""Wheels for a target: its tags, PyPI's files, downloads into the cache, sdist builds, repacking.

Everything is chosen for the target's interpreter and platform tags, not this machine's, and
checked against PyPI's sha256 as it arrives.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from verl_recipes import RecipeError, inflight
from verl_recipes.paths import cache_dir
from verl_recipes.stack.lock import Pin, Target

INDEX = "https://pypi.org/simple"


CACHE = cache_dir() / "wheels"


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


def sha256_file(path: Path) -> str:
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
    if dest.is_file() and sha256_file(dest) == want:
        return dest
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.part")  # concurrent builds share the cache
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(f["url"], timeout=300, context=_ssl_context()) as r, open(tmp, "wb") as out:
            for block in iter(lambda: r.read(1 << 20), b""):
                h.update(block)
                out.write(block)
    except BaseException:  # Ctrl-C or a network error: no part file stays behind
        tmp.unlink(missing_ok=True)
        raise
    if h.hexdigest() != want:
        tmp.unlink()
        raise RecipeError(f"{f['filename']}: sha256 differs from PyPI's; retry, or check the network path")
    tmp.rename(dest)
    return dest


def _pip_wheel(src: Path, dest: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`pip wheel` of one source with this interpreter, no dependencies and no build isolation."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(src)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)


def missing_build_tools() -> list[str]:
    """The build backends an sdist build without isolation imports that this interpreter lacks.

    Without isolation pip does not install a package's build requirements, so a bare interpreter
    fails inside setuptools' metadata step with a message that names neither.
    """
    return [name for name in ("setuptools", "wheel") if importlib.util.find_spec(name) is None]


def build_sdist(sdist: Path, sha: str, hint: str = "") -> Path:
    """Build a pure-Python wheel from an sdist with this interpreter (DS_BUILD_OPS=0 for deepspeed).

    No build isolation: deepspeed's setup.py imports torch, which this environment has. A result
    tied to this machine's Python or platform could not run on the target, so it is refused.
    """
    out = CACHE / "built" / sha[:16]
    found = list(out.glob("*.whl"))
    if not found:
        missing = missing_build_tools()
        if missing:
            raise RecipeError(
                f"building {sdist.name} needs {' and '.join(missing)} in this interpreter ({sys.executable}; "
                "sdists build without isolation): run `nox -s wheelhouse -- ARGS`, which installs them"
            )
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        # built under a temporary name and renamed: a build stopped halfway leaves no wheel here
        with inflight.staged_dir(out, "the sdist build") as tmp:
            proc = _pip_wheel(sdist, tmp, env)
            if proc.returncode != 0 or not list(tmp.glob("*.whl")):
                tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
                raise RecipeError(f"building {sdist.name} failed: {tail}{hint or '; pin a version with a wheel'}")
        found = list(out.glob("*.whl"))
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
