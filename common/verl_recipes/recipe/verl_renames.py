"""verl keys that moved between the commit verl's example scripts were read at and verl 0.9.1.

verl's examples (`recipe.verl_suite`, read at commit b178a3cd5) set keys of that commit's schema;
this project composes against verl 0.9.1's. Where verl moved a section whole, a script's key has
one meaning in 0.9.1 under another name: b178a3cd5's `critic.model.fsdp_config.param_offload` is
0.9.1's `critic.fsdp.param_offload` (verl 0.9.1 ships no migration for it; its
`migrate_legacy_reward_impl` covers the legacy `reward_model.*` keys only, which 0.9.1's schema
still holds). `recipe.verl_job` rewrites such a key to its 0.9.1 name and says so (`mapped:`), and
`recipe.compose` points at the new name when a key neither schema has sits in a moved section.

The table (`verl_renames.yaml`) is derived, never written by hand, from two generated schemas
(verl's `_generated_ppo_trainer.yaml`): b178a3cd5's, kept as a committed extract of its key
names and value types (`verl_examples_keys.yaml`, since verl's repository is not at hand
everywhere), and the installed verl's. A key moved when

* its section is gone (the section's parent is not) and exactly one section that is new in 0.9.1
  holds every one of its keys, with the same value types, in the same top-level section or under
  the same name (a move of `critic.model.fsdp_config` to `critic.fsdp`; `reward_manager` to
  `reward.reward_manager`): each key under it maps to the same key under the new section;
* or it is a gone key in a section 0.9.1 still has, and exactly one new key of the same
  top-level section has its name and type.

`python -m verl_recipes.recipe.verl_renames --repo VERL_GIT_DIR --commit COMMIT --write` writes
the extract and the table; without `--repo`, the table from the committed extract. A test holds
the committed table to what the two schemas give now.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError, inflight, one_line_errors

HERE = Path(__file__).resolve().parent
TABLE_FILE = HERE / "verl_renames.yaml"
#: the commit verl's examples are read at (validation/verl-examples/suite.yaml)
OLD_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
EXTRACT_FILE = HERE / "verl_examples_keys.yaml"
GENERATED = "verl/trainer/config/_generated_ppo_trainer.yaml"

SECTION, ANY = "section", "interpolation"

Types = dict[str, str]


def _kind(value: Any) -> str:
    """A generated schema's value as its type word; an interpolation takes any type."""
    if isinstance(value, str) and "${" in value:
        return ANY
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list"}.get(type(value), type(value).__name__)


def types_of(tree: dict[str, Any]) -> dict[str, Any]:
    """A generated schema's tree with each value replaced by its type word (the extract's form)."""
    return {str(k): types_of(v) if isinstance(v, dict) else _kind(v) for k, v in tree.items()}


def flatten(tree: dict[str, Any], prefix: str = "") -> Types:
    """Dotted key -> type word (SECTION for a mapping) of a tree of type words."""
    out: Types = {}
    for k, v in tree.items():
        full = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out[full] = SECTION
            out.update(flatten(v, full))
        else:
            out[full] = str(v)
    return out


def _same(a: str, b: str) -> bool:
    return a == b or ANY in (a, b)


def _children(keys: Types, section: str) -> Types:
    """`section`'s descendants, by their path under it."""
    head = section + "."
    return {k[len(head) :]: t for k, t in keys.items() if k.startswith(head)}


def derive(old: Types, new: Types) -> dict[str, str]:
    """The renames: b178a3cd5's key -> 0.9.1's (module docstring), sections and keys both."""
    gone = [k for k in old if k not in new]
    added = {k: t for k, t in new.items() if k not in old}
    out: dict[str, str] = {}
    for key in gone:  # parents before children: the generated file's order
        parent = key.rpartition(".")[0]
        if parent and parent not in new:
            continue  # under a gone section: moved with it, or not at all
        top, leaf = key.split(".", 1)[0], key.rsplit(".", 1)[-1]
        if old[key] == SECTION:
            want = {p: t for p, t in _children(old, key).items() if p.rsplit(".", 1)[-1] != "_target_"}
            found = [
                s
                for s, t in added.items()
                if t == SECTION
                and (s.split(".", 1)[0] == top or s.rsplit(".", 1)[-1] == leaf)
                and all(p in (have := _children(new, s)) and _same(t2, have[p]) for p, t2 in want.items())
            ]
            if len(found) == 1:
                out[key] = found[0]
                out.update({f"{key}.{p}": f"{found[0]}.{p}" for p in _children(old, key) if f"{found[0]}.{p}" in new})
        else:
            found = [
                k
                for k, t in added.items()
                if t != SECTION and k.split(".", 1)[0] == top and k.rsplit(".", 1)[-1] == leaf and _same(old[key], t)
            ]
            if len(found) == 1:
                out[key] = found[0]
    return out


def installed_types() -> Types:
    """The installed verl's generated ppo_trainer schema as dotted key -> type word."""
    try:
        import verl
    except ImportError as e:
        raise RecipeError("verl is not installed: pip install 'verl-recipes[verl]' (verl==0.9.1)") from e
    path = Path(verl.__file__).parent / "trainer" / "config" / Path(GENERATED).name
    return flatten(types_of(yaml.safe_load(path.read_text())))


def extract_types(path: Path = EXTRACT_FILE) -> Types:
    return flatten(yaml.safe_load(path.read_text())["keys"])


@functools.cache
def renames() -> dict[str, str]:
    """The committed table: b178a3cd5's key -> verl 0.9.1's."""
    doc = yaml.safe_load(TABLE_FILE.read_text())
    return {str(k): str(v) for k, v in (doc.get("renames") or {}).items()}


def renamed(key: str) -> str | None:
    """verl 0.9.1's name for a key b178a3cd5's schema has and 0.9.1 moved, else None."""
    return renames().get(key)


def moved_prefix(key: str) -> str | None:
    """`key` with its longest moved section replaced by the section's 0.9.1 name, else None: the
    place a key neither schema has would be looked for (`compose`'s did-you-mean)."""
    table = renames()
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in table:
            return ".".join([table[head], *parts[i:]])
    return None


def gone(key: str) -> str | None:
    """The commit whose schema had `key` where verl 0.9.1 has neither it nor a new name for it (a key
    verl removed, e.g. `trainer.use_legacy_worker_impl`), else None."""
    if renamed(key) is not None or key not in _extract():
        return None
    return str(yaml.safe_load(EXTRACT_FILE.read_text())["commit"])


@functools.cache
def _extract() -> Types:
    return extract_types()


def table_text(old: Types, new: Types, commit: str = OLD_COMMIT) -> str:
    table = derive(old, new)
    head = (
        f"# verl keys moved between commit {commit[:9]} (where verl's examples are read) and verl 0.9.1: the old\n"
        "# key -> 0.9.1's. Derived from both generated ppo_trainer schemas by\n"
        "# `python -m verl_recipes.recipe.verl_renames --write` (verl_renames.py says the rule); do not edit.\n"
    )
    body = yaml.safe_dump({"from": commit, "renames": table}, sort_keys=False, width=200)
    return head + body


def git_out(repo: Path, *args: str) -> str:
    """`git -C REPO ARGS`'s output; a folder that is no git directory, or a commit or path it does
    not hold, is one line naming what git said."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except FileNotFoundError as e:
        raise RecipeError("git is not installed here; the suite is read from a git directory of verl") from e
    if proc.returncode:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        said = next((ln for ln in lines if ln.startswith("fatal:")), lines[0])
        raise RecipeError(
            f"git -C {repo} {' '.join(args)}: {said} (--repo: a git directory of verl; --commit: a commit it holds)"
        )
    return proc.stdout


def extract_text(repo: Path, commit: str) -> str:
    full = git_out(repo, "rev-parse", commit).strip()
    src = git_out(repo, "show", f"{full}:{GENERATED}")
    head = (
        f"# verl's {GENERATED} at commit {full[:9]}: its keys and the type of each default\n"
        f"# ({ANY}: a ${{...}} reference). Written by `python -m verl_recipes.recipe.verl_renames --repo\n"
        "# VERL_GIT_DIR --commit COMMIT --write`; verl_renames.yaml is derived from it and verl 0.9.1's.\n"
    )
    return head + yaml.safe_dump({"commit": full, "keys": types_of(yaml.safe_load(src))}, sort_keys=False, width=200)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_recipes.recipe.verl_renames", description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, help="a git directory of verl (bare is fine): write the extract from it")
    p.add_argument("--commit", default=OLD_COMMIT)
    p.add_argument("--write", action="store_true", help="write the files (else print the table)")
    a = p.parse_args(argv)
    if a.repo is not None:
        extract = extract_text(a.repo, a.commit)
        if a.write:
            inflight.write_text(EXTRACT_FILE, extract, "the schema extract")
            print(f"wrote {EXTRACT_FILE}")
        old = flatten(yaml.safe_load(extract)["keys"])
        commit = str(yaml.safe_load(extract)["commit"])
    else:
        old, commit = extract_types(), str(yaml.safe_load(EXTRACT_FILE.read_text())["commit"])
    text = table_text(old, installed_types(), commit)
    if a.write:
        inflight.write_text(TABLE_FILE, text, "the rename table")
        print(f"wrote {TABLE_FILE}: {len(derive(old, installed_types()))} keys")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
