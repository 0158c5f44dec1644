"""Each wing's import rule: what its modules may load at import time, and why, in a fresh interpreter.

Four places run the package with less than the whole stack: the Slurm launcher on a host's bare
python3, Ray's setup hook in every verl worker before CUDA is chosen, the image builds before
anything is installed, and `verl-recipes --help` on a bare CPU machine. Each wing states its rule
here; every module of the package belongs to exactly one wing, so a new one must state its own.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMON = ROOT / "common"
PACKAGE = COMMON / "verl_recipes"

# What a CPU machine may not need to start the CLI or read the recipes: the training stack and the
# heavy data and plotting libraries. They are imported inside the functions that use them.
HEAVY = frozenset(
    {
        *("torch", "verl", "ray", "vllm", "transformers", "deepspeed", "peft", "tensordict"),
        *("hydra", "omegaconf", "pynvml", "matplotlib", "numpy", "pandas", "pyarrow"),
        *("safetensors", "tokenizers"),
    }
)

STDLIB = "the standard library only"
LIGHT = "no training stack or heavy library at import"

# wing (a subpackage, or the modules at the package root) -> (rule, why)
RULES: dict[str, tuple[str, str]] = {
    "cluster": (STDLIB, "the launcher runs on the host's bare python3 while Ray runs in the container"),
    "worker": (STDLIB, "Ray runs the setup hook in every worker before it sets CUDA_VISIBLE_DEVICES"),
    "rundir": (STDLIB, "the phase markers write the run folder from inside Ray workers"),
    "procs": (STDLIB, "the launcher's in-step reap scans /proc on a node's bare python3"),
    "layout": (STDLIB, "the Slurm launcher checks a job's layout on a host's bare python3"),
    "fixes": (STDLIB, "verl's workers read the fix table in the setup hook, before CUDA is chosen"),
    "workload": (LIGHT, "synth-model and dataset start on a CPU host; torch and pyarrow load when used"),
    "recipe": (LIGHT, "`verl-recipes list` and the recipe schema work without verl"),
    "measure": (LIGHT, "the monitor must start before, and beside, the trainer it watches"),
    "predict": (LIGHT, "the memory model answers before a GPU is rented, on any laptop"),
    "plan": (LIGHT, "the planner answers before a GPU is rented, on any laptop"),
    "stack": (LIGHT, "`verify` reports a half-installed stack instead of failing to import"),
    "peers": (LIGHT, "the peers' launchers run in another trainer's environment, where our stack is absent"),
    "root": (LIGHT, "`verl-recipes --help` works on a bare CPU machine"),
}


def wing_of(module: str) -> str:
    """`verl_recipes.<wing>[.<module>]` -> wing; a root module that owns a shared format is its own."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if len(parts) > 2 or (PACKAGE / parts[1]).is_dir() or parts[1] in RULES:
        return parts[1]
    return "root"


def all_modules() -> list[str]:
    names = ["verl_recipes"]
    names += [m.name for m in pkgutil.walk_packages([str(PACKAGE)], "verl_recipes.") if not m.name.endswith("__main__")]
    return sorted(names)


def loaded_by(modules: list[str], *, bare: bool, pythonpath: Path = COMMON) -> set[str]:
    """Top-level names in sys.modules after importing `modules` in a fresh interpreter (with `bare`,
    without site-packages: what the host's python3 has)."""
    code = (
        "import importlib, json, sys\n"
        "for m in sys.argv[1:]:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted({k.split('.')[0] for k in sys.modules})))\n"
    )
    cmd = [sys.executable, *(["-S"] if bare else []), "-c", code, *modules]
    res = subprocess.run(
        cmd, capture_output=True, text=True, env={"PYTHONPATH": str(pythonpath), "PATH": os.environ["PATH"]}
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return set(json.loads(res.stdout.strip().splitlines()[-1]))


def test_every_module_belongs_to_a_wing_with_a_rule() -> None:
    wings = {wing_of(m) for m in all_modules()}
    assert wings <= set(RULES), sorted(wings - set(RULES))
    assert set(RULES) <= wings, sorted(set(RULES) - wings)


@pytest.mark.parametrize("wing", sorted(RULES))
def test_wing_import_rule(wing: str) -> None:
    rule, why = RULES[wing]
    modules = [m for m in all_modules() if wing_of(m) == wing]
    assert modules, wing
    if rule == STDLIB:
        loaded = loaded_by(modules, bare=True)
        foreign = sorted(loaded - set(sys.stdlib_module_names) - {"verl_recipes", "__main__"})
        assert not foreign, f"{wing} must import {rule} ({why}); importing it loaded {foreign}"
    else:
        heavy = sorted(loaded_by(modules, bare=False) & HEAVY)
        assert not heavy, f"{wing} must import {rule} ({why}); importing it loaded {heavy}"


# The wings from the bottom up: a module imports (at import time or inside a function) only from its
# own wing and the wings before it here. `base` is the root modules every wing may use (the package,
# where the checkout is, the run folder, a run's processes); `commands` is every other root module:
# the orchestrators that compose the wings (cli, train, preflight, docs).
LAYERS = ("base", "workload", "worker", "recipe", "predict", "measure", "plan", "stack", "peers", "cluster", "commands")
BASE = frozenset(
    {
        "verl_recipes",
        "verl_recipes.paths",
        "verl_recipes.rundir",
        "verl_recipes.procs",
        "verl_recipes.inflight",  # writes renamed into place whole, claims: every wing writes files
        "verl_recipes.cli_types",  # the numeric argument types every wing's command takes
        "verl_recipes.layout",  # the GPU layout rules, ranks and pool shares: launcher, planner, workers
        "verl_recipes.fixes",  # the verl fixes' table: the workers patch by it, everything else judges by it
    }
)


def layer_of(module: str) -> str:
    if module in BASE:
        return "base"
    parts = module.split(".")
    return parts[1] if (PACKAGE / parts[1]).is_dir() else "commands"


def module_file(module: str) -> Path | None:
    path = COMMON.joinpath(*module.split("."))
    for cand in (path.with_suffix(".py"), path / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def imports_of(module: str) -> set[str]:
    """The package's modules that `module`'s source imports anywhere (top level, functions, TYPE_CHECKING)."""
    path = module_file(module)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            # `from pkg import mod` imports the module; `from mod import name` imports mod
            names = [f"{base}.{a.name}" if module_file(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] == "verl_recipes" and module_file(n) and n != module}
    return out


def import_graph() -> dict[str, set[str]]:
    return {m: imports_of(m) for m in all_modules()}


def test_no_wing_imports_a_wing_above_it() -> None:
    """The wings form layers: a module that imports upward ties a lower wing to everything above it
    (the recipe schema to the planner, the monitor to the README generator)."""
    assert {layer_of(m) for m in all_modules()} <= set(LAYERS)
    upward = sorted(
        f"{m} ({layer_of(m)}) imports {dep} ({layer_of(dep)})"
        for m, deps in import_graph().items()
        for dep in deps
        if LAYERS.index(layer_of(dep)) > LAYERS.index(layer_of(m))
    )
    assert not upward, "upward imports, against the order in LAYERS:\n" + "\n".join(upward)


#: what a run record is read through: the run folder's formats, the monitor and its reports, the
#: committed runs and everything judged against them
RUN_RECORDS = ("verl_recipes.rundir", "verl_recipes.measure", "verl_recipes.plan")


def test_the_model_reads_no_run_record() -> None:
    """`predict` is the model a configuration alone decides: a figure that moved because a run was
    committed would be evidence dressed as a prediction. Fitted numbers reach it as data files that
    `plan` writes from the runs, never by reading them."""
    graph = import_graph()
    reads = sorted(
        f"{m} imports {dep}"
        for m, deps in graph.items()
        if layer_of(m) == "predict"
        for dep in deps
        if any(dep == r or dep.startswith(r + ".") for r in RUN_RECORDS)
    )
    assert not reads, "the model reads run records:\n" + "\n".join(reads)


#: the wings whose functions stay short enough to read whole: the planner's model and its evidence
SHORT_WINGS = ("predict", "plan")
MAX_FUNCTION_LINES = 100


@pytest.mark.parametrize("wing", SHORT_WINGS)
def test_no_function_over_100_lines(wing: str) -> None:
    """A function is read whole or not at all: one over 100 lines mixes several meanings (one per
    phase family, role or knob family), which are split into typed functions of their own."""
    long = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((PACKAGE / wing).glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    )
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines in {wing}/:\n" + "\n".join(long)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("wing", [w for w in LAYERS if w != "commands"])
def test_no_import_cycle_inside_a_wing(wing: str) -> None:
    """Two modules that import each other are one module split in two: neither can be read, tested
    or moved alone."""
    graph = import_graph()
    inside = {m: {d for d in deps if layer_of(d) == wing} for m, deps in graph.items() if layer_of(m) == wing}
    assert not cycles(inside), f"import cycles in {wing}: {cycles(inside)}"


def test_the_import_graph_sees_imports_inside_functions() -> None:
    """The graph must see the imports that matter most here, those inside functions (the package
    defers its heavy and upward-looking imports there), and `from pkg import module` as the module."""
    assert "verl_recipes.plan.runs" in imports_of("verl_recipes.docs")  # inside _measured_cell
    assert "verl_recipes.worker.markers" in imports_of("verl_recipes.worker.hooks")  # `from ... import markers`
    assert "verl_recipes.fixes" in imports_of("verl_recipes.worker.verl_fixes")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _dockerfile_copies(dockerfile: Path, dest_prefix: str) -> list[tuple[list[str], str]]:
    """(sources, destination) of the Dockerfile's COPY instructions into `dest_prefix`."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and words[-1].startswith(dest_prefix):
            out.append((words[1:-1], words[-1]))
    return out


@pytest.mark.parametrize("dockerfile", ["images/base/Dockerfile", "images/deepspeed/Dockerfile"])
def test_the_image_builds_checks_run_from_what_the_dockerfile_copies(dockerfile: str, tmp_path: Path) -> None:
    """The builder stage runs pins_check and the image helpers before anything is installed, from the
    few files it copies: those files alone, on a bare python3, must import and run."""
    copies = _dockerfile_copies(ROOT / dockerfile, "/src/check/")
    assert copies, f"{dockerfile} copies nothing into /src/check/"
    for sources, dest in copies:
        target = tmp_path / dest.removeprefix("/src/check/")
        target.mkdir(parents=True, exist_ok=True)
        for src in sources:
            (target / Path(src).name).write_bytes((ROOT / src).read_bytes())
    modules = ["verl_recipes.stack.pins_check", "verl_recipes.stack.images"]
    loaded = loaded_by(modules, bare=True, pythonpath=tmp_path)
    assert not sorted(loaded - set(sys.stdlib_module_names) - {"verl_recipes", "__main__"})
    build_info = ["-m", "verl_recipes.stack.images", "build-info", "--versions", "images/versions.toml"]
    build_info += ["--stack", "cpu"]
    res = subprocess.run(
        [sys.executable, "-S", *build_info],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]},
    )
    assert res.returncode == 0 and "BASE_REF=" in res.stdout, res.stderr


def test_the_reward_loads_by_file_path_without_the_package(tmp_path: Path) -> None:
    """verl loads the reward function from its file path, also in workers where verl_recipes is not
    installed: the file must stand alone."""
    path = PACKAGE / "workload" / "reward.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('reward', {str(path)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "assert 'verl_recipes' not in sys.modules\n"
        "print(mod.compute_score('arith', 'so #### 42', '42'))\n"
    )
    res = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "1.0", res.stderr
    assert importlib.util.find_spec("verl_recipes.workload.reward") is not None


#: third-party modules a function may import where it is used, not at the top of its file: the
#: training stack and the heavy data and plotting libraries (`HEAVY`: a CPU host, `--help` and the
#: launcher's bare python3 do without them), torch's own data loaders, and the stacks of the peers
#: (TRL, OpenRLHF), which run in environments of their own
DEFERRED = HEAVY | frozenset({"torchdata", "megatron", "flash_attn", "trl", "openrlhf", "datasets", "accelerate"})


def _image_check_files() -> set[Path]:
    """What the image builds copy and run before anything is installed: a function there imports
    what the copy lacks (the package's other modules, any library) where it is used."""
    out: set[Path] = set()
    for dockerfile in ("images/base/Dockerfile", "images/deepspeed/Dockerfile"):
        for sources, _ in _dockerfile_copies(ROOT / dockerfile, "/src/check/"):
            out |= {ROOT / s for s in sources if s.endswith(".py")}
    return out


def _module_name(path: Path) -> str:
    parts = path.relative_to(COMMON).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _deferred_ok(path: Path, modules: set[str], copied: set[Path]) -> bool:
    """Whether an import of `tops` may sit inside a function of `path` (`test_imports_are_at_the_top_of_each_file`)."""
    stdlib = set(sys.stdlib_module_names)
    tops = {m.split(".")[0] for m in modules}
    if tops <= DEFERRED:
        return True
    if path in copied:
        return not tops <= stdlib
    # a stdlib-only wing imports a library, or a module of a wing with more than the standard
    # library, where it is used: the bare python3 it runs on lacks them
    if RULES[wing_of(_module_name(path))][0] != STDLIB:
        return False
    return not tops & stdlib and all(RULES[wing_of(m)][0] != STDLIB for m in modules if m.startswith("verl_recipes"))


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module a `from` import names, relative ones made absolute."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    package = package if path.name == "__init__.py" else package[:-1]
    return ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])


def test_imports_are_at_the_top_of_each_file() -> None:
    """A module says what it needs in its first lines: an import inside a function is for a heavy
    module (`DEFERRED`) only, or, in a file that runs on a bare python3 (a stdlib-only wing, what the
    image builds copy), for what that python3 lacks, or inside a `try` that says what happens when
    it fails. The package's own modules, the standard library and light libraries are imported at
    the top."""
    copied = _image_check_files()
    inside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        # an import inside `try` may fail, and the function says what happens then
        guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for b in t.body for n in ast.walk(b)}
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if id(node) in guarded:
                    continue
                if isinstance(node, ast.Import):
                    modules = {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    modules = {_absolute(node, path)}
                else:
                    continue
                if not _deferred_ok(path, modules, copied):
                    inside.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {', '.join(sorted(modules))} in {fn.name}"
                    )
    assert not inside, "imports inside functions, of modules that belong at the top of the file:\n" + "\n".join(
        sorted(set(inside))
    )
