"""Where a committed run's configuration differs from its recipe as the recipe stands now.

A run keeps the verl config it trained with (`verl_config.yaml`); the recipe's deltas move on (a
default micro-batch changes, a key is added). A bounds file or a results row named only by its
variants would then pass an older configuration off as today's default. This compares the keys the
recipe itself sets (`config.yaml` and the run's variant files, in the order they compose) with the
run's saved values and names the ones that differ, except where the difference is no difference in
what ran: a key the run's own `--set` changed (named where the run is named), a cap's scaled vLLM
fraction (the launcher's, named by `--cap-gib`), critic batching keys
that verl 0.9.1 ignored (runs without the critic-engine-batching fix), critic keys of a run without
a critic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_recipes.fixes import CRITIC_BATCHING_FIX, recorded_off
from verl_recipes.recipe.compose import load_delta, saved_config
from verl_recipes.recipe.metadata import Recipe
from verl_recipes.recipe.verl_schema import _leaves
from verl_recipes.rundir import CONFIG, read_provenance

CAP_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
CRITIC_BATCHING_KEYS = (
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
    "critic.use_dynamic_bsz",
    "critic.ppo_max_token_len_per_gpu",
)


def recipe_keys(recipe: Recipe, variants: list[str]) -> dict[str, Any]:
    """Every leaf key the recipe's deltas set for these variants, with its value (later files win)."""

    want: dict[str, Any] = {}
    for name in ["config.yaml", *(recipe.variants[v] for v in variants)]:
        want.update((key, value) for key, value, section in _leaves(load_delta(recipe.dir / name)) if not section)
    return want


def drift(recipe: Recipe, run_dir: Path) -> list[tuple[str, Any, Any]]:
    """(key, the recipe's value now, the run's value) for each key that differs in what ran."""
    from omegaconf import OmegaConf  # verl's config library: not at import (the recipe wing's rule)

    prov = read_provenance(run_dir)
    cfg = saved_config(run_dir / CONFIG)  # read-only, shared with the planner's reads of the run
    has_critic = OmegaConf.select(cfg, "algorithm.adv_estimator") == "gae"
    ignored_critic = CRITIC_BATCHING_FIX in recorded_off(prov)
    named = {str(s).split("=", 1)[0].lstrip("+~") for s in prov.sets}  # the run's own --set, named already
    out = []
    for key, want in recipe_keys(recipe, prov.variants).items():
        if (key == CAP_KEY and prov.cap_gib) or key in named:
            continue
        if key.startswith("critic.") and (not has_critic or (ignored_critic and key in CRITIC_BATCHING_KEYS)):
            continue
        got = OmegaConf.select(cfg, key)
        if got != want:
            out.append((key, want, got))
    return out


def drift_label(recipe: Recipe, run_dir: Path) -> str:
    """The differences as `key=value` of the run, the key shortened to its last two parts."""
    return ", ".join(f"{'.'.join(k.split('.')[-2:])}={got}" for k, _, got in drift(recipe, run_dir))
