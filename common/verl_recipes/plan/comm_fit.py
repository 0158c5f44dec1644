"""The FSDP communicator term's calibration, regenerated from a real run and its rank rehearsal.

`predict/fsdp_comm.py` derives NCCL's buffers per communicator from NCCL's and verl's code; what
NCCL holds beside them (its device code in the CUDA context, each communicator's device state,
cuMem's rounding) is one figure per process, read here where a real multi-GPU run and a rank
rehearsal of the same job's rank stand side by side. Both runs record the training process's
device memory beyond its own allocator (NVML per process minus verl's `max_memory_reserved`,
steps 2+: `plan.rank_check`); the real run's holds the communicators, the rehearsal's (fake
group) none, and everything else (CUDA context, cuBLAS workspaces) is the same process's in
both. So

    process_bytes = (real - rehearsal) - the model's buffers for the real run's communicators

`verl-recipes plan --errors --write FILE` rewrites `predict/fsdp_comm.yaml` with it, before the
error table is planned with it; the model reads the file and never a run.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from verl_recipes import GIB, RecipeError, inflight
from verl_recipes.plan.rank_check import _steady
from verl_recipes.plan.runs import judged_setup, read_run
from verl_recipes.predict.fsdp_comm import MIB, CommFit, communicators

#: where the data file sits in a checkout (the package's own copy is `fsdp_comm.FIT_FILE`)
FIT_PATH = Path("common/verl_recipes/predict/fsdp_comm.yaml")
#: the pair it is fitted to: recipe 13b-fsdp's default as the real two-GPU job and as its rank 0
REAL = "recipes/13b-fsdp/results/h200x2-ppo"
REHEARSAL = "recipes/13b-fsdp/results/h200x1-ppo-rank0of2"

HEADER = """\
# What NCCL holds on one FSDP rank beside its buffers (verl_recipes/predict/fsdp_comm.py).
# Generated: `verl-recipes plan --errors --write validation/planner-errors.md` rewrites it from the
# two runs named here (verl_recipes/plan/comm_fit.py says how); edit the runs, never the numbers.
"""


def _beyond(run: Path) -> int:
    gib = _steady(run)["beyond_allocator_gib"]
    if gib is None:
        raise RecipeError(f"{run}: no per-process NVML peak or verl max_memory_reserved in steps 2+")
    return round(gib * GIB)


def fit(root: Path, real: str = REAL, rehearsal: str = REHEARSAL) -> CommFit:
    """The calibration from the two runs under `root`."""
    s = judged_setup(read_run(root / real))
    if s.fake_group or s.actor.backend == "megatron":
        raise RecipeError(f"{real}: not a real FSDP run of several GPUs")
    buffers = sum(c.buffer_bytes() for c in communicators(s))
    r, h = _beyond(root / real), _beyond(root / rehearsal)
    return CommFit(
        process_bytes=max(0, round((r - h - buffers) / MIB) * MIB),  # whole MiB: the reads are 0.01 GiB
        real=real,
        rehearsal=rehearsal,
        real_beyond_allocator_bytes=r,
        rehearsal_beyond_allocator_bytes=h,
        buffers_bytes=buffers,
    )


def render(f: CommFit) -> str:
    doc = {k: getattr(f, k) for k in CommFit.__dataclass_fields__}
    return HEADER + yaml.safe_dump(doc, sort_keys=False)


def write_fit(root: Path) -> Path | None:
    """Regenerate the checkout's data file in place; None where `root` holds none of the runs."""
    path = root / FIT_PATH
    if not (root / REAL).is_dir() or not (root / REHEARSAL).is_dir():
        return None
    inflight.write_text(path, render(fit(root)), "the communicator fit")
    return path
