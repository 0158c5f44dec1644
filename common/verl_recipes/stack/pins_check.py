"""Pin consistency: every place that names a version must agree with `images/versions.toml`.

Places checked by `check_repo()` (and `python -m verl_recipes.stack.pins_check check`):
- the `ARG NAME=default` version defaults of every Dockerfile (images/*/Dockerfile, recipes/*/Dockerfile),
  including the `BASE_IMAGE` default, which must be the image tag that the pins name;
- pyproject.toml: each requirement on a pinned package must admit the pin, and the stack's key
  packages (verl, vllm, torch, ray, deepspeed) must be pinned exactly (`==`);
- the lock files under images/lock/ (when present): the locked version of each pinned package;
- `verl-recipes verify`: the versions it expects.

Each problem reads `file:line: package: found X, versions.toml says Y`.

The image builds call `python -m verl_recipes.stack.pins_check build-args ...` inside the builder stage,
so that a `--build-arg VERL_VERSION=0.9.0` fails the build with the reason; that path uses the
standard library only (the builder has not installed anything yet). The images' names, tags and
build inputs are `verl_recipes.stack.images`.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, one_line_errors
from verl_recipes.stack.images import STACKS, cuda_tag, dockerfile_args, gpu_base_image, image_ref
from verl_recipes.stack.lock import canonical, parse_lock_text
from verl_recipes.stack.pins import VERSION_ARGS, load_pins, pin_of_arg

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# pyproject requirements on these must be exact pins (`==`); others must only admit the pin.
EXACT = ("verl", "vllm", "torch", "ray", "deepspeed")


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    package: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.package}: {self.message}"


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
        want = pin_of_arg(pins, name)
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
        want = pin_of_arg(pins, name)
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


def _parse_kv(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise RecipeError(f"expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


@one_line_errors
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
    args = parser.parse_args(argv)

    if args.cmd == "build-args":
        pins = load_pins(args.versions)
        errors = check_build_args(_parse_kv(args.values), args.stack, pins, sys.version_info[:2])
        for e in errors:
            print(f"build argument rejected: {e}", file=sys.stderr)
        if not errors:
            print(f"build arguments agree with {args.versions} (stack {args.stack})")
        return 1 if errors else 0
    from verl_recipes.paths import repo_root

    root = (args.root or repo_root()).resolve()
    problems = check_repo(root)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"pins_check: {len(problems)} problem(s) against {root / 'images' / 'versions.toml'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
