"""Where the repository's parts are, and where made things are cached.

The recipes, images and validation folders live in the repository, not in the installed
package, because users copy and edit them. `VERL_RECIPES_ROOT` points at a checkout; without
it we look upwards from the working directory and then from this file (an editable install).
"""

from __future__ import annotations

import os
from pathlib import Path

from verl_recipes import PACKAGE_DIR, RecipeError


def _is_root(p: Path) -> bool:
    return (p / "recipes").is_dir() and (p / "images" / "versions.toml").is_file()


def repo_root() -> Path:
    """Return the checkout root, or raise a RecipeError that says how to point at one."""
    env = os.environ.get("VERL_RECIPES_ROOT")
    if env:
        p = Path(env).resolve()
        if not _is_root(p):
            raise RecipeError(
                f"VERL_RECIPES_ROOT={env} has no recipes/ and images/versions.toml; point it at a checkout"
            )
        return p
    for start in (Path.cwd().resolve(), PACKAGE_DIR):
        for p in (start, *start.parents):
            if _is_root(p):
                return p
    raise RecipeError("no verl-recipes checkout found: run inside one or set VERL_RECIPES_ROOT=/path/to/checkout")


def cache_dir() -> Path:
    """Where made things are kept between runs (synthetic models, the dataset, wheels):
    VERL_RECIPES_CACHE, else ~/.cache/verl-recipes."""
    return Path(os.environ.get("VERL_RECIPES_CACHE", Path.home() / ".cache" / "verl-recipes"))


def recipes_dir() -> Path:
    return repo_root() / "recipes"


def versions_file() -> Path:
    return repo_root() / "images" / "versions.toml"
