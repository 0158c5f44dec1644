"""verl-recipes: reproducible, measured deployment recipes for verl.

The package is small modules with one job each; `verl_recipes.cli` ties them to the
`verl-recipes` command. Modules that need torch, verl or NVML import them lazily so that
`verl-recipes --help` and the recipe metadata work on a bare CPU machine.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent
#: set by the monitor and the launcher for every process of a run: where phases and metrics go.
RUN_DIR_ENV = "VERL_RECIPES_RUN_DIR"


class RecipeError(Exception):
    """A user-facing error: its message is one line that says what to change.

    The CLI prints it as `error: <message>` and exits 2, with no traceback.
    """
