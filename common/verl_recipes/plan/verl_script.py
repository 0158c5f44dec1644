"""`plan` of a verl job as its users write it: the composed configuration, and what the header says.

The job (`recipe.verl_job`) is composed exactly as `train` composes it (`run_config.compose_run`
on the job's deltas-free recipe, its `--set` lines and its layout), so the plan judges the job a
rehearsal runs. The header says what was mapped (the model id, the data, the reward, the loggers,
the layout) and, by name, each key the job sets that the planner does not model
(`predict.verl_keys.not_modelled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from verl_recipes import RecipeError
from verl_recipes.predict.inputs import Setup, setup_from_config
from verl_recipes.predict.model import Arch
from verl_recipes.predict.verl_keys import not_modelled
from verl_recipes.recipe.verl_job import VerlJob
from verl_recipes.workload.arch import arch_config_path


def compose_job(job: VerlJob, layers: int | None = None, fixes_off: Sequence[str] = ()) -> tuple[Any, Setup]:
    """(composed config, Setup) of the job, as `train` composes it."""
    from verl_recipes.recipe.run_config import compose_run

    try:
        cfg = compose_run(job.recipe, [], list(job.sets), job.layout)
    except RecipeError as e:
        raise RecipeError(f"{job.source}: {e}") from None
    path = arch_config_path(job.arch)
    import json

    arch = Arch.from_config(json.loads(path.read_text()), f"{job.arch}/config.json")
    if layers is not None:
        arch = replace(arch, layers=layers)
    return cfg, setup_from_config(cfg, arch, fixes_off)


def header(job: VerlJob) -> list[str]:
    """The lines above the plan: where the job came from, what was mapped, what is not modelled."""
    lines = [f"verl job: {job.source} ({len(job.keys)} keys set)"]
    lines += [f"mapped: {m}" for m in job.mapped]
    missing = not_modelled(job.keys, job.dropped)
    lines.append(f"not modelled: {', '.join(missing)}" if missing else "not modelled: none of the keys it sets")
    return lines
