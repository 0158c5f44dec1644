"""`verl-recipes train` on a CPU host: the rehearsal, and bad input that fails in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from verl_recipes import RecipeError
from verl_recipes.cli import main

pytestmark = pytest.mark.skipif(
    subprocess.run(["nvidia-smi", "-L"], capture_output=True, shell=False).returncode == 0
    if os.path.exists("/usr/bin/nvidia-smi")
    else False,
    reason="a GPU host trains instead of rehearsing",
)


def test_rehearsal_checks_everything_a_cpu_can(root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "VERL_RECIPES_CACHE": str(tmp_path / "cache"), "VERL_RECIPES_ROOT": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "train", "7b-lora", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "composed against verl's schema" in out
    assert "parameters loaded in transformers" in out
    assert "rows in verl's RLHFDataset" in out
    assert "training needs an NVIDIA GPU" in out
    assert "verl.trainer.main_ppo --config-path" in out
    cfg = (tmp_path / "run" / "verl_config.yaml").read_text()
    assert "worker_process_setup_hook: verl_recipes.worker.hooks.setup" in cfg
    assert "lora_rank: 64" in cfg


def test_bad_model_path_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "7b-lora", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model") and "config.json" in err and "\n" not in err


def test_cap_needs_a_gpu(tmp_path: Path) -> None:
    from verl_recipes.train import register  # noqa: F401  (the parser is what users reach)

    with pytest.raises(RecipeError, match="--cap-gib needs a GPU"):
        import argparse

        from verl_recipes import train

        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        train.register(sub)
        args = parser.parse_args(["train", "7b-lora", "--cap-gib", "24", "--run-dir", str(tmp_path / "r")])
        train.run(args)


def test_preflight_refuses_a_config_that_cannot_fit(tmp_path: Path) -> None:
    """The planner's verdict gates a GPU launch: one line naming the phase and a knob."""
    from verl_recipes.recipe.compose import compose_recipe
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import launcher_settings
    from verl_recipes.train import preflight_fit
    from verl_recipes.workload.arch import ARCHS_DIR

    recipe = get_recipe("7b-lora")
    model = ARCHS_DIR / "llama-2-7b"
    extra = launcher_settings(recipe, model, tmp_path, tmp_path / "run", 3, 1)
    plain = compose_recipe(recipe, [], [], extra=extra)
    with pytest.raises(RecipeError) as e:
        preflight_fit(plain, model, 24.0, "the --cap-gib budget")
    msg = str(e.value)
    assert "predicted not to fit" in msg and "--set " in msg and "\n" not in msg
    preflight_fit(plain, model, 140.0, "this GPU")  # the uncapped H200 run that worked
    preflight_fit(compose_recipe(recipe, ["24gib"], [], extra=extra), model, 24.0, "the --cap-gib budget")


def test_preflight_warns_when_the_host_has_less_ram_than_the_run_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 24gib run fits the 24 GiB budget on the GPU; this machine's MemTotal (psutil) against
    the planner's host figure for it is one `WARN host-ram` line, and the launch goes on."""
    import psutil
    from verl_recipes.plan.host import plan_host
    from verl_recipes.plan.inputs import setup_from_config
    from verl_recipes.plan.model import Arch
    from verl_recipes.recipe.compose import compose_recipe
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import launcher_settings
    from verl_recipes.train import preflight_fit
    from verl_recipes.workload.arch import ARCHS_DIR

    recipe = get_recipe("7b-lora")
    model = ARCHS_DIR / "llama-2-7b"
    cfg = compose_recipe(recipe, ["24gib"], [], extra=launcher_settings(recipe, model, tmp_path, tmp_path / "r", 3, 1))
    need = plan_host(setup_from_config(cfg, Arch.from_file(model / "config.json"))).peak.pss
    preflight_fit(cfg, model, 24.0, "the --cap-gib budget", run="7b-lora --variant 24gib")
    out = capsys.readouterr().out
    total = psutil.virtual_memory().total
    warned = [x for x in out.splitlines() if x.startswith("WARN host-ram")]
    if total < need:
        assert warned == [
            f"WARN host-ram {total / 2**30:.1f} GiB total; 7b-lora --variant 24gib needs about "
            f"{need / 2**30:.0f} GiB (planner, PSS peak; see verl-recipes plan)"
        ]
    else:
        assert not warned
    assert "plan: fits the --cap-gib budget" in out


def test_cap_overrun_names_the_worst_phase_of_a_real_run(root: Path, tmp_path: Path) -> None:
    """A measured run (7B PPO, uncapped, 70.9 GiB device peak) judged against two caps."""
    from verl_recipes.train import cap_overrun

    run = root / "recipes" / "7b-lora" / "results" / "h200x1-ppo"
    msg = cap_overrun(run, 24)
    assert msg is not None and "70.87 GiB" in msg and "GPU 0" in msg and "--cap-gib 24" in msg
    assert "phase gen" in msg or "phase update_weights" in msg or "phase step" in msg
    assert cap_overrun(run, 80) is None


def test_gpus_makes_a_multi_node_recipe_a_one_node_run(root: Path, tmp_path: Path) -> None:
    """`--gpus 2` on the 32-GPU 70b-3d recipe (a truncated rehearsal on two GPUs) composes a
    one-node, two-GPU config instead of keeping the recipe's 4 nodes."""
    from omegaconf import OmegaConf

    env = {**os.environ, "VERL_RECIPES_CACHE": str(tmp_path / "cache"), "VERL_RECIPES_ROOT": str(root)}
    sets = [
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1",
        "critic.megatron.tensor_model_parallel_size=2",
        "critic.megatron.pipeline_model_parallel_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ]
    cmd = [sys.executable, "-m", "verl_recipes.cli", "train", "70b-3d", "--gpus", "2", "--rehearse"]
    cmd += [x for s in sets for x in ("--set", s)] + ["--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    cfg = OmegaConf.load(tmp_path / "run" / "verl_config.yaml")
    assert cfg.trainer.nnodes == 1 and cfg.trainer.n_gpus_per_node == 2
    assert cfg.critic.megatron.override_transformer_config.attention_backend == "fused"
