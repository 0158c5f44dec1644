"""`verl-recipes verify` on this machine: real checks, real exit codes, with and without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from verl_recipes import has_gpu
from verl_recipes.stack import verify
from verl_recipes.stack.pins import load_pins

CLI = [sys.executable, "-m", "verl_recipes.cli", "verify"]


def _verify(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    r = subprocess.run([*CLI, "--json", *args], capture_output=True, text=True, timeout=300, env=env)
    out = json.loads(r.stdout)
    assert out["ok"] == (r.returncode == 0)
    assert r.returncode == (1 if any(c["status"] == "fail" for c in out["checks"]) else 0)
    return r.returncode, {c["name"]: c for c in out["checks"]}


@pytest.mark.skipif(has_gpu(), reason="checks the GPU-less path")
def test_gpu_recipe_fails_on_a_host_without_gpu() -> None:
    r = subprocess.run([*CLI, "--recipe", "7b-lora"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "FAIL  gpu             recipe 7b-lora trains on NVIDIA GPUs; this host has none" in r.stdout
    assert "fix: run on a host with NVIDIA GPUs (docker run --gpus all)" in r.stdout


@pytest.mark.skipif(has_gpu(), reason="checks the GPU-less path")
def test_without_recipe_a_missing_gpu_is_a_warning() -> None:
    _, checks = _verify()
    assert checks["gpu"]["status"] == "warn" and checks["driver"]["status"] == "warn"
    for name in (
        "python",
        "torch",
        "verl",
        "transformers",
        "shm",
        "ulimit-n",
        "host-ram",
        "disk",
        "flash-attn",
    ):
        assert name in checks
        assert checks[name]["status"] == "pass" or checks[name]["fix"], name  # every warn/fail says what to do
    assert checks["verl"]["status"] == "pass"  # /opt/dev has verl 0.9.1, the pin


def test_without_checkout_recipe_checks_are_skipped(tmp_path: Path) -> None:
    """Inside an image: no recipes/ and versions.toml; pins come from the package metadata."""
    env = {**os.environ, "VERL_RECIPES_ROOT": str(tmp_path)}
    _, checks = _verify("--recipe", "7b-lora", env=env)
    assert checks["pins"]["status"] == "warn" and "VERL_RECIPES_ROOT" in checks["pins"]["fix"]
    assert checks["recipe"]["status"] == "warn" and "checks skipped" in checks["recipe"]["detail"]
    if not has_gpu():
        assert checks["gpu"]["status"] == "warn"  # the recipe could not be read, so its need is unknown


def test_host_ram_is_a_fact_of_the_host_not_a_judgement_of_a_job() -> None:
    """`verify --recipe 7b-lora` reports MemTotal and what is available (psutil), and judges no run:
    the run's host RAM is judged once, by `train`'s pre-flight on the job it runs
    (tests/test_train.py), and verify takes no job options."""
    import psutil

    _, checks = _verify("--recipe", "7b-lora")
    ram = checks["host-ram"]
    total = psutil.virtual_memory().total / 2**30
    assert ram["status"] == "pass" and ram["detail"].startswith(f"{total:.1f} GiB total, ")
    assert ram["detail"].endswith(" GiB available") and "planner" not in ram["detail"]
    assert not {"gpu-count", "gpu-memory"} & set(checks)
    r = subprocess.run([*CLI, "--recipe", "7b-lora", "--variant", "24gib"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "unrecognized arguments: --variant 24gib" in r.stderr


def test_the_disk_wanted_follows_whether_the_run_writes_weights(tmp_path: Path) -> None:
    """70b-3d with weights wants about 3x its 138 GB of bf16 weights on disk; a rank rehearsal
    trains from a checkpoint without weights (`synth-model --no-weights`) and writes none, so
    only the floor applies: the same disk passes or warns by what the run will write."""
    import shutil

    from verl_recipes import GIB
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.stack.verify import DISK_FLOOR_GIB

    recipe = get_recipe("70b-3d")
    free = shutil.disk_usage(tmp_path).free / GIB
    full = verify.check_disk(recipe, tmp_path)
    bare = verify.check_disk(recipe, tmp_path, weights=False)
    assert full.status == ("warn" if free < recipe.model.params * 6 / GIB else "pass")
    assert "for the model and checkpoints" in full.detail or full.status == "pass"
    assert bare.status == ("warn" if free < DISK_FLOOR_GIB else "pass")
    if bare.status == "warn":
        assert "the run's logs, samples and caches" in bare.detail
    assert (full.status, bare.status) != ("pass", "warn")


def test_unknown_recipe_is_a_one_line_error() -> None:
    r = subprocess.run([*CLI, "--recipe", "7b-lroa"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: unknown recipe '7b-lroa' (did you mean '7b-lora'?)")


def test_fallback_pins_equal_versions_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = load_pins()
    assert full["driver"]["min_cuda13"] == verify._MIN_CUDA13_DRIVER
    monkeypatch.setenv("VERL_RECIPES_ROOT", str(tmp_path))  # no checkout there
    pins, why = verify._load_pins()
    assert why and pins.source == "verl-recipes package metadata"
    for name in ("torch", "vllm", "verl", "ray", "deepspeed"):
        assert pins.gpu[name] == full["gpu"][name], name


def test_verify_runs_without_torch(tmp_path: Path) -> None:
    """A Python that has the project's light dependencies but no torch and no NVML bindings."""
    site = Path(sysconfig.get_paths()["purelib"])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions.py",
                 "yaml", "psutil"):  # fmt: skip
        src = site / name
        if src.exists():
            (deps / name).symlink_to(src)
    common = Path(verify.__file__).resolve().parents[1]
    (next(venv.glob("lib/python3*/site-packages")) / "deps.pth").write_text(f"{deps}\n{common}\n")
    py = str(venv / "bin" / "python")
    probe = subprocess.run([py, "-c", "import torch"], capture_output=True, timeout=60)
    assert probe.returncode != 0  # the environment really lacks torch
    r = subprocess.run([py, "-m", "verl_recipes.cli", "verify", "--json"], capture_output=True, text=True,
                       timeout=120, cwd=Path(verify.__file__).resolve().parents[2])  # fmt: skip
    assert r.returncode == 1, r.stderr[-2000:]
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["torch"] == {
        "name": "torch",
        "status": "fail",
        "detail": "not installed",
        "fix": f"pip install torch=={load_pins()['gpu']['torch']} --index-url https://download.pytorch.org/whl/cu130",
    }
    assert checks["verl"]["status"] == "fail"  # not installed there either
    assert "NVML" in checks["driver"]["detail"]


@pytest.mark.gpu
def test_verify_on_a_gpu_host() -> None:
    if not has_gpu():
        pytest.skip("no NVIDIA GPU")
    _, checks = _verify("--recipe", "7b-lora")
    for name in ("torch", "driver", "gpu0", "nccl"):
        assert checks[name]["status"] == "pass", checks[name]
    if "nccl-allreduce" in checks:
        assert checks["nccl-allreduce"]["status"] == "pass", checks["nccl-allreduce"]
    print("\n" + "\n".join(f"{c['status']:4s} {n}: {c['detail']}" for n, c in checks.items()))


def _fake_dist(where: Path, name: str, version: str) -> None:
    """An installed-distribution record (what pip leaves in site-packages), enough for metadata."""
    d = where / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_megatron_recipe_checks_the_megatron_pins(tmp_path: Path) -> None:
    """70b-3d needs versions.toml [megatron] on top of the lock; 7b-lora does not. A Transformer
    Engine without its torch extension is its own failure: it breaks `import megatron.core`."""
    pins = load_pins()["megatron"]
    _, checks = _verify("--recipe", "70b-3d")
    for name in pins:
        assert name in checks, name
        assert checks[name]["status"] == "fail" and "--with megatron" in checks[name]["fix"]
    _, plain = _verify("--recipe", "7b-lora")
    assert not set(pins) & set(plain)
    # TE meta + cu13 present, the torch extension not: the half-installed failure
    for name in ("transformer-engine", "transformer-engine-cu13"):
        want = pins[name] if isinstance(pins[name], str) else pins[name]["version"]
        _fake_dist(tmp_path, name, want)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    _, half = _verify("--recipe", "70b-3d", env=env)
    assert half["transformer-engine-cu13"]["status"] == "pass"
    assert half["te-complete"]["status"] == "fail"
    assert (
        "half installed" in half["te-complete"]["detail"]
        and "transformer-engine-torch" in half["te-complete"]["detail"]
    )
    assert "te-complete" not in checks  # none installed: each is missing, no half-install verdict
