"""Recipe metadata: the schema of `recipes/<id>/recipe.yaml` and discovery.

Every list of recipes in the project (nox sessions, the CI matrix, the README tables, the
bounds checks) comes from `discover()`, which scans `recipes/*/recipe.yaml`. Nothing is listed by
hand, so nothing drifts. The schema forbids unknown keys so that a typo fails as
`file: key: reason` instead of being ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from verl_recipes import RecipeError
from verl_recipes.paths import recipes_dir
from verl_recipes.workload.arch import bundled_archs, resolve_arch


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    arch: str = Field(description="name of a bundled HF config.json under verl_recipes/workload/archs/")
    params: int = Field(gt=0, description="parameter count, checked on the meta device by tests")
    lora_rank: int = Field(0, ge=0, description="LoRA rank of the actor; 0 = full fine-tune")

    @field_validator("arch")
    @classmethod
    def _arch_exists(cls, v: str) -> str:
        known = bundled_archs()
        if v not in known:
            raise ValueError(f"unknown arch {v!r}; bundled: {', '.join(known)}")
        return v


class GPUSpec(_Strict):
    count: int = Field(ge=0, description="GPUs the full recipe uses (0 = CPU only)")
    nodes: int = Field(1, ge=1)
    per_gpu_gib: float = Field(gt=0, description="per-GPU memory the recipe targets, GiB")
    target: str = Field(description="the hardware the recipe is written for, in words")
    variant: str | None = Field(
        None,
        description="the variant that fits per_gpu_gib, where the default does not (checked against the planner)",
    )
    measured_on: list[str] = Field(default_factory=list, description="device kinds it was measured on")


class SmokeSpec(_Strict):
    layers: int = Field(2, ge=1, description="decoder layers of the truncated smoke model")
    scale: Literal["tiny", "full-width"] = "tiny"
    steps: int = Field(1, ge=1)
    gpus: int = Field(0, ge=0, description="GPUs the smoke run needs (0 = rehearsal on CPU)")


class Recipe(_Strict):
    id: str
    title: str
    summary: str
    model: ModelSpec
    algorithm: Literal["ppo", "grpo"]
    backend: Literal["fsdp", "megatron", "deepspeed"]
    gpus: GPUSpec
    smoke: SmokeSpec = Field(default_factory=lambda: SmokeSpec())
    config: str = "config.yaml"
    variants: dict[str, str] = Field(default_factory=dict, description="name -> extra config file layered on config")
    expected: list[str] = Field(default_factory=list, description="bounds files, relative to the recipe folder")
    seed_claim: str | None = Field(None, description="the CLAIMS.md scenario this recipe answers")

    # Set by the loader, not by the YAML.
    dir: Path = Field(default=Path("."), exclude=True)

    @property
    def verl_config_name(self) -> str:
        """The verl Hydra root config this recipe overrides."""
        return "ppo_megatron_trainer" if self.backend == "megatron" else "ppo_trainer"

    @property
    def needs_gpu(self) -> bool:
        return self.gpus.count > 0

    @cached_property
    def arch_config(self) -> dict[str, Any]:
        return resolve_arch(self.model.arch)

    def config_files(self, variants: str | Sequence[str] | None = None) -> list[Path]:
        """The recipe's config layers: config.yaml, then each named variant in order."""
        names = [variants] if isinstance(variants, str) else list(variants or [])
        files = [self.dir / self.config]
        for name in names:
            if name not in self.variants:
                raise RecipeError(
                    f"recipe {self.id} has no variant {name!r}; variants: {', '.join(self.variants) or 'none'}"
                )
            files.append(self.dir / self.variants[name])
        return files


def _format_error(path: Path, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            fields = _fields_at(e["loc"][:-1])
            close = difflib.get_close_matches(str(e["loc"][-1]), fields, n=1)
            msg = "unknown key" + (f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(fields)}")
        parts.append(f"{path}: {loc}: {msg}")
    return "; ".join(parts)


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Recipe
    for key in loc:
        ann = model.model_fields[str(key)].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return [n for n in model.model_fields if n != "dir"]


def load_recipe(path: Path) -> Recipe:
    """Load and check one recipe.yaml; errors read `file: key: reason`."""
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: (top): expected a mapping")
    try:
        recipe = Recipe.model_validate({**raw, "dir": path.parent})
    except ValidationError as e:
        raise RecipeError(_format_error(path, e)) from None
    if recipe.id != path.parent.name:
        raise RecipeError(f"{path}: id: {recipe.id!r} must equal the folder name {path.parent.name!r}")
    if recipe.gpus.variant is not None and recipe.gpus.variant not in recipe.variants:
        raise RecipeError(
            f"{path}: gpus.variant: {recipe.gpus.variant!r} is not a variant; variants: "
            f"{', '.join(recipe.variants) or 'none'}"
        )
    for name in [recipe.config, *recipe.variants.values(), *recipe.expected]:
        if not (path.parent / name).is_file():
            raise RecipeError(f"{path}: {name}: file does not exist")
    return recipe


def discover(root: Path | None = None) -> dict[str, Recipe]:
    """All recipes, by id, from `recipes/*/recipe.yaml` (sorted)."""
    base = root or recipes_dir()
    return {r.id: r for r in (load_recipe(p) for p in sorted(base.glob("*/recipe.yaml")))}


def get_recipe(recipe_id: str, root: Path | None = None) -> Recipe:
    """One recipe by id; an unknown id lists the valid ones."""
    recipes = discover(root)
    if recipe_id not in recipes:
        close = difflib.get_close_matches(recipe_id, list(recipes), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RecipeError(f"unknown recipe {recipe_id!r}{hint}; recipes: {', '.join(recipes)}")
    return recipes[recipe_id]
