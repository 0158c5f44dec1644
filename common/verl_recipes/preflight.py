"""One pre-flight for `train`: the same checks on a CPU preview and before a GPU launch.

Whatever a GPU host would refuse, the preview refuses first, with the same one line and a
non-zero exit, so it checks the job as it will run, before anything is made or written. Each
check is its owner's; `preflight` calls them in order, once, on the one composed config:

* the config composed with every override (variants, `--set`, and what `--gpus`, `--model`,
  `--arch`, `--layers` and `--smoke` give the launcher), each value typed and in range
  (`recipe.run_config.compose_run`, against `recipe.verl_schema`);
* the model's real config.json (`job.Model.config`): the user's `--model` folder, checked, or the
  shape the synthetic checkpoint will have, never the stock recipe's (a `--model-out` folder is
  judged with the command line, `job.decide`);
* the GPU layout (`verl_recipes.layout`, through the planner's `setup_from_config`) and, for
  `--rank`, the rank's share of the job (`worker.rank_rehearsal.share_lines`);
* the user's data files against what verl reads from them, and verl's own start-up validation,
  which `main_ppo` runs before Ray starts (`recipe.start_checks`);
* the host's RAM against the planner's host figure for the run, a warning only (`predict.host.host_lines`);
* the memory plan (`plan.advice.fit_lines`): a GPU host judges its own GPU (or its `--cap-gib`
  budget); a CPU host the GPU named by `--gpu`, else every GPU of the planner's catalogue, and the
  job is refused when it fits none of them (a host with one of the GPUs it does not fit refuses it;
  the line names them), in one line that ends with the whole fix (`plan.advice.whole_fix`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_recipes import RecipeError
from verl_recipes.job import Job
from verl_recipes.plan.advice import fit_lines
from verl_recipes.predict.host import host_lines
from verl_recipes.predict.inputs import Setup, setup_from_config
from verl_recipes.predict.model import Arch
from verl_recipes.recipe import start_checks
from verl_recipes.recipe.run_config import compose_run, default_data_dir
from verl_recipes.rundir import PROFILE
from verl_recipes.worker.rank_rehearsal import share_lines

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass(frozen=True)
class Preflight:
    """What the pre-flight leaves the preview or the launch: the config as it will run, the
    planner's `Setup` the verdict was reached on (the preview's closing line judges the same
    one), and the lines to print."""

    cfg: DictConfig
    setup: Setup
    lines: tuple[str, ...]


def preflight(job: Job) -> Preflight:
    """The job composed against verl's config, once, as it will run, and judged (module doc), each
    check by its owner; raises the one line a refusal is."""
    cfg = compose_run(
        job.recipe,
        job.variants,
        job.sets,
        job.layout,
        model=job.model.path,
        data=job.data,
        run_dir=job.run_dir,
        steps=job.steps,
    )
    if cfg.global_profiler.tool and not any(x.startswith("global_profiler.save_path=") for x in job.sets):
        # verl's default is a relative outputs/profile under whatever folder the workers run in
        cfg.global_profiler.save_path = str(job.run_dir / PROFILE)
    world = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    if job.rank is not None and world != job.rank.world:
        raise RecipeError(
            f"--rank {job.rank.rank}: the composed job has {world} GPU(s), its layout {job.rank.world}; "
            "set the GPUs per node with --gpus, not --set trainer.*"
        )
    # The job as it will run: the user's checkpoint, else the shape a GPU host makes, never the
    # tiny stand-in a CPU loads.
    arch, source = job.model.config()
    setup = setup_from_config(cfg, Arch.from_config(arch, source), job.fixes_off)
    lines = []
    if job.rank is not None:
        setup = setup.with_rank(job.rank)
        lines = share_lines(cfg, job.rank, arch)
    lines += start_checks.check(cfg, default_data_dir(), None if job.model.theirs else arch)
    lines += host_lines(setup, job.label, job.fixes_off, job.rank, here=job.preview is None)
    lines += fit_lines(setup, job.budgets, job.force, job.fixes_off, job.recipe, job.variants)
    return Preflight(cfg, setup, tuple(lines))
