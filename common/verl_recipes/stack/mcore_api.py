"""Static check of verl's uses of megatron-core, Megatron-Bridge and Transformer Engine against the
source of given versions, without importing any of them.

    python -m verl_recipes.stack.mcore_api megatron_core-0.19.2-*.whl megatron_bridge-0.6.2-*.whl \\
        transformer_engine-2.20.2-*.whl [--base megatron_core-0.18.0-*.whl ...] [--verl DIR]

Why: megatron-core 0.19 and Megatron-Bridge 0.6 need Python 3.12 (and TE a CUDA torch to import),
so a Python 3.11 CPU machine cannot import them, and verl 0.9.1 was built against older versions
(megatron-core 0.18.0, TE 2.16.1, Megatron-Bridge 0.5.x) than the pins in images/versions.toml
[megatron]. Reading the sources still answers, for every name verl uses: is it there in the pins?

Checked in every verl file that names one of the packages (wheels or unpacked folders as sources):
  * ``from megatron.core.x import y`` and ``import megatron.core.x``: the module exists and binds
    ``y`` (following re-exports and star imports; a module ``__getattr__`` binds every name);
  * ``alias.attr`` where the alias is one of those modules (``mpu.get_tensor_model_parallel_rank``);
  * the keywords of a call to a function or class imported from them (a dataclass's fields
    include its bases'; a ``**kwargs`` parameter accepts anything).
With ``--base`` (the versions verl was built with) each finding says whether the base has it too,
and the names verl uses whose signature differs between base and target are listed.
Not checked: attributes of objects (a model's methods), positional arguments, behaviour.
`--provider-fields OUT` writes the GPT provider's fields instead (images/megatron-provider-fields.txt),
which the recipe composition checks `override_transformer_config` keys against.
gpu/megatron-notes.md has what this found for verl 0.9.1 and the pins.
"""

from __future__ import annotations

import argparse
import ast
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import RecipeError, one_line_errors

PACKAGES = ("megatron.core", "megatron.bridge", "transformer_engine", "mbridge")

#: (module, name): a binding's kind, or an alias to another module's name ("" = the module itself).
Binding = tuple[str, ...]


class Sources:
    """Python sources of some packages, by module name, from wheels and folders."""

    def __init__(self, paths: list[Path]) -> None:
        self._files: dict[str, tuple[str, bool]] = {}  # module -> (source, is a package)
        self._namespaces: set[str] = set()
        for path in paths:
            if path.is_dir():
                for f in path.rglob("*.py"):
                    self._add(f.relative_to(path).as_posix(), f.read_text(errors="replace"))
            elif path.suffix == ".whl":
                with zipfile.ZipFile(path) as z:
                    for name in z.namelist():
                        if name.endswith(".py"):
                            self._add(name, z.read(name).decode(errors="replace"))
            else:
                raise RecipeError(f"{path}: not a folder or a .whl")
        self._trees: dict[str, ast.Module | None] = {}
        self._bindings: dict[str, dict[str, Binding]] = {}

    def _add(self, rel: str, text: str) -> None:
        parts = rel[: -len(".py")].split("/")
        package = parts[-1] == "__init__"
        mod = ".".join(parts[:-1] if package else parts)
        self._files.setdefault(mod, (text, package))
        for i in range(1, len(parts)):
            self._namespaces.add(".".join(parts[:i]))

    def has_module(self, mod: str) -> bool:
        return mod in self._files or mod in self._namespaces

    def tree(self, mod: str) -> ast.Module | None:
        if mod not in self._trees:
            src = self._files.get(mod)
            try:
                self._trees[mod] = ast.parse(src[0]) if src else None
            except SyntaxError:
                self._trees[mod] = None
        return self._trees[mod]

    def is_package(self, mod: str) -> bool:
        return self._files[mod][1] if mod in self._files else mod in self._namespaces

    def bindings(self, mod: str) -> dict[str, Binding]:
        """A module's top-level names (inside if/try/with too): name -> ("def",) or ("alias", mod, name)."""
        if mod in self._bindings:
            return self._bindings[mod]
        out: dict[str, Binding] = {}
        self._bindings[mod] = out
        tree = self.tree(mod)
        if tree is not None:
            self._visit(mod, tree.body, out)
        return out

    def _visit(self, mod: str, body: list[ast.stmt], out: dict[str, Binding]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name] = ("def",)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            out.setdefault(n.id, ("def",))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    head = a.name.split(".")[0]
                    out[a.asname or head] = ("alias", a.name if a.asname else head, "")
            elif isinstance(node, ast.ImportFrom):
                src = _absolute(mod, self.is_package(mod), node.module, node.level)
                for a in node.names:
                    if a.name == "*":
                        for k in self.bindings(src):
                            if not k.startswith("_"):
                                out.setdefault(k, ("alias", src, k))
                    else:
                        out[a.asname or a.name] = ("alias", src, a.name)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                self._visit(mod, node.body, out)
                for h in getattr(node, "handlers", []):
                    self._visit(mod, h.body, out)
                self._visit(mod, getattr(node, "orelse", []), out)
                self._visit(mod, getattr(node, "finalbody", []), out)

    def resolve(self, mod: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """Where ``mod.name`` is defined: (module, name), (submodule, ""), or None if nowhere."""
        if self.has_module(f"{mod}.{name}"):
            return (f"{mod}.{name}", "")
        b = self.bindings(mod).get(name)
        if b is None:
            return ("", "") if "__getattr__" in self.bindings(mod) else None
        if b[0] != "alias" or depth > 20:
            return (mod, name)
        target, sub = b[1], b[2]
        if not sub or not self.has_module(target):  # a module, or a name from outside the sources
            return (target, sub)
        return self.resolve(target, sub, depth + 1)

    def definition(self, mod: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None:
        tree = self.tree(mod)
        found = None
        stack = list(tree.body) if tree else []
        while stack:
            node = stack.pop(0)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found = node
            elif isinstance(node, (ast.If, ast.Try)):
                stack += node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body]
        return found

    def keywords(self, mod: str, name: str, depth: int = 0) -> set[str] | None:
        """The keyword names a callable takes; None where it takes any (``**kwargs``) or is unreadable."""
        d = self.definition(mod, name)
        if d is None or depth > 10:
            return None
        if isinstance(d, ast.ClassDef):
            init = next((n for n in d.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is None:  # a dataclass: its annotated fields and its bases'
                fields = set(_fields(d))
                for base in d.bases:
                    bname = base.id if isinstance(base, ast.Name) else None
                    if bname in (None, "object", "ABC", "Enum"):
                        continue
                    loc = self.resolve(mod, bname)
                    more = self.keywords(*loc, depth + 1) if loc and loc[1] else None
                    if more is None:
                        return None
                    fields |= more
                return fields
            d = init
        a = d.args
        return None if a.kwarg else {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}

    def signature(self, mod: str, name: str) -> dict[str, str]:
        """A function's parameters ({"": params}), or a class's methods' and fields ({name: params, field: ""})."""
        d = self.definition(mod, name)
        if d is None:
            return {"": "value"}
        if isinstance(d, ast.ClassDef):
            out = {n.name: _params(n.args) for n in d.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            return {**out, **{f: "" for f in _fields(d)}}
        return {"": _params(d.args)}


def change(old: dict[str, str], new: dict[str, str]) -> str:
    """What a signature lost or changed (additions only counted): "" when nothing verl had is gone."""
    if "" in old or "" in new:
        return "" if old == new else f"({old.get('', '?')}) -> ({new.get('', '?')})"
    gone = sorted(set(old) - set(new))
    changed = [f"{k}({old[k]}) -> ({new[k]})" for k in sorted(set(old) & set(new)) if old[k] != new[k]]
    parts = [f"removed {', '.join(gone)}"] if gone else []
    return "; ".join(parts + changed)


def _fields(d: ast.ClassDef) -> list[str]:
    return [n.target.id for n in d.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _params(a: ast.arguments) -> str:
    names = [x.arg for x in a.posonlyargs + a.args] + ["*" + x.arg for x in a.kwonlyargs]
    return ", ".join(names + (["**"] if a.kwarg else []))


def _absolute(mod: str, package: bool, target: str | None, level: int) -> str:
    if level == 0:
        return target or ""
    base = mod.split(".") if package else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _dotted(n: ast.expr) -> str | None:
    if isinstance(n, ast.Name):
        return n.id
    if isinstance(n, ast.Attribute):
        base = _dotted(n.value)
        return f"{base}.{n.attr}" if base else None
    return None


@dataclass(frozen=True)
class Finding:
    file: str  # relative to verl's site-packages folder
    line: int
    what: str


@dataclass
class Report:
    files: int
    uses: int
    findings: list[Finding]
    used: set[tuple[str, str]]  # (module, name) of every resolved use


def check(verl_root: Path, src: Sources) -> Report:
    """Every use of the packages in verl's files (`verl_root` holds the `verl` package), resolved in `src`."""
    findings: list[Finding] = []
    used: set[tuple[str, str]] = set()
    files = uses = 0
    for path in sorted((verl_root / "verl").rglob("*.py")):
        text = path.read_text(errors="replace")
        if not any(p in text for p in PACKAGES):
            continue
        files += 1
        rel = path.relative_to(verl_root).as_posix()
        n, found = _check_file(ast.parse(text), rel, src, used)
        uses += n
        findings += found
    return Report(files, uses, findings, used)


def _check_file(tree: ast.Module, rel: str, src: Sources, used: set[tuple[str, str]]) -> tuple[int, list[Finding]]:
    out: list[Finding] = []
    names: dict[str, tuple[str, str]] = {}  # local name -> (module, name or "" for a module)
    uses = 0

    def miss(node: ast.AST, what: str) -> None:
        out.append(Finding(rel, getattr(node, "lineno", 0), what))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PACKAGES):
            mod = node.module or ""
            if not src.has_module(mod):
                miss(node, f"no module {mod}")
                continue
            for a in node.names:
                uses += 1
                loc = src.resolve(mod, a.name)
                if loc is None:
                    miss(node, f"{mod} has no {a.name}")
                elif loc[0]:
                    names[a.asname or a.name] = loc
                    if loc[1]:
                        used.add(loc)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(PACKAGES):
                    uses += 1
                    if not src.has_module(a.name):
                        miss(node, f"no module {a.name}")
                    elif a.asname:
                        names[a.asname] = (a.name, "")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            d = _dotted(node)
            head, _, rest = (d or "").partition(".")
            if head in names and names[head][1] == "" and rest:
                mod, attr = names[head][0], rest.split(".")[0]
            elif d and d.startswith(PACKAGES):
                parts = d.split(".")
                i = len(parts) - 1
                while i > 0 and not src.has_module(".".join(parts[:i])):
                    i -= 1
                if i == 0:
                    continue
                mod, attr = ".".join(parts[:i]), parts[i]
            else:
                continue
            if attr.startswith("__"):
                continue
            uses += 1
            loc = src.resolve(mod, attr)
            if loc is None:
                miss(node, f"{mod} has no {attr} (used as {d})")
            elif loc[1]:
                used.add(loc)
        elif isinstance(node, ast.Call) and node.keywords:
            d = _dotted(node.func) or ""
            head, _, rest = d.partition(".")
            if head not in names:
                continue
            mod, name = names[head]
            loc = (mod, name) if name and not rest else src.resolve(mod, rest) if not name and "." not in rest else None
            if not loc or not loc[1]:
                continue
            accepted = src.keywords(*loc)
            for kw in node.keywords:
                if accepted is not None and kw.arg is not None:
                    uses += 1
                    if kw.arg not in accepted:
                        miss(node, f"{loc[0]}.{loc[1]}() takes no keyword {kw.arg!r}")
    return uses, out


def _verl_root() -> Path:
    try:
        import verl
    except ImportError:
        raise RecipeError("verl is not installed here; give --verl DIR, the folder holding the verl package") from None
    return Path(verl.__file__).resolve().parent.parent


#: The class verl 0.9.1's Megatron-Bridge path sets every `override_transformer_config` key on
#: (`provider.apply_overrides_and_finalize`, which raises AttributeError for a name it lacks).
PROVIDER = ("megatron.bridge.models.gpt_provider", "GPTModelProvider")


#: Where its fields are committed for the pinned versions, so a key can be checked on any machine
#: before Ray starts (megatron-core 0.19 and Megatron-Bridge 0.6 do not install on Python 3.11).
def provider_fields(src: Sources) -> list[str]:
    """The dataclass fields of Megatron-Bridge's GPT provider, its bases' included, sorted."""
    fields = src.keywords(*PROVIDER)
    if not fields:
        raise RecipeError(f"{'.'.join(PROVIDER)}: not a dataclass in these sources")
    return sorted(fields)


def provider_fields_text(wheels: list[Path]) -> str:
    """The committed file's text: a header naming the versions and the command, then one field a line."""
    versions = ", ".join(" ".join(w.name.split("-")[:2]) for w in sorted(wheels))
    head = (
        f"# Fields of {'.'.join(PROVIDER)}, its bases' included,\n"
        f"# in {versions}: the keys override_transformer_config takes. Written by\n"
        "#   python -m verl_recipes.stack.mcore_api --provider-fields OUT WHEEL...\n"
        "# from the pinned wheels (images/versions.toml [megatron]); tests/test_mcore_api.py checks it is fresh.\n"
    )
    return head + "".join(f"{f}\n" for f in provider_fields(Sources(wheels)))


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_recipes.stack.mcore_api", description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="+", type=Path, help="wheels or unpacked folders of the versions to check")
    p.add_argument("--base", nargs="+", type=Path, default=[], help="the same for the versions verl was built with")
    p.add_argument("--verl", type=Path, help="the folder holding the `verl` package (default: the installed one)")
    p.add_argument("--provider-fields", type=Path, metavar="OUT", help="write the GPT provider's fields to OUT (new)")
    args = p.parse_args(argv)
    if args.provider_fields:
        if args.provider_fields.exists():
            raise RecipeError(f"{args.provider_fields} exists; give a new path (it is not overwritten)")
        if any(w.suffix != ".whl" for w in args.sources):
            raise RecipeError("--provider-fields reads wheels (their names give the versions in the header)")
        args.provider_fields.write_text(provider_fields_text(args.sources))
        print(f"wrote {args.provider_fields}")
        return 0
    target = Sources(args.sources)
    root = args.verl or _verl_root()
    rep = check(root, target)
    base_rep = check(root, Sources(args.base)) if args.base else None
    old = {(f.file, f.line, f.what) for f in base_rep.findings} if base_rep else set()
    for f in rep.findings:
        tag = "" if base_rep is None else ("  [also in base]" if (f.file, f.line, f.what) in old else "  [new]")
        print(f"{f.file}:{f.line}: {f.what}{tag}")
    print(f"{rep.files} verl files, {rep.uses} uses checked, {len(rep.findings)} not found")
    if base_rep is not None:
        base = Sources(args.base)
        both = sorted(rep.used & base_rep.used)
        changed = [(m, n, change(base.signature(m, n), target.signature(m, n))) for m, n in both]
        changed = [c for c in changed if c[2]]
        print(f"{len(changed)} of the {len(both)} names verl uses lost or changed a parameter, method or field:")
        for m, n, what in changed:
            print(f"  {m}.{n}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
