"""verl-recipes: reproducible, measured deployment recipes for verl.

The package is grouped into wings by job, with the commands that compose them at the root:

- `cli`, `train`, `docs`, `paths`: the `verl-recipes` command, training or rehearsing a recipe,
  the README's generated tables, where the checkout's parts are;
- `rundir`: the run folder (file names, records, the summary.json schema); `procs`: a run's
  processes (their marker, the /proc scan, ending them);
- `recipe`: recipe.yaml and composing it against verl's config, once, as it will run;
- `workload`: the architectures, the synthetic checkpoint, the dataset, the reward;
- `worker`: what runs inside verl's Ray workers (the setup hook, the verl fixes, phase markers);
- `measure`: the monitor, the report, bounds, run comparisons, provenance;
- `plan`: the memory planner;
- `stack`: the pins, the lock, the images, `verify` and the offline wheelhouse;
- `cluster`: Ray on a Slurm allocation.

Modules that need torch, verl or NVML import them inside the functions that use them, so
`verl-recipes --help` and the recipe metadata work on a bare CPU machine; tests/test_imports.py
holds each wing to its import rule.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent
#: set by the monitor and the launcher for every process of a run: where phases and metrics go.
RUN_DIR_ENV = "VERL_RECIPES_RUN_DIR"
#: bytes in a GiB: every memory figure the project prints or compares is in GiB = 1024**3 bytes.
GIB = 1024**3


class RecipeError(Exception):
    """A user-facing error: its message is one line that says what to change.

    The CLI prints it as `error: <message>` and exits 2, with no traceback.
    """
