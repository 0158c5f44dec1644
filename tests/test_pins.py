"""Pin consistency: Dockerfiles, pyproject.toml, the lock and verify agree with images/versions.toml.

CPU only, no docker. Each drift test edits a copy of the checkout and asserts that the check fails
naming the file and the package, so the check itself is shown to be able to fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from verl_recipes import RecipeError
from verl_recipes.recipe.metadata import discover
from verl_recipes.stack import images, pins_check
from verl_recipes.stack.lock import parse_lock_text
from verl_recipes.stack.pins import load_pins


@pytest.fixture
def pins(root: Path) -> dict:
    return load_pins(root / "images" / "versions.toml")


@pytest.fixture
def copy(root: Path, tmp_path: Path) -> Path:
    """The parts of the checkout the check reads, copied so a test can break them."""
    dst = tmp_path / "repo"
    (dst / "images").mkdir(parents=True)
    shutil.copy2(root / "pyproject.toml", dst / "pyproject.toml")
    shutil.copy2(root / "images" / "versions.toml", dst / "images" / "versions.toml")
    for sub in ("base", "deepspeed", "lock"):
        if (root / "images" / sub).is_dir():
            shutil.copytree(root / "images" / sub, dst / "images" / sub)
    for df in root.glob("recipes/*/Dockerfile"):
        (dst / df.parent.relative_to(root)).mkdir(parents=True)
        shutil.copy2(df, dst / df.relative_to(root))
    (dst / "common" / "verl_recipes" / "stack").mkdir(parents=True)
    verify = root / "common" / "verl_recipes" / "stack" / "verify.py"
    if verify.is_file():
        shutil.copy2(verify, dst / "common" / "verl_recipes" / "stack" / "verify.py")
    return dst


def _edit(path: Path, old: str, new: str) -> int:
    """Replace the first `old` in `path` with `new`; return its 1-based line number."""
    text = path.read_text()
    assert old in text, f"{path} has no {old!r}"
    line = text[: text.index(old)].count("\n") + 1
    path.write_text(text.replace(old, new, 1))
    return line


def _strs(problems: list[pins_check.Problem]) -> list[str]:
    return [str(p) for p in problems]


def test_checkout_is_consistent(root: Path) -> None:
    assert _strs(pins_check.check_repo(root)) == []


def test_the_copy_is_consistent_too(copy: Path) -> None:
    assert _strs(pins_check.check_repo(copy)) == []


def test_every_recipe_has_a_dockerfile_that_copies_only_itself(root: Path, pins: dict) -> None:
    for rid, recipe in discover(root / "recipes").items():
        df = recipe.dir / "Dockerfile"
        assert df.is_file(), f"recipes/{rid} has no Dockerfile"
        text = df.read_text()
        copies = re.findall(r"^COPY\s+(.*)$", text, flags=re.M)
        assert copies == [f"recipes/{rid}/ /opt/verl-recipes/recipes/{rid}/"], f"{df}: {copies}"
        assert f'verl-recipes.recipe="{rid}"' in text


def test_base_dockerfile_version_drift_names_file_and_package(copy: Path) -> None:
    line = _edit(copy / "images" / "base" / "Dockerfile", "ARG VERL_VERSION=0.9.1", "ARG VERL_VERSION=0.9.0")
    problems = _strs(pins_check.check_repo(copy))
    assert problems == [f"images/base/Dockerfile:{line}: verl: ARG VERL_VERSION=0.9.0, versions.toml [gpu] says 0.9.1"]


@pytest.mark.parametrize(
    ("rel", "old", "new", "package"),
    [
        ("images/base/Dockerfile", "ARG TORCH_VERSION=2.11.0", "ARG TORCH_VERSION=2.10.0", "torch"),
        ("images/base/Dockerfile", "ARG CUDA_VERSION=13.0", "ARG CUDA_VERSION=12.8", "cuda"),
        ("images/base/Dockerfile", "ARG VLLM_VERSION=0.24.0", "ARG VLLM_VERSION=0.23.0", "vllm"),
        (
            "images/deepspeed/Dockerfile",
            "ARG DEEPSPEED_VERSION=0.19.8",
            "ARG DEEPSPEED_VERSION=0.18.0",
            "deepspeed",
        ),
        ("images/base/Dockerfile", "BASE_IMAGE=python:3.12-", "BASE_IMAGE=python:3.11-", "BASE_IMAGE"),
        ("recipes/7b-lora/Dockerfile", "torch2.11.0", "torch2.10.0", "BASE_IMAGE"),
        ("images/base/Dockerfile", "ARG PROJECT_VERSION=", "ARG PROJECT_VERSION=9.9.9", "verl-recipes"),
        ("images/base/Dockerfile", "ARG STACK=gpu", "ARG STACK=gpu\nARG NCCL_VERSION=2.28.9", "NCCL_VERSION"),
    ],
)
def test_dockerfile_drift_names_file_and_package(copy: Path, rel: str, old: str, new: str, package: str) -> None:
    _edit(copy / rel, old, new)
    problems = pins_check.check_repo(copy)
    assert problems, f"editing {rel} ({old} -> {new}) went unnoticed"
    assert all(p.file == rel for p in problems), _strs(problems)
    assert package in {p.package for p in problems}, _strs(problems)


def test_a_version_arg_without_any_default_is_a_problem(copy: Path) -> None:
    _edit(copy / "images" / "base" / "Dockerfile", "ARG VLLM_VERSION=0.24.0", "ARG VLLM_VERSION")
    assert any("has no default" in s for s in _strs(pins_check.check_repo(copy)))


@pytest.mark.parametrize(
    ("old", "new", "package"),
    [
        ('"verl==0.9.1"', '"verl==0.9.0"', "verl"),
        ('"vllm==0.24.0"', '"vllm>=0.24.0"', "vllm"),  # the key packages must be exact
        ('"torch==2.11.0"', '"torch==2.10.0"', "torch"),
        ('"ray[default]==2.60.0"', '"ray[default]==2.59.0"', "ray"),
        ('"deepspeed==0.19.8"', '"deepspeed==0.19.7"', "deepspeed"),
        ('"transformers>=5.5.3,<5.11,!=5.6.0"', '"transformers>=5.5.3,<5.10"', "transformers"),
        ('"hydra-core==1.3.8"', '"hydra-core==1.3.2"', "hydra-core"),
    ],
)
def test_pyproject_drift_names_file_and_package(copy: Path, old: str, new: str, package: str) -> None:
    line = _edit(copy / "pyproject.toml", old, new)
    problems = pins_check.check_repo(copy)
    assert [(p.file, p.line, p.package) for p in problems] == [("pyproject.toml", line, package)], _strs(problems)


def test_pyproject_without_a_key_pin_is_a_problem(copy: Path) -> None:
    _edit(copy / "pyproject.toml", '"vllm==0.24.0",', "")
    assert [(p.file, p.package) for p in pins_check.check_repo(copy)] == [("pyproject.toml", "vllm")]


def _lock(copy: Path) -> Path:
    lock = copy / "images" / "lock" / "gpu-py312.txt"
    if not lock.is_file():
        pytest.skip("no images/lock/gpu-py312.txt yet (nox -s lock)")
    return lock


@pytest.mark.parametrize(
    ("old", "new", "package"),
    [
        ("\ntorch==2.11.0 ", "\ntorch==2.10.0 ", "torch"),
        ("\nvllm==0.24.0 ", "\nvllm==0.24.1 ", "vllm"),
        ("\ntransformers==5.10.4 ", "\ntransformers==5.10.3 ", "transformers"),
        ("\ntorch==2.11.0 ", "\ntorch==2.11.0+cu128 ", "cuda"),
        ("\nnvidia-cuda-runtime==13.0.", "\nnvidia-cuda-runtime==12.8.", "cuda"),
    ],
)
def test_lock_drift_names_file_and_package(copy: Path, old: str, new: str, package: str) -> None:
    lock = _lock(copy)
    line = _edit(lock, old, new) + 1  # `old` starts with the newline before the entry
    problems = pins_check.check_repo(copy)
    assert [(p.file, p.line, p.package) for p in problems] == [("images/lock/gpu-py312.txt", line, package)], _strs(
        problems
    )


def test_lock_without_vllm_is_a_problem(copy: Path) -> None:
    lock = _lock(copy)
    lock.write_text(lock.read_text().replace("\nvllm==", "\nnot-vllm=="))
    assert ("images/lock/gpu-py312.txt", "vllm") in {(p.file, p.package) for p in pins_check.check_repo(copy)}


@pytest.mark.parametrize(
    "source",
    [
        '_PINS = {"vllm": "0.23.0"}\n',
        'REQ = "verl==0.9.0"\n',
        'TORCH_VERSION = "2.10.0"\n',
        'def f(p):\n    return p.get("torch", "2.10.0")\n',
        '_MIN_CUDA13_DRIVER = "570.00.00"\n',
    ],
)
def test_verify_expectations_drift(copy: Path, source: str) -> None:
    verify = copy / "common" / "verl_recipes" / "stack" / "verify.py"
    verify.write_text(source)
    problems = pins_check.check_repo(copy)
    assert [p.file for p in problems] == ["common/verl_recipes/stack/verify.py"], _strs(problems)


def test_verify_source_that_agrees_passes(copy: Path, pins: dict) -> None:
    verify = copy / "common" / "verl_recipes" / "stack" / "verify.py"
    verify.write_text(f'_PINS = {{"vllm": "{pins["gpu"]["vllm"]}"}}\nX = "torch=={pins["gpu"]["torch"]}"\n')
    assert _strs(pins_check.check_repo(copy)) == []


def test_build_args_that_the_pins_hold_pass(pins: dict) -> None:
    args = {
        "VERL_VERSION": "0.9.1",
        "VLLM_VERSION": "0.24.0",
        "TORCH_VERSION": "2.11.0",
        "CUDA_VERSION": "13.0",
    }
    assert pins_check.check_build_args(args, "cpu", pins, (3, 11)) == []
    assert pins_check.check_build_args(args, "gpu", pins, (3, 12)) == []


def test_build_arg_with_another_version_is_refused_with_the_reason(pins: dict) -> None:
    errors = pins_check.check_build_args({"VERL_VERSION": "0.9.0"}, "cpu", pins, (3, 11))
    assert len(errors) == 1
    assert errors[0].startswith("VERL_VERSION=0.9.0: images/versions.toml [gpu] verl = '0.9.1'")


def test_gpu_stack_on_the_wrong_python_is_refused(pins: dict) -> None:
    errors = pins_check.check_build_args({}, "gpu", pins, (3, 11))
    assert errors and "Python 3.11" in errors[0] and "python:3.12-slim-bookworm" in errors[0]
    assert pins_check.check_build_args({}, "cpu", pins, (3, 13))  # verl refuses 3.13


def test_unknown_build_arg_and_stack_are_refused(pins: dict) -> None:
    assert pins_check.check_build_args({"FOO_VERSION": "1"}, "cpu", pins, (3, 11))
    assert pins_check.check_build_args({}, "tpu", pins, (3, 11))


def test_build_args_cli_exit_code(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    versions = str(root / "images" / "versions.toml")
    stack = ["build-args", "--versions", versions, "--stack", "cpu"]
    assert pins_check.main([*stack, "VERL_VERSION=0.9.1"]) == 0
    assert pins_check.main([*stack, "VERL_VERSION=0.9.0"]) == 1
    assert "build argument rejected: VERL_VERSION=0.9.0" in capsys.readouterr().err


def test_tags_carry_the_pins(pins: dict) -> None:
    g = pins["gpu"]
    cu = "cu" + g["cuda"].replace(".", "")
    assert images.image_ref("base", pins) == f"verl-recipes/base:verl{g['verl']}-vllm{g['vllm']}-torch{g['torch']}-{cu}"
    assert images.image_ref("7b-lora", pins, "cpu").endswith(f"-{cu}-cpu")
    assert images.image_ref("deepspeed", pins).startswith(f"verl-recipes/deepspeed:ds{g['deepspeed']}-verl")


def test_build_info_is_what_build_sh_reads(root: Path, pins: dict) -> None:
    info = images.build_info(root / "images" / "versions.toml", "cpu", root / "pyproject.toml")
    assert info["BASE_REF"] == images.image_ref("base", pins, "cpu")
    assert info["BASE_IMAGE"] == images.CPU_BASE_IMAGE
    assert info["VERL_VERSION"] == pins["gpu"]["verl"]
    assert info["PROJECT_VERSION"] == "0.1.0" or re.fullmatch(r"\d+\.\d+\.\d+.*", info["PROJECT_VERSION"])
    gpu = images.build_info(root / "images" / "versions.toml", "gpu")
    assert gpu["BASE_IMAGE"] == f"python:{pins['python']['gpu']}-slim-bookworm"


def test_split_lock_moves_whole_entries(root: Path) -> None:
    lock = root / "images" / "lock" / "gpu-py312.txt"
    if not lock.is_file():
        pytest.skip("no images/lock/gpu-py312.txt yet (nox -s lock)")
    taken, rest = images.split_lock(lock.read_text(), {"deepspeed"})
    t, r, whole = (parse_lock_text(x) for x in (taken, rest, lock.read_text()))
    assert set(t) == {"deepspeed"}
    assert "deepspeed" not in r and set(r) | set(t) == set(whole)
    assert taken.count("--hash=sha256:") + rest.count("--hash=sha256:") == lock.read_text().count("--hash=sha256:")


def test_light_requirements_come_from_pyproject(root: Path) -> None:
    text = (root / "pyproject.toml").read_text()
    lines = images.light_requirements(text, ["pydantic", "nvidia-ml-py"])
    assert lines and all(line.split(">")[0].split("=")[0] in ("pydantic", "nvidia-ml-py") for line in lines)
    with pytest.raises(RecipeError, match="not-a-dependency"):
        images.light_requirements(text, ["not-a-dependency"])


@pytest.mark.parametrize("rid", ["7b-lora", "70b-3d", "verl-vs-deepspeed"])
def test_docker_run_line(root: Path, pins: dict, rid: str) -> None:
    recipe = discover(root / "recipes")[rid]
    line = images.docker_run_line(recipe, pins)
    assert "--gpus all" in line and "--ipc=host" in line and "--shm-size=32g" in line
    assert images.image_ref(rid, pins) + f" train {rid}" in line
    assert ("--network host" in line) == (recipe.gpus.nodes > 1)
    assert pins["driver"]["min_cuda13"] in line


def test_images_readme_has_each_recipes_docker_run_line(root: Path, pins: dict) -> None:
    readme = (root / "images" / "README.md").read_text()
    for rid, recipe in discover(root / "recipes").items():
        line = images.docker_run_line(recipe, pins)
        command = line[line.index("docker run ") :]
        assert f"### {rid}" in readme and command in readme, f"images/README.md: no current docker run for {rid}"


@pytest.mark.parametrize(
    ("tool", "args", "says"),
    [
        ("pins_check", ["build-args", "--versions", "no-such.toml", "--stack", "cpu"], "no-such.toml: cannot read it"),
        ("pins_check", ["build-args", "--versions", "images/versions.toml", "--stack", "cpu", "VERL"], "NAME=VALUE"),
        ("images", ["light-requirements", "--pyproject", "pyproject.toml", "not-a-dep"], "not-a-dep"),
        ("images", ["split-lock", "no-such.lock", "--take", "x", "--taken", "a", "--rest", "b"], "no-such.lock"),
        ("mcore_api", ["pyproject.toml"], "pyproject.toml: not a folder or a .whl"),
        ("mcore_api", ["--provider-fields", "pyproject.toml", "x.whl"], "it is not overwritten"),
    ],
)
def test_the_image_builds_tools_refuse_bad_input_in_one_line(root: Path, tool: str, args: list[str], says: str) -> None:
    """The `python -m` tools of the image build, on a bare python3 as the builds run them: bad input
    is one `error: ...` line and exit 2, and nothing is written."""
    before = sorted(p.name for p in root.iterdir())
    r = subprocess.run(
        [sys.executable, "-S", "-m", f"verl_recipes.stack.{tool}", *args],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root / "common"), "PATH": os.environ["PATH"]},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert sorted(p.name for p in root.iterdir()) == before


def test_constraints_are_the_locks_versions_of_the_pinned_stack(root: Path) -> None:
    """images/lock/constraints.txt, which the nox venvs install with, is what the lock says: a pin
    changed in versions.toml and the lock without it (or by hand) fails here."""
    from verl_recipes.stack.lock import _NOT_PACKAGES, CONSTRAINTS, constraints_text, gpu_target, parse_lock
    from verl_recipes.stack.pins import gpu_pins

    lock = gpu_target(root).default_lock(root)
    names = [n for n in gpu_pins(root / "images" / "versions.toml") if n not in _NOT_PACKAGES]
    want = constraints_text(parse_lock(lock), names, lock.relative_to(root).as_posix())
    assert (root / CONSTRAINTS).read_text() == want, "run `nox -s lock` (or write_constraints)"
    assert "peft==0.18.1" in want.splitlines() and not any(x.startswith("torch==") for x in want.splitlines())


def test_installed_stack_has_the_pinned_versions(root: Path) -> None:
    """The environment the tests run in (`nox -s tests`, built with the constraints) holds the
    pinned versions of the stack it has: a drift (peft 0.21.2 against 0.18.1) is a failure here, not
    a warning in every `verify`."""
    import importlib.metadata as md

    from verl_recipes.stack.lock import CONSTRAINTS

    drift = []
    for line in (root / CONSTRAINTS).read_text().splitlines():
        if line.startswith("#") or "==" not in line:
            continue
        name, version = line.split("==", 1)
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            continue
        if have.split("+", 1)[0] != version:
            drift.append(f"{name} {have} (pinned {version})")
    assert not drift, f"installed against the pins: {', '.join(drift)}; rebuild with `nox -s tests`"


def test_pip_resolves_the_pinned_peft_with_the_constraints(root: Path, pypi: None) -> None:
    """What the nox sessions install: verl leaves peft open, and without the constraints pip takes
    the newest; with them it takes the pin."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
         "--disable-pip-version-check", "-c", str(root / "images" / "lock" / "constraints.txt"), "peft"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Would install peft-0.18.1" in r.stdout, r.stdout
