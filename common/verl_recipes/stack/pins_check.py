"""Pin consistency: every place that names a version must agree with `images/versions.toml`.

Places checked by `check_repo()` (and `python -m verl_recipes.stack.pins_check check`):
- the `ARG NAME=default` version defaults of every Dockerfile (images/*/Dockerfile, recipes/*/Dockerfile),
  including the `BASE_IMAGE` default, which must be the image tag that the pins name;
- pyproject.toml: each requirement on a pinned package must admit the pin, and the stack's key
  packages (verl, vllm, torch, ray, deepspeed) must be pinned exactly (`==`);
- the lock files under images/lock/ (when present): the locked version of each pinned package;
- `verl-recipes verify` (when built): the versions it expects.

Each problem reads `file:line: package: found X, versions.toml says Y`.

The image builds call `python -m verl_recipes.stack.pins_check build-args ...` inside the builder stage, so
that a `--build-arg VERL_VERSION=0.9.0` fails the build with the reason; that path and the tag helpers
use the standard library only (the builder has not installed anything yet). `docker_run_line()` gives
the `docker run` command of a recipe's image for its README.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_recipes.stack.lock import canonical, entry_name, parse_lock_text
from verl_recipes.stack.pins import load_pins

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from verl_recipes.recipe.metadata import Recipe

# Build argument -> (versions.toml table, key). Every `ARG *_VERSION` of a Dockerfile must be here.
VERSION_ARGS: dict[str, tuple[str, str]] = {
    "VERL_VERSION": ("gpu", "verl"),
    "VLLM_VERSION": ("gpu", "vllm"),
    "TORCH_VERSION": ("gpu", "torch"),
    "CUDA_VERSION": ("gpu", "cuda"),
    "RAY_VERSION": ("gpu", "ray"),
    "TRANSFORMERS_VERSION": ("gpu", "transformers"),
    "DEEPSPEED_VERSION": ("gpu", "deepspeed"),
    "PYTHON_VERSION": ("python", "gpu"),
}

# pyproject requirements on these must be exact pins (`==`); others must only admit the pin.
EXACT = ("verl", "vllm", "torch", "ray", "deepspeed")

IMAGE_REPO = "verl-recipes"
# The light (CPU) variant's base: Debian 12's own python3 is 3.11. images/build.sh makes a local image
# under this tag with mmdebstrap when Docker Hub is out of reach; the official image works the same.
CPU_BASE_IMAGE = "python:3.11-slim-bookworm"
STACKS = ("gpu", "cpu")


def gpu_base_image(pins: Mapping[str, Any]) -> str:
    """The official slim Debian Python image of the GPU variant (torch's wheels carry CUDA)."""
    return f"python:{pins['python']['gpu']}-slim-bookworm"


def cuda_tag(cuda: str) -> str:
    """`13.0` -> `cu130`, the suffix torch's wheel indexes use."""
    return "cu" + cuda.replace(".", "")


def stack_tag(pins: Mapping[str, Any], stack: str = "gpu") -> str:
    """The version part of an image tag: `verl0.9.1-vllm0.24.0-torch2.11.0-cu130[-cpu]`."""
    if stack not in STACKS:
        raise ValueError(f"stack must be one of {', '.join(STACKS)}, got {stack!r}")
    g = pins["gpu"]
    tag = f"verl{g['verl']}-vllm{g['vllm']}-torch{g['torch']}-{cuda_tag(str(g['cuda']))}"
    return tag + ("-cpu" if stack == "cpu" else "")


def image_ref(name: str, pins: Mapping[str, Any], stack: str = "gpu") -> str:
    """`verl-recipes/<name>:<stack tag>`; the deepspeed image also carries DeepSpeed's version."""
    tag = stack_tag(pins, stack)
    if name == "deepspeed":
        tag = f"ds{pins['gpu']['deepspeed']}-{tag}"
    return f"{IMAGE_REPO}/{name}:{tag}"


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    package: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.package}: {self.message}"


def _pin(pins: Mapping[str, Any], arg: str) -> str:
    table, key = VERSION_ARGS[arg]
    return str(pins[table][key])


# ---------------------------------------------------------------------------------------------
# Build arguments (run inside the image build, standard library only)


def check_build_args(
    values: Mapping[str, str], stack: str, pins: Mapping[str, Any], python: tuple[int, int]
) -> list[str]:
    """Problems with the build arguments of one image build, each one line naming the argument."""
    errors: list[str] = []
    if stack not in STACKS:
        errors.append(f"STACK={stack}: must be one of {', '.join(STACKS)}")
    for name, value in values.items():
        if name not in VERSION_ARGS:
            errors.append(f"{name}={value}: not a version argument this project knows ({', '.join(VERSION_ARGS)})")
            continue
        want = _pin(pins, name)
        if value != want:
            table, key = VERSION_ARGS[name]
            errors.append(
                f"{name}={value}: images/versions.toml [{table}] {key} = {want!r}; the lock and the pins "
                f"hold only that version (change versions.toml, run `nox -s lock`, then build)"
            )
    have = f"{python[0]}.{python[1]}"
    py = pins["python"]
    if stack == "gpu" and have != str(py["gpu"]):
        errors.append(
            f"STACK=gpu: the base image has Python {have}, the GPU lock is for Python {py['gpu']} "
            f"(images/versions.toml [python] gpu); use BASE_IMAGE={gpu_base_image(pins)}"
        )
    elif stack == "cpu" and not (_vt(str(py["min"])) <= python < _vt(str(py["max_exclusive"]))):
        errors.append(f"STACK=cpu: the base image has Python {have}; verl needs >={py['min']},<{py['max_exclusive']}")
    return errors


def _vt(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:2])


# ---------------------------------------------------------------------------------------------
# Dockerfiles

_ARG_RE = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$")


def dockerfile_args(path: Path) -> list[tuple[int, str, str | None]]:
    """`(line, name, default)` of each `ARG` of a Dockerfile (default None when it has none)."""
    out: list[tuple[int, str, str | None]] = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = _ARG_RE.match(line)
        if m:
            default = m.group(2)
            if default is not None and len(default) >= 2 and default[0] == default[-1] and default[0] in "\"'":
                default = default[1:-1]
            out.append((i, m.group(1), default))
    return out


def expected_base_images(path: Path, root: Path, pins: Mapping[str, Any]) -> set[str]:
    """The BASE_IMAGE defaults a Dockerfile may have, by where it lives."""
    rel = path.relative_to(root).as_posix()
    if rel == "images/base/Dockerfile":
        return {gpu_base_image(pins)}
    if rel == "images/deepspeed/Dockerfile":
        return {image_ref("base", pins)}
    return {image_ref("base", pins), image_ref("deepspeed", pins)}


def check_dockerfile(path: Path, root: Path, pins: Mapping[str, Any]) -> list[Problem]:
    """Every default of a version ARG must equal its pin; an ARG redeclared in a stage without a
    default (it inherits the global one before the first FROM) is fine when some line gives one."""
    rel = path.relative_to(root).as_posix()
    problems: list[Problem] = []
    args = dockerfile_args(path)
    for line, name, default in args:
        if name == "BASE_IMAGE":
            allowed = expected_base_images(path, root, pins)
            if default is not None and default not in allowed:
                problems.append(
                    Problem(
                        rel,
                        line,
                        "BASE_IMAGE",
                        f"default {default}, the pins name {' or '.join(sorted(allowed))}",
                    )
                )
            continue
        if name == "PROJECT_VERSION":
            project = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {})
            want = str(project.get("version"))
            if default is not None and default != want:
                problems.append(Problem(rel, line, "verl-recipes", f"ARG {name}={default}, pyproject.toml says {want}"))
            continue
        if not name.endswith("_VERSION"):
            continue
        if name not in VERSION_ARGS:
            problems.append(Problem(rel, line, name, "unknown version argument; map it in pins_check.VERSION_ARGS"))
            continue
        table, key = VERSION_ARGS[name]
        want = _pin(pins, name)
        if default is not None and default != want:
            problems.append(Problem(rel, line, key, f"ARG {name}={default}, versions.toml [{table}] says {want}"))
    for name in sorted({n for _, n, _ in args if n in VERSION_ARGS or n == "BASE_IMAGE"}):
        if all(d is None for _, n, d in args if n == name):
            first = next(i for i, n, _ in args if n == name)
            key = VERSION_ARGS[name][1] if name in VERSION_ARGS else name
            problems.append(Problem(rel, first, key, f"ARG {name} has no default anywhere in the file"))
    return problems


def dockerfiles(root: Path) -> list[Path]:
    return sorted([*root.glob("images/*/Dockerfile"), *root.glob("recipes/*/Dockerfile")])


# ---------------------------------------------------------------------------------------------
# pyproject.toml


def check_pyproject(path: Path, pins: Mapping[str, Any], rel: str = "pyproject.toml") -> list[Problem]:
    from packaging.requirements import Requirement  # dev dependency: tests and nox only

    data = tomllib.loads(path.read_text())
    lines = path.read_text().splitlines()
    gpu = {canonical(k): str(v) for k, v in pins["gpu"].items()}
    project = data.get("project", {})
    reqs: list[str] = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    problems: list[Problem] = []
    seen: set[str] = set()
    for text in reqs:
        req = Requirement(text)
        name = canonical(req.name)
        if name not in gpu or name == "verl-recipes":
            continue
        seen.add(name)
        line = next((i for i, s in enumerate(lines, 1) if f'"{text}"' in s), 0)
        want = gpu[name]
        if name in EXACT and str(req.specifier) != f"=={want}":
            problems.append(Problem(rel, line, name, f"requirement {text!r} must be '{req.name}=={want}'"))
        elif not req.specifier.contains(want, prereleases=True):
            problems.append(Problem(rel, line, name, f"requirement {text!r} does not admit the pin {want}"))
    for name in EXACT:
        if name not in seen:
            problems.append(Problem(rel, 0, name, f"no requirement on {name}; pin it as {name}=={gpu[name]}"))
    return problems


# ---------------------------------------------------------------------------------------------
# Lock files (images/lock/*.txt, read by verl_recipes.stack.lock)


def check_lock(path: Path, root: Path, pins: Mapping[str, Any]) -> list[Problem]:
    rel = path.relative_to(root).as_posix()
    locked = {name: (pin.line, pin.version) for name, pin in parse_lock_text(path.read_text()).items()}
    gpu = {canonical(k): str(v) for k, v in pins["gpu"].items() if k != "cuda"}
    problems: list[Problem] = []
    for name, want in gpu.items():
        if name not in locked:
            continue
        line, have = locked[name]
        public, _, local = have.partition("+")
        if public != want:
            problems.append(Problem(rel, line, name, f"locked {have}, versions.toml says {want}"))
        if name == "torch" and local and local != cuda_tag(str(pins["gpu"]["cuda"])):
            problems.append(
                Problem(
                    rel,
                    line,
                    "cuda",
                    f"torch {have} is built for {local}, pins say CUDA {pins['gpu']['cuda']}",
                )
            )
    cuda = str(pins["gpu"]["cuda"])
    for name, (line, have) in locked.items():
        m = re.fullmatch(r"nvidia-cuda-runtime(-cu(\d+))?", name)
        if m and not (m.group(2) in (None, cuda.split(".")[0]) and have.startswith(cuda + ".")):
            problems.append(Problem(rel, line, "cuda", f"locks {name}=={have}, versions.toml pins CUDA {cuda}"))
    if path.name.startswith("gpu-"):
        for name in ("verl", "vllm", "torch"):
            if name not in locked:
                problems.append(Problem(rel, 0, name, f"not in the GPU lock; versions.toml pins {gpu[name]}"))
    return problems


# ---------------------------------------------------------------------------------------------
# verify's expectations


def check_verify_source(path: Path, root: Path, pins: Mapping[str, Any]) -> list[Problem]:
    """`verify` must take its versions from versions.toml: no version literal of a pinned package
    (as `"pkg": "1.2.3"`, `pkg==1.2.3` or `PKG_VERSION = "1.2.3"`) that differs from the pin."""
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    gpu = {canonical(k): str(v) for k, v in pins["gpu"].items()}
    problems: list[Problem] = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        pairs: list[tuple[str, Any, int]] = []
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Constant):
                    pairs.append((k.value, v.value, v.lineno))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id.upper().endswith("_VERSION"):
                    pairs.append((t.id.upper().removesuffix("_VERSION"), node.value.value, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)
        ):
            key_node, val_node = node.args
            assert isinstance(key_node, ast.Constant) and isinstance(val_node, ast.Constant)
            pairs.append((str(key_node.value), val_node.value, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][^\s,;]*)", node.value)
            if m:
                pairs.append((m.group(1), m.group(2), node.lineno))
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            want_driver = str(pins["driver"]["min_cuda13"])
            for t in node.targets:
                if isinstance(t, ast.Name) and "CUDA13_DRIVER" in t.id.upper() and node.value.value != want_driver:
                    problems.append(
                        Problem(
                            rel,
                            node.lineno,
                            "driver",
                            f"{t.id} = {node.value.value!r}, versions.toml says {want_driver!r}",
                        )
                    )
        for key, value, line in pairs:
            name = canonical(str(key))
            if (
                name in gpu
                and isinstance(value, str)
                and re.fullmatch(r"[0-9][0-9A-Za-z.+]*", value)
                and value != gpu[name]
            ):
                problems.append(Problem(rel, line, name, f"verify expects {value}, versions.toml says {gpu[name]}"))
    return problems


# ---------------------------------------------------------------------------------------------


def check_repo(root: Path) -> list[Problem]:
    """All pin problems of a checkout (empty list = consistent)."""
    pins = load_pins(root / "images" / "versions.toml")
    problems: list[Problem] = []
    for df in dockerfiles(root):
        problems += check_dockerfile(df, root, pins)
    problems += check_pyproject(root / "pyproject.toml", pins)
    for lock in sorted((root / "images" / "lock").glob("*.txt")):
        problems += check_lock(lock, root, pins)
    verify = root / "common" / "verl_recipes" / "stack" / "verify.py"
    if verify.is_file():
        problems += check_verify_source(verify, root, pins)
    return problems


def docker_run_line(recipe: Recipe, pins: Mapping[str, Any] | None = None, command: str | None = None) -> str:
    """The `docker run` command for a recipe's GPU image, with a comment line per flag.

    --gpus all: the NVIDIA container toolkit maps the host's GPUs and driver into the container (the
    image carries CUDA's user-space libraries in torch's wheels, not the driver).
    --ipc=host: Ray's object store and NCCL/PyTorch's CUDA IPC use shared memory; Docker's private
    /dev/shm is 64 MB. Without --ipc=host use --shm-size=32g (or more) instead.
    """
    pins = pins or load_pins()
    base = "deepspeed" if "deepspeed" in recipe.id or recipe.backend == "deepspeed" else None
    image = image_ref(recipe.id, pins)
    cmd = command or f"train {recipe.id}"
    lines = [
        f"# {recipe.id}: {recipe.gpus.count} GPU(s) on {recipe.gpus.nodes} node(s); image FROM "
        f"{image_ref(base or 'base', pins)}",
        "#   --gpus all     the NVIDIA container toolkit maps the host's GPUs and driver "
        f"(>= {pins['driver']['min_cuda13']} for CUDA {pins['gpu']['cuda']}) into the container",
        "#   --ipc=host     Ray's object store and NCCL/CUDA IPC need shared memory; Docker's own",
        "#                  /dev/shm is 64 MB. Where --ipc=host is not allowed, use --shm-size=32g instead",
        "#   --ulimit       NCCL and pinned host memory want unlimited locked memory; Ray opens a",
        "#                  socket per worker (verify warns below 65536 open files)",
    ]
    flags = ["--rm", "--gpus all", "--ipc=host", "--ulimit memlock=-1", "--ulimit nofile=1048576:1048576"]
    if recipe.gpus.nodes > 1:
        lines.append("#   --network host Ray and NCCL talk between nodes; one container per node (launch.sh)")
        flags.append("--network host")
    lines.append("#   -v runs        results land in ./runs (writable by uid 1000, the image's user `verl`)")
    flags.append('-v "$PWD/runs:/home/verl/runs"')
    body = " \\\n  ".join(["docker run " + " ".join(flags[:3]), " ".join(flags[3:]), f"{image} {cmd}"])
    return "\n".join([*lines, body])


def recipe_base(dockerfile: Path, pins: Mapping[str, Any]) -> str:
    """`base` or `deepspeed`: the project image a recipe's Dockerfile builds FROM (its BASE_IMAGE)."""
    defaults = [d for _, n, d in dockerfile_args(dockerfile) if n == "BASE_IMAGE" and d]
    if defaults and defaults[0] == image_ref("deepspeed", pins):
        return "deepspeed"
    return "base"


def build_info(
    versions: Path, stack: str, pyproject: Path | None = None, recipe_dockerfile: Path | None = None
) -> dict[str, str]:
    """What images/build.sh needs, from versions.toml (and pyproject.toml): build args and tags."""
    pins = load_pins(versions)
    info = {a: _pin(pins, a) for a in ("VERL_VERSION", "VLLM_VERSION", "TORCH_VERSION", "CUDA_VERSION")}
    info["DEEPSPEED_VERSION"] = _pin(pins, "DEEPSPEED_VERSION")
    info["BASE_IMAGE"] = gpu_base_image(pins) if stack == "gpu" else CPU_BASE_IMAGE
    info["CPU_BASE_IMAGE"] = CPU_BASE_IMAGE
    info["BASE_REF"] = image_ref("base", pins, stack)
    info["DEEPSPEED_REF"] = image_ref("deepspeed", pins, stack)
    info["TAG"] = stack_tag(pins, stack)
    if pyproject is not None:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        urls = {k.lower(): v for k, v in project.get("urls", {}).items()}
        info["PROJECT_VERSION"] = str(project.get("version", "0.0.0"))
        info["SOURCE"] = next((urls[k] for k in ("source", "repository", "homepage") if k in urls), "")
    if recipe_dockerfile is not None:
        info["RECIPE_BASE"] = recipe_base(recipe_dockerfile, pins)
    for k, v in info.items():
        if not re.fullmatch(r"[A-Za-z0-9._:/@+-]*", v):
            raise ValueError(f"build_info: {k}={v!r} has characters a tag or build argument cannot carry")
    return info


def split_lock(text: str, take: set[str]) -> tuple[str, str]:
    """Split a hashed lock into (entries of the packages in `take`, everything else).

    An entry is a `name==version` line with the `--hash` and `# via` lines under it; header comments
    go to both parts. The GPU base image installs the rest; DeepSpeed (an sdist whose setup.py
    imports torch) is installed after torch, in the DeepSpeed image.
    """
    taken: list[str] = []
    rest: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        name = entry_name(line)
        if name:
            current = taken if name in take else rest
        if current is None:
            taken.append(line)
            rest.append(line)
        else:
            current.append(line)
    return "".join(taken), "".join(rest)


def light_requirements(pyproject_text: str, names: Sequence[str]) -> list[str]:
    """pyproject.toml's own requirement lines for `names`: the light (CPU) image installs only
    these, at the versions the project asks for. A name the project does not list is an error."""
    deps = tomllib.loads(pyproject_text)["project"]["dependencies"]
    by_name: dict[str, list[str]] = {}
    for d in deps:
        by_name.setdefault(canonical(re.split(r"[\s<>=!~;\[(]", d, maxsplit=1)[0]), []).append(d)
    missing = [n for n in names if canonical(n) not in by_name]
    if missing:
        raise ValueError(f"not in pyproject.toml [project] dependencies: {', '.join(missing)}")
    return [d for n in names for d in by_name[canonical(n)]]


def _parse_kv(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"pins_check: expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_recipes.stack.pins_check", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_args = sub.add_parser("build-args", help="check an image build's arguments (used inside the builds)")
    p_args.add_argument("--versions", type=Path, required=True, help="the versions.toml copied into the build")
    p_args.add_argument("--stack", required=True)
    p_args.add_argument("values", nargs="*", metavar="NAME=VALUE")
    p_check = sub.add_parser("check", help="check a checkout's Dockerfiles, pyproject, lock files and verify")
    p_check.add_argument("--root", type=Path, default=None)
    p_info = sub.add_parser("build-info", help="print the build arguments and tags as NAME=VALUE lines")
    p_info.add_argument("--versions", type=Path, required=True)
    p_info.add_argument("--stack", choices=STACKS, required=True)
    p_info.add_argument("--pyproject", type=Path, help="also print PROJECT_VERSION and SOURCE")
    p_info.add_argument("--recipe-dockerfile", type=Path, help="also print RECIPE_BASE (base or deepspeed)")
    p_split = sub.add_parser("split-lock", help="split a lock file by package (used inside the builds)")
    p_split.add_argument("lock", type=Path)
    p_split.add_argument("--take", action="append", required=True, help="package to move to --taken")
    p_split.add_argument("--taken", type=Path, required=True)
    p_split.add_argument("--rest", type=Path, required=True)
    p_light = sub.add_parser("light-requirements", help="print pyproject's requirement lines for NAMEs")
    p_light.add_argument("--pyproject", type=Path, required=True)
    p_light.add_argument("names", nargs="+")
    p_run = sub.add_parser("docker-run", help="print the docker run line of a recipe's image")
    p_run.add_argument("recipe")
    args = parser.parse_args(argv)

    if args.cmd == "build-args":
        pins = load_pins(args.versions)
        errors = check_build_args(_parse_kv(args.values), args.stack, pins, sys.version_info[:2])
        for e in errors:
            print(f"build argument rejected: {e}", file=sys.stderr)
        if not errors:
            print(f"build arguments agree with {args.versions} (stack {args.stack})")
        return 1 if errors else 0
    if args.cmd == "check":
        from verl_recipes.paths import repo_root

        root = (args.root or repo_root()).resolve()
        problems = check_repo(root)
        for p in problems:
            print(p, file=sys.stderr)
        print(f"pins_check: {len(problems)} problem(s) against {root / 'images' / 'versions.toml'}")
        return 1 if problems else 0
    if args.cmd == "build-info":
        for k, v in build_info(args.versions, args.stack, args.pyproject, args.recipe_dockerfile).items():
            print(f"{k}={v}")
        return 0
    if args.cmd == "light-requirements":
        try:
            print("\n".join(light_requirements(args.pyproject.read_text(), args.names)))
        except ValueError as e:
            print(f"light-requirements: {e}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "split-lock":
        want = {canonical(n) for n in args.take}
        taken, rest = split_lock(args.lock.read_text(), want)
        missing = want - set(parse_lock_text(taken))
        if missing:
            print(f"split-lock: {args.lock} has no entry for {', '.join(sorted(missing))}", file=sys.stderr)
            return 1
        args.taken.write_text(taken)
        args.rest.write_text(rest)
        return 0
    from verl_recipes.recipe.metadata import get_recipe

    print(docker_run_line(get_recipe(args.recipe)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
