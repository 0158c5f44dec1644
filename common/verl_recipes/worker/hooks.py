"""What runs at the start of every verl process the launcher starts.

verl 0.9.1 runs its trainer loop and its FSDP workers in Ray actors, not in the driver, so
anything we add must be installed in those processes. The launcher puts
``worker_process_setup_hook: verl_recipes.worker.hooks.setup`` into verl's own
``ray_kwargs.ray_init.runtime_env``; Ray calls it in each worker process at start.

It does four things, each controlled by an environment variable the launcher sets:
- registers the verl 0.9.1 fixes (`verl_recipes.worker.verl_fixes`), unless VERL_RECIPES_NO_FIXES=1
  (VERL_RECIPES_FIXES_OFF leaves out single ones); each is applied when verl imports the module
  it patches, so a worker that never loads verl's FSDP engine does not import it for us;
- caps the process's torch allocator to VERL_RECIPES_TORCH_MEM_FRACTION of the GPU (the
  24 GiB rehearsal on a larger GPU), when the process sees a GPU;
- stands in for one rank of a larger job when VERL_RECIPES_RANK_REHEARSAL=R/N is set
  (`verl_recipes.worker.rank_rehearsal`);
- installs phase attribution (`verl_recipes.worker.markers`) when VERL_RECIPES_RUN_DIR is set.
"""

from __future__ import annotations

import logging
import os

from verl_recipes import RUN_DIR_ENV
from verl_recipes.worker import rank_rehearsal

log = logging.getLogger(__name__)

ENV_NO_FIXES = "VERL_RECIPES_NO_FIXES"
ENV_MEM_FRACTION = "VERL_RECIPES_TORCH_MEM_FRACTION"


def _cap_memory() -> None:
    """Queue the allocator cap for CUDA's lazy init, never initialise CUDA here.

    Ray runs this hook when the worker process starts, before it sets CUDA_VISIBLE_DEVICES
    for the actor; touching CUDA now would pin the wrong devices. `torch.cuda._lazy_call`
    runs the cap when the process first really uses CUDA.
    """
    frac = os.environ.get(ENV_MEM_FRACTION)
    if not frac:
        return
    import torch

    def _apply() -> None:
        for dev in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(float(frac), dev)

    torch.cuda._lazy_call(_apply)


def setup() -> None:
    """Ray's worker_process_setup_hook: never raises, so a hook problem cannot kill a worker.

    The one exception is a rank rehearsal asked for and not understood (`layout.ENV_RANK`):
    a worker that went on without it would measure a different job and say nothing.
    """

    rank_rehearsal.apply()
    if os.environ.get(ENV_NO_FIXES) != "1":
        try:
            from verl_recipes.worker import verl_fixes

            verl_fixes.apply()
        except Exception as e:
            log.warning("verl_recipes: fixes not applied: %s", e)
    try:
        _cap_memory()
    except Exception as e:
        log.warning("verl_recipes: memory cap not applied: %s", e)
    if os.environ.get(RUN_DIR_ENV):
        try:
            from verl_recipes.worker import markers

            markers.install()
        except Exception as e:
            log.warning("verl_recipes: phase attribution not installed: %s", e)
