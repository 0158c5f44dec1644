"""`--with GROUP`: a versions.toml table of extra wheels the lock lacks (e.g. [megatron]).

Its wheels come from PyPI for the target's tags, or, for entries marked `local_build`, from
`--local-wheels` (a wheel PyPI has only as an sdist, built elsewhere against the target's Python
and packages). install.sh installs each group in one `pip install --no-deps` call of its own after
the rest, so no two calls may put the same top-level entry into one `--target` folder.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from verl_recipes import RecipeError
from verl_recipes.stack.lock import Pin, Target, canonical
from verl_recipes.stack.pins import load_pins
from verl_recipes.stack.wheelhouse.fetch import choose_file, index_files, target_tags

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


def wheel_files(path: Path) -> set[str]:
    """The paths a wheel puts into a `pip install --target` folder, its .dist-info aside.

    A console script is ``bin/NAME`` (from entry_points.txt or the wheel's .data/scripts).
    `install.sh` installs each group into a folder of its own and merges it into the target, so
    the rest and a group may share folders (``bin/``, a namespace package such as ``megatron/``),
    but not a file: the merge would overwrite one with the other.
    """
    files: set[str] = set()
    with zipfile.ZipFile(path) as z:
        for n in z.namelist():
            parts = n.split("/")
            if n.endswith("/"):
                continue
            if parts[0].endswith(".dist-info"):
                if parts[-1] == "entry_points.txt":
                    section = ""
                    for line in z.read(n).decode().splitlines():
                        line = line.strip()
                        if line.startswith("["):
                            section = line
                        elif section in ("[console_scripts]", "[gui_scripts]") and "=" in line:
                            files.add("bin/" + line.split("=", 1)[0].strip())
                continue
            if parts[0].endswith(".data") and len(parts) > 2:
                kind = {"scripts": "bin", "headers": "include"}.get(parts[1])
                files.add("/".join([kind, *parts[2:]]) if kind else "/".join(parts[2:]))
                continue
            files.add(n)
    return files


def check_separate_calls(sets: dict[str, list[Path]]) -> None:
    """Refuse when wheels installed in separate pip calls (the rest, each group) share a file."""
    owner: dict[str, tuple[str, str]] = {}
    for label, wheels in sets.items():
        for w in wheels:
            for f in sorted(wheel_files(w)):
                if f in owner and owner[f][0] != label:
                    other_label, other = owner[f]
                    raise RecipeError(
                        f"{w.name} ({label}) and {other} ({other_label}) both install {f}, but in separate "
                        "pip calls: merging the second into the target would overwrite the first's; "
                        "put both in one group"
                    )
                owner.setdefault(f, (label, w.name))
