"""`verl-recipes reap RUN_DIR`: end every process left behind by one run, and only those.

A verl run that times out or dies leaves Ray's GCS and raylet, Ray workers and vLLM's engine
core behind, holding GPU memory. `ray stop --force` or `pkill ray::` would end them, but also
every other run on the host: on a machine with several GPUs we run one recipe per GPU at once.
Every process of a run inherits ``VERL_RECIPES_RUN_DIR=<run dir>`` from the launcher (Ray starts
its GCS, raylet and workers with the driver's environment), so that marker names exactly the
run's processes, whichever session or parent they ended up under.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from pathlib import Path

from verl_recipes import RecipeError
from verl_recipes.measure.monitor import has_marker, run_marker


def marked_pids(run_dir: Path, under: bool = False) -> list[int]:
    """Pids whose environment carries this run's marker (this process excluded).

    With `under`, runs in folders below `run_dir` count too (a GPU test keeps one run per test).
    """
    marker = run_marker(run_dir)
    me = os.getpid()
    pids = (int(n) for n in os.listdir("/proc") if n.isdigit())
    return sorted(pid for pid in pids if pid != me and has_marker(pid, marker, under))


def reap(run_dir: Path, grace_s: float = 5.0, under: bool = False) -> list[int]:
    """SIGTERM the run's processes, SIGKILL what is left after `grace_s`; return the pids found."""
    pids = marked_pids(run_dir, under)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline and marked_pids(run_dir, under):
            time.sleep(0.2)
        if not marked_pids(run_dir, under):
            break
    return pids


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reap",
        help="end the processes one run left behind (Ray, vLLM), leaving other runs alone",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--under", action="store_true", help="also runs in folders below RUN_DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        raise RecipeError(f"{args.run_dir}: no such run folder")
    pids = reap(args.run_dir, args.grace, args.under)
    left = marked_pids(args.run_dir, args.under)
    print(f"reap {args.run_dir}: {len(pids)} process(es) signalled, {len(left)} left")
    return 1 if left else 0
