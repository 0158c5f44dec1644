"""A recipe as it will run: its GPU layout and the settings the launcher owns, composed once.

`verl-recipes train` (the rehearsal and the GPU launch), `plan` and the README's fit table all
compose a recipe through `compose_run`, so what the planner predicts, what the rehearsal checks
and what a GPU host starts are one job: the same layers, GPU layout and `--set` overrides.
The launcher owns the model and data paths, the GPU layout, the step count, verl's loggers, the
checkpoint folder, the reward function and Ray's worker setup hook; the recipe owns the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_recipes import rundir
from verl_recipes.paths import cache_dir
from verl_recipes.recipe.compose import compose_recipe
from verl_recipes.recipe.metadata import Recipe
from verl_recipes.workload import reward
from verl_recipes.workload.arch import arch_config_path

#: what Ray runs at the start of every verl worker process (verl_recipes.worker.hooks).
SETUP_HOOK = "verl_recipes.worker.hooks.setup"


@dataclass(frozen=True)
class Layout:
    """GPUs per node and nodes: verl's trainer.n_gpus_per_node and trainer.nnodes."""

    per_node: int
    nnodes: int

    @property
    def world(self) -> int:
        return self.per_node * self.nnodes


@dataclass(frozen=True)
class Composition:
    """How a job composes its recipe, as `train` and `plan` are asked it: the variants in the order
    layered, the `--set` lines, `--gpus` (that many GPUs on one node; None: the recipe's layout),
    `--layers` (None: every layer) and the verl fixes it goes without. A recipe variant that fits
    where the job does not is planned with the same (`plan.advice.fitting_variants`)."""

    variants: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    gpus: int | None = None
    layers: int | None = None
    fixes_off: tuple[str, ...] = ()


def gpu_layout(recipe: Recipe, gpus: int | None = None, smoke: bool = False) -> Layout:
    """The layout the launcher gives a recipe (the one place it is computed).

    `gpus` (train's --gpus) is that many GPUs on one node, whatever the recipe's node count: a
    scaled-down run such as a truncated 70B on two GPUs. A smoke run uses one GPU per node.
    """
    if gpus:
        return Layout(gpus, 1)
    if smoke:
        return Layout(1, recipe.gpus.nodes)
    return Layout(max(1, recipe.gpus.count // recipe.gpus.nodes), recipe.gpus.nodes)


def default_data_dir() -> Path:
    """Where `verl-recipes train` writes the embedded dataset when no --data is given."""
    return cache_dir() / "data" / "arith"


def launcher_settings(
    recipe: Recipe,
    model: Path | None,
    data: Path,
    run_dir: Path | None,
    steps: int,
    n_gpus: int,
    nnodes: int | None = None,
) -> Any:
    """What the launcher owns in verl's config: paths, GPUs, steps, logging, the reward. Without
    `model` the recipe's bundled architecture folder stands in (planning needs no checkpoint)."""
    from omegaconf import OmegaConf

    model = model or arch_config_path(recipe.model.arch).parent

    trainer: dict[str, Any] = {
        "n_gpus_per_node": n_gpus,
        "nnodes": nnodes or recipe.gpus.nodes,
        "total_training_steps": steps,
        "total_epochs": 1000,
        "logger": ["console", "file"],
    }
    if run_dir is not None:
        trainer["default_local_dir"] = str(run_dir / rundir.CHECKPOINTS)
    settings: dict[str, Any] = {
        "actor_rollout_ref": {"model": {"path": str(model)}},
        "critic": {"model": {"path": str(model), "tokenizer_path": str(model)}},
        "data": {"train_files": str(data / "train.parquet"), "val_files": str(data / "test.parquet")},
        # the module is the launcher's; which of its scores (verl's default name, compute_score: the
        # arithmetic) a recipe layer may choose
        "reward": {"custom_reward_function": {"path": reward.__file__}},
        "trainer": trainer,
    }
    return OmegaConf.create(settings)


def add_setup_hook(cfg: Any) -> dict[str, Any]:
    """Put Ray's worker setup hook into verl's (struct) ray_init.runtime_env; return that runtime_env."""
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook = SETUP_HOOK
    renv = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env)
    assert isinstance(renv, dict)
    return {str(k): v for k, v in renv.items()}


def compose_run(
    recipe: Recipe,
    variants: str | Sequence[str] | None,
    sets: Sequence[str],
    layout: Layout,
    *,
    model: Path | None = None,
    data: Path | None = None,
    run_dir: Path | None = None,
    steps: int = 3,
) -> Any:
    """The full config of a run: verl's defaults, the recipe's layers, the launcher's settings, --set.

    Without `model` the recipe's bundled architecture folder stands in (planning needs no
    checkpoint); without `data` the dataset's default place; without `run_dir` no checkpoint folder.
    """
    extra = launcher_settings(recipe, model, data or default_data_dir(), run_dir, steps, layout.per_node, layout.nnodes)
    cfg = compose_recipe(recipe, variants, sets, extra=extra)
    add_setup_hook(cfg)
    return cfg
