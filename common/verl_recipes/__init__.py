"""verl-recipes: reproducible, measured deployment recipes for verl.

The package is grouped into wings by job. From the bottom up (a module imports only from its own
wing and the wings before it; tests/test_imports.py holds the order, as `LAYERS`):

- the base: this package (`RecipeError`, `GIB`, `has_gpu`), `paths` (where the checkout's parts
  are), `rundir` (the run folder: file names, records, the summary.json and provenance.json
  schemas), `procs` (a run's processes: their marker, the /proc scan, ending them);
- `workload`: the architectures, the synthetic checkpoint, the dataset, the reward;
- `worker`: what runs inside verl's Ray workers (the setup hook, the verl fixes and their names,
  phase markers);
- `recipe`: recipe.yaml and composing it against verl's config, once, as it will run;
- `measure`: the monitor, the report, bounds, run comparisons, provenance;
- `plan`: the memory planner, and the one reader of committed runs (`plan.runs`);
- `stack`: the pins, the lock, the images, `verify` and the offline wheelhouse;
- `peers`: the trainers a user would pick instead (TRL, OpenRLHF) on the 7b-lora workload;
- `cluster`: Ray on a Slurm allocation;
- the commands at the root: `cli`, `train`, `preflight`, `docs` (the README's generated tables).

One word, one meaning. "validation" names the `validation/` folder alone: the claims ledger and
the evidence each verdict rests on (prices, the planner's error table and its notes). The checks
are named for what they check: `check-bounds` (a run against a recipe's bounds), `plan --errors`
(the planner against every committed run), `predict.inputs.check_layout` (a GPU layout verl would
refuse); verl's own `validate_config` is "verl's start-up checks". A
"phase" is one of verl's marked_timer phases: `worker.markers` records them, `predict.phases`
predicts the memory of each.

Modules that need torch, verl or NVML import them inside the functions that use them, so
`verl-recipes --help` and the recipe metadata work on a bare CPU machine; tests/test_imports.py
holds each wing to its import rule.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

__version__ = "0.1.0"

PACKAGE_DIR = Path(__file__).resolve().parent
#: set by the monitor and the launcher for every process of a run: where phases and metrics go.
RUN_DIR_ENV = "VERL_RECIPES_RUN_DIR"
#: a GiB: every size the project prints or stores in GiB is in units of 1024**3 bytes.
GIB = 1024**3


def has_gpu() -> bool:
    """Whether an NVIDIA GPU answers here (`nvidia-smi -L`): what decides if `gpu` tests run.

    nvidia-smi, not NVML, so the answer needs neither pynvml nor a driver library in this process."""
    if not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


class RecipeError(Exception):
    """A user-facing error: its message is one line that says what to change.

    The CLI prints it as `error: <message>` and exits 2, with no traceback.
    """


_P = ParamSpec("_P")


def one_line_errors(main: Callable[_P, int]) -> Callable[_P, int]:
    """A `python -m` tool's main: a RecipeError is printed as `error: <message>` and exits 2.

    The image builds run these tools on a bare python3, where a traceback would bury the one line
    that says what to change."""

    @functools.wraps(main)
    def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except RecipeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    return wrapped
