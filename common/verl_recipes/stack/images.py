"""The project's images: their names and tags, what a build reads, and each recipe's `docker run`.

`python -m verl_recipes.stack.images` is what the image builds and images/build.sh call:
`build-info` prints the build arguments and tags from images/versions.toml (and pyproject.toml),
`split-lock` and `light-requirements` pick what one build stage installs, `docker-run` prints a
recipe's `docker run` line for its README. The builds run it in their builder stage before
anything is installed, so it uses the standard library only; `verl_recipes.stack.pins_check`
checks that the Dockerfiles agree with the same pins.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_recipes import RecipeError, one_line_errors
from verl_recipes.stack.lock import canonical, entry_name, parse_lock_text
from verl_recipes.stack.pins import load_pins, pin_of_arg

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from verl_recipes.recipe.metadata import Recipe

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
    info = {a: pin_of_arg(pins, a) for a in ("VERL_VERSION", "VLLM_VERSION", "TORCH_VERSION", "CUDA_VERSION")}
    info["DEEPSPEED_VERSION"] = pin_of_arg(pins, "DEEPSPEED_VERSION")
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
            raise RecipeError(f"build_info: {k}={v!r} has characters a tag or build argument cannot carry")
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
        raise RecipeError(f"not in pyproject.toml [project] dependencies: {', '.join(missing)}")
    return [d for n in names for d in by_name[canonical(n)]]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise RecipeError(f"{path}: cannot read it ({e.strerror})") from None


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_recipes.stack.images", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
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

    if args.cmd == "build-info":
        for k, v in build_info(args.versions, args.stack, args.pyproject, args.recipe_dockerfile).items():
            print(f"{k}={v}")
        return 0
    if args.cmd == "light-requirements":
        print("\n".join(light_requirements(_read(args.pyproject), args.names)))
        return 0
    if args.cmd == "split-lock":
        want = {canonical(n) for n in args.take}
        taken, rest = split_lock(_read(args.lock), want)
        missing = want - set(parse_lock_text(taken))
        if missing:
            raise RecipeError(f"split-lock: {args.lock} has no entry for {', '.join(sorted(missing))}")
        args.taken.write_text(taken)
        args.rest.write_text(rest)
        return 0
    from verl_recipes.recipe.metadata import get_recipe

    print(docker_run_line(get_recipe(args.recipe)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
