"""The verl job a command line names: a script, a suite entry, or a command line after `--`.

One function, `load_job`, for `plan` and `train` both, so they read a job the same way
(`recipe.verl_command` reads it, `recipe.verl_job` maps it, `recipe.verl_suite` stores verl's own).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from verl_recipes import RecipeError
from verl_recipes.recipe.verl_command import read_argv, read_script
from verl_recipes.recipe.verl_job import VerlJob, verl_job
from verl_recipes.recipe.verl_suite import entry


def load_job(
    target: str | None,
    rest: Sequence[str],
    script: Path | None = None,
    example: str | None = None,
    sets: Sequence[str] = (),
    arch: str | None = None,
) -> VerlJob | None:
    """The verl job a command line names, or None for a recipe or a deltas file.

    `plan`/`train` take a script (`--verl-script PATH`, or a positional path ending in .sh), a
    suite entry (`--verl-example NAME`) or a command line after `--`; argparse hands the words
    after `--` to `rest` (`cli.main`), the positional before it to `target`. With a script, those words are the
    script's `$@`; without one, they are the command line itself.
    """

    words = [target, *rest] if target is not None else list(rest)
    if script is None and example is None and target is not None and target.endswith(".sh"):
        script, words = Path(target), list(rest)
    if script is not None and example is not None:
        raise RecipeError("give --verl-script or --verl-example, not both")
    if script is not None:
        cmd = read_script(script, args=words)
        return verl_job(cmd, script.name.removesuffix(".sh"), sets, arch)
    if example is not None:
        if words:
            raise RecipeError(f"--verl-example {example}: extra arguments {' '.join(words)}; use --set KEY=VALUE")
        e = entry(example)
        return verl_job(e.command(), e.name, sets, arch)
    if len(words) > 1:  # `-- python3 -m verl.trainer.main_ppo ...`
        return verl_job(read_argv(words), "command-line", sets, arch)
    return None
