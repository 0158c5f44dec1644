"""The `verl-recipes` command: one subcommand per module, each in the wing that does its job.

Each subcommand module exposes `register(subparsers)` and sets `func` on its parser. Modules are
imported by name when the parser is built, so a missing dependency breaks only the subcommand
that needs it, with a one-line message; the heavy ones (torch, verl, NVML) load only when a
subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from verl_recipes import RecipeError, __version__, inflight, paths

# subcommand -> (module that implements it, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "list": ("verl_recipes.recipe.listing", "list the recipes found under recipes/*/recipe.yaml"),
    "show": ("verl_recipes.show", "compose a recipe against verl's Hydra config and print it"),
    "synth-model": (
        "verl_recipes.workload.synth",
        "write a random-weight HF checkpoint and tokenizer from a config.json",
    ),
    "dataset": ("verl_recipes.workload.dataset", "write the embedded arithmetic dataset as verl RL parquet"),
    "train": ("verl_recipes.train", "run a recipe: a preview on CPU, train with verl on GPU"),
    "docs": ("verl_recipes.docs", "regenerate the README's recipe table from the metadata"),
    "verify": ("verl_recipes.stack.verify", "check the install, GPUs, driver and host against the pins"),
    "monitor": ("verl_recipes.measure.monitor", "sample GPU (NVML) and host memory of a command, per PPO phase"),
    "report": ("verl_recipes.measure.report", "tables and a timeline PNG from a monitored run"),
    "plan": ("verl_recipes.plan.cli", "predict per-phase, per-GPU peak memory of a verl configuration"),
    "check-bounds": ("verl_recipes.measure.bounds", "check a run's memory and throughput against a recipe's bounds"),
    "ray-slurm": ("verl_recipes.cluster.cli", "bootstrap Ray on a Slurm allocation and run a recipe"),
    "trace": ("verl_recipes.measure.trace", "where a torch profiler trace spends its time"),
    "compare-ranks": (
        "verl_recipes.plan.rank_check",
        "rehearsed ranks against the real run they stand for, phase by phase",
    ),
    "rollout-bench": (
        "verl_recipes.measure.rollout_bench",
        "vLLM alone on exactly one step's rollout of a recipe (verl's gen against it)",
    ),
    "vllm-pool": (
        "verl_recipes.measure.vllm_pool",
        "vLLM's worker's torch allocator, round by round (sleep, wake, generate), on vLLM alone",
    ),
    "compare-runs": ("verl_recipes.measure.compare", "tokens/s and peak memory of runs against a baseline run"),
    "reap": ("verl_recipes.procs", "end the processes one run left behind, leaving other runs alone"),
    "wheelhouse": (
        "verl_recipes.stack.wheelhouse.build",
        "build an offline wheelhouse of the pinned stack for a target",
    ),
    "peers": ("verl_recipes.peers.cli", "TRL and OpenRLHF on the 7b-lora workload: compose, run, compare"),
}


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as the project's one line (`error: ...`, exit 2); `--help`
    still prints the usage. Subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (--help lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="verl-recipes", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"verl-recipes {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:  # a heavy optional dependency is missing
            p = sub.add_parser(name, help=help_)
            p.add_argument("rest", nargs=argparse.REMAINDER)
            msg = f"verl-recipes {name}: needs {e.name or e}; install it (pip install 'verl-recipes[verl]')"
            p.set_defaults(func=lambda _a, m=msg: (print(m, file=sys.stderr), 2)[1])
            continue
        mod.register(sub)
    return parser


#: the exit status of a command stopped by Ctrl-C or a kill (128 + SIGINT, as a shell reports it)
INTERRUPTED = 130


def _term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. Bad input, and a write the machine refuses (a full disk, a read-only
    filesystem), is one `error:` line and exit 2; Ctrl-C or a kill (SIGTERM) is
    one `interrupted:` line naming what was being written and what was kept, and exit 130: every
    writer cleans up on the way out (`verl_recipes.inflight`), so nothing half-written stays."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # plan's and train's words after `--` are a command line of their own (`plan -- python3 -m
    # verl.trainer.main_ppo ...`, or a verl script's `$@`): handed to them whole (`rest`)
    tail = argv[argv.index("--") + 1 :] if argv[:1] in (["plan"], ["train"]) and "--" in argv else None
    args = parser.parse_args(argv[: argv.index("--")] if tail is not None else argv)
    if tail is not None:
        args.rest = [*args.rest, *tail]
    caches, note = paths.library_caches(os.environ)
    if note:  # before any library reads its cache location: set for this process and every child
        os.environ.update(caches)
        print(note, file=sys.stderr)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_guarded(args.command, lambda: args.func(args))


def run_guarded(command: str, body: Callable[[], int | None]) -> int:
    """Run a subcommand's body with the two endings every command shares (see `main`)."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # a subcommand may still set its own
        signal.signal(signal.SIGTERM, _term_as_interrupt)
    try:
        return int(body() or 0)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a write the machine refused (full, read-only, not permitted): one line
        err = inflight.as_os_error(e)
        line = inflight.fault_line(command, err) if err is not None else None
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the line short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(inflight.interrupted_line(command), file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
