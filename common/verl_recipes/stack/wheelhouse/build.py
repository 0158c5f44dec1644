"""`verl-recipes wheelhouse`: select what the target lacks, fetch it, stage it and pack it.

The selection sorts every locked distribution into carried, already on the target (`--have`, its
`pip freeze`, at the same version) or left out (images/wheelhouse-excludes.toml, each with a
reason); the build fetches and stages the carried wheels (built from sdists where PyPI has no
wheel), adds this checkout and the `--with` groups, and packs them with a manifest and READY.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, __version__, cli_types, inflight
from verl_recipes.paths import repo_root
from verl_recipes.stack.lock import Pin, Target, canonical, compile_lock, parse_freeze, parse_lock, stack_requirements
from verl_recipes.stack.peer_pins import PeerPins, load_peer_pins
from verl_recipes.stack.pins import load_pins
from verl_recipes.stack.wheelhouse.fetch import (
    build_project_wheel,
    build_sdist,
    choose_file,
    download,
    index_files,
    repack_wheel,
    sha256_file,
    target_tags,
)
from verl_recipes.stack.wheelhouse.groups import (
    check_separate_calls,
    group_pypi_file,
    list_local_wheels,
    load_groups,
    pick_local_wheel,
)
from verl_recipes.stack.wheelhouse.pack import pack, render_install_sh

PROJECT = "verl-recipes"


PINNED = "pinned (images/versions.toml [gpu] or pyproject dependencies)"


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


@dataclass
class Selection:
    """Every locked distribution sorted into: carried, already on the target, or left out."""

    carry: list[Pin] = field(default_factory=list)
    on_target: list[Pin] = field(default_factory=list)
    excluded: list[tuple[Pin, str]] = field(default_factory=list)


def select(lock: dict[str, Pin], have: dict[str, str], excludes: Excludes, only: set[str] | None) -> Selection:
    p = Selection()
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
    peer: Path | None = None,
) -> dict[str, Any]:
    """Build the wheelhouse in `out`; returns the manifest (also written to out/manifest.json).

    With `peer` (images/peers/<name>.toml) the lock is the peer's own (stack.peer_pins), resolved
    against the target's packages, and the wheelhouse carries what the peer's environment lacks
    there; this checkout travels as the tree, not as a wheel."""
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
    pins: PeerPins | None = load_peer_pins(peer) if peer else None
    if pins and groups:
        raise RecipeError("--with adds to our stack; a --peer wheelhouse carries the peer's own pins alone")

    have = parse_freeze(have_file)
    if pins:
        lock_file = lock_file or pins.default_lock(target)
        if relock or not lock_file.is_file():
            what = f"the pins {pins.name} {pins.version} declares ({_rel(pins.path, root)})"
            made_by = f"`verl-recipes wheelhouse --peer {_rel(pins.path, root)} --relock`"
            reqs, over = pins.requirements(have), pins.override_lines()
            compile_lock(target, lock_file, reqs, seed=have_file, overrides=over, what=what, made_by=made_by)
    else:
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
    p = select(lock, have, excludes, only_c)
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
    # claimed while written (a second build into it gets one line naming this one), and READY, the
    # mark of a complete wheelhouse, goes first and comes back last: a build stopped in between
    # leaves a folder nobody takes for a wheelhouse
    held = inflight.claim(out, "the wheelhouse")
    (out / "READY").unlink(missing_ok=True)
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
    if pins is None and (only_c is None or PROJECT in only_c):
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
            entry["source"] = {"local_build": path.name, "from": str(path.parent), "sha256": sha256_file(path)}
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
        e["sha256"], e["size"] = sha256_file(w), w.stat().st_size
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
        "lock": {"file": _rel(lock_file, root), "sha256": sha256_file(lock_file)},
        "have": {"file": _rel(have_file, root), "sha256": sha256_file(have_file)},
        "only": sorted(only_c) if only_c else None,
        "with": group_rows,
        "peer": _peer_row(pins, root),
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
    inflight.write_text(out / "manifest.json", json.dumps(manifest, indent=1) + "\n", "the manifest")
    script = out / "install.sh"
    inflight.write_text(script, render_install_sh(chunks, entries), "the install script")
    script.chmod(0o755)
    shutil.rmtree(stage)
    inflight.write_text(out / "READY", ready_text(manifest), "the READY mark")
    held.release()
    return manifest


def _peer_row(pins: PeerPins | None, root: Path) -> dict[str, Any] | None:
    """The manifest's record of a peer wheelhouse: whose pins, and what stands in for which of them."""
    if pins is None:
        return None
    return {
        "name": pins.name,
        "version": pins.version,
        "pins": _rel(pins.path, root),
        "requires": list(pins.requires),
        "fixed": list(pins.fixed),
        "overrides": [
            {"requirement": o.requirement, "replaces": o.replaces, "reason": o.reason} for o in pins.overrides
        ],
    }


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def ready_text(m: dict[str, Any]) -> str:
    """The short summary to read before carrying: sizes, chunks, the biggest wheels."""
    biggest = sorted(m["wheels"], key=lambda e: -e["size"])[:15]

    def local_builds(group: str) -> list[str]:
        return [e["file"] for e in m["wheels"] if e.get("group") == group and e.get("origin") == "local build"]

    peer = m.get("peer") or {}
    lines = [
        *([f"peer: {peer['name']} {peer['version']} from {peer['pins']} (its own environment)"] if peer else []),
        *(f"  override: {o['requirement']} for {o['replaces']}: {o['reason']}" for o in peer.get("overrides", [])),
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


def _run(args: argparse.Namespace) -> int:
    target = Target(python=args.python, platform=args.platform)
    root = repo_root()
    name = f"peer-{load_peer_pins(Path(args.peer)).name}-" if args.peer else ""
    out = Path(args.out) if args.out else root / "wheelhouse" / f"{name}py{target.py_nodot}-{target.platform}"
    only = {n.strip() for n in args.only.split(",") if n.strip()} if args.only else None
    lock = Path(args.lock) if args.lock else None
    xz_level = None if args.no_xz else args.xz_level
    groups = [g.strip() for arg in args.with_groups or [] for g in arg.split(",") if g.strip()]
    local = [Path(x).expanduser() for x in args.local_wheels or []]
    versions = Path(args.versions) if args.versions else None
    peer = Path(args.peer) if args.peer else None
    m = build(
        target, Path(args.have), out, args.chunk_mib, only, lock, args.relock, root, xz_level, groups, local, versions,
        peer,
    )  # fmt: skip
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
    p.add_argument(
        "--chunk-mib", type=cli_types.positive, default=60, help="chunk size in MiB (default 60, at most 64)"
    )
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
    p.add_argument(
        "--peer",
        metavar="FILE",
        help="a peer's pins (images/peers/<name>.toml): carry its own environment, resolved into "
        "images/peers/<name>-py<XY>.txt, instead of our stack",
    )
    p.add_argument("--xz-level", type=int, default=6, choices=range(10), metavar="0-9", help="xz preset (default 6)")
    p.add_argument(
        "--no-xz",
        action="store_true",
        help="split a plain tar of the wheels as downloaded: fast, about 1.5x the size of the default, "
        "which repacks the wheels uncompressed and runs xz (about 1 CPU-second per MB)",
    )
    p.set_defaults(func=_run)
