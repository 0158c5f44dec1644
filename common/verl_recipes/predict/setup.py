"""The planner's Setup of a job named as `plan` and `train` name it: a recipe id (with variants,
--set lines, train's --gpus and --layers) or a config.yaml of deltas with its architecture.

One function, `load_setup`, so the plan command, its advice on variants that fit and the generated
tables plan exactly the job the user asked for, composed once through `recipe.run_config`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError
from verl_recipes.predict.inputs import Setup, setup_from_config
from verl_recipes.predict.model import Arch
from verl_recipes.recipe.compose import compose_file
from verl_recipes.recipe.metadata import get_recipe
from verl_recipes.recipe.run_config import compose_run, gpu_layout
from verl_recipes.workload.arch import arch_config_path


def _arch_from(spec: str) -> Arch:
    return Arch.from_file(arch_config_path(spec))


def load_setup(
    target: str,
    variants: list[str],
    sets: list[str],
    arch: str | None = None,
    config_name: str | None = None,
    layers: int | None = None,
    gpus: int | None = None,
    fixes_off: Sequence[str] = (),
) -> tuple[str, Setup, Any]:
    """(label, Setup, recipe or None) for a recipe id or a deltas file; `gpus` is train's --gpus
    (that many GPUs on one node), `layers` truncates the model."""

    path = Path(target)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise RecipeError(f"{target}: no such file")
        if variants:
            raise RecipeError("--variant applies to recipes; layer a file's variants into it or use --set")
        cfg = compose_file(path, config_name or "ppo_trainer", sets)
        if arch:
            a = _arch_from(arch)
        else:
            from omegaconf import OmegaConf

            model = OmegaConf.select(cfg, "actor_rollout_ref.model.hf_config_path") or OmegaConf.select(
                cfg, "actor_rollout_ref.model.path"
            )
            cand = Path(str(model)).expanduser() / "config.json" if model else None
            if cand is None or not cand.is_file():
                raise RecipeError(
                    f"{target}: no config.json at actor_rollout_ref.model.path ({model}); pass --arch NAME|config.json"
                )
            a = Arch.from_file(cand)
        return str(path), setup_from_config(cfg, _truncated(a, layers), fixes_off), None
    recipe = get_recipe(target)
    cfg = compose_run(recipe, variants, sets, gpu_layout(recipe, gpus))
    a = _arch_from(arch) if arch else Arch.from_config(recipe.arch_config, f"{recipe.model.arch}/config.json")
    label = recipe.id + "".join(f" +{v}" for v in variants) + (f" at {layers} layer(s)" if layers else "")
    return label, setup_from_config(cfg, _truncated(a, layers), fixes_off), recipe


def _truncated(a: Arch, layers: int | None) -> Arch:
    if layers is None:
        return a
    if layers < 1:
        raise RecipeError(f"--layers {layers}: give at least 1")
    return replace(a, layers=layers)
