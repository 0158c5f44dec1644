"""`verl-recipes show`: a recipe composed against verl's Hydra config, printed, with what `plan`
and `train` would refuse in it said first.

A command at the package root: it composes (`recipe.compose`) and plans (`plan`), and a wing below
the planner never imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from verl_recipes import RecipeError, cli_types
from verl_recipes.predict.gpus import catalogue
from verl_recipes.predict.inputs import setup_from_config
from verl_recipes.predict.model import Arch
from verl_recipes.predict.phases import plan_gpu
from verl_recipes.recipe.compose import compose_file, compose_recipe
from verl_recipes.recipe.metadata import Recipe, get_recipe
from verl_recipes.recipe.run_config import compose_run, gpu_layout


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="compose a recipe against verl's Hydra config and print it")
    p.add_argument("recipe", help="recipe id, or a path to a config.yaml of deltas")
    p.add_argument(
        "--variant", action="append", default=[], help="a variant named in recipe.yaml (e.g. grpo); repeatable"
    )
    cli_types.add_set_option(p)
    p.add_argument("--config-name", default=None, help="verl root config for a path (default ppo_trainer)")
    p.add_argument("--resolve", action="store_true", help="resolve ${...} interpolations")
    p.add_argument("--only", help="print only this subtree, e.g. actor_rollout_ref.rollout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    target = Path(args.recipe)
    if target.suffix in (".yaml", ".yml") and target.exists():
        cfg = compose_file(target, args.config_name or "ppo_trainer", args.sets)
    else:
        recipe = get_recipe(args.recipe)
        cfg = compose_recipe(recipe, args.variant, args.sets)
        for line in refusals(recipe, args.variant, args.sets):
            print(f"warning: {line}", file=sys.stderr)
    if args.only:
        node = OmegaConf.select(cfg, args.only)
        if node is None:
            raise RecipeError(f"--only {args.only}: no such key in the composed config")
        cfg = node
    if OmegaConf.is_config(cfg):
        sys.stdout.write(OmegaConf.to_yaml(cfg, resolve=args.resolve))
    else:
        print(cfg)
    return 0


def refusals(recipe: Recipe, variants: Sequence[str], sets: Sequence[str]) -> list[str]:
    """What `plan` and `train` would refuse in this job, for `show` to warn about (it prints the
    config either way): the GPU layout rules, and a memory plan that fits no GPU the planner knows."""

    try:
        cfg = compose_run(recipe, variants, sets, gpu_layout(recipe))
        setup = setup_from_config(cfg, Arch.from_config(recipe.arch_config, f"{recipe.model.arch}/config.json"))
    except RecipeError as e:
        return [f"train refuses this job: {e}"]
    plans = [plan_gpu(setup, g) for g in catalogue().values()]
    if not any(p.fits for p in plans):
        big = max(plans, key=lambda p: p.gpu.visible_bytes)
        return [
            f"plan and train refuse this job: it fits no GPU the planner knows, not even {big.gpu.id} "
            f"({big.problems[0]}); `verl-recipes plan {recipe.id}` names the fix"
        ]
    return []
