"""`python -m verl_recipes.cluster` (also `verl-recipes ray-slurm`): check, launch, env, and the in-step commands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from verl_recipes import RecipeError
from verl_recipes.cluster.in_step import cmd_driver, cmd_node, cmd_reap
from verl_recipes.cluster.launcher import launch, say
from verl_recipes.cluster.settings import ENV_HELP, RUNTIMES, check
from verl_recipes.cluster.steps import MODULE

DESCRIPTION = "Ray on a Slurm allocation: check it, start Ray on every node, run the trainer, tear down."


def cmd_check(args: argparse.Namespace) -> int:
    say("check ok: " + check(os.environ, args.runtime, gpu=args.gpu).summary())
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    return launch(check(os.environ, args.runtime, args.dry_run, gpu=args.gpu), os.environ)


def _runtime_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=RUNTIMES, default="bare", help="how steps run (default bare)")
    p.add_argument(
        "--gpu",
        metavar="ID|NGiB",
        help="the allocation's GPU the planner judges the job on (also GPU=); default: what NVML names here",
    )


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check the allocation and variables; one line and exit 2 if wrong")
    _runtime_arg(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("launch", help="run the whole job: verify, Ray head and workers, driver, teardown")
    _runtime_arg(p)
    p.add_argument("--dry-run", action="store_true", help="print the srun lines and exit (also DRY_RUN=1)")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("env", help="list the variables the launcher reads")
    p.set_defaults(func=lambda _a: print(ENV_HELP, end="") or 0)

    p = sub.add_parser("node", help="(in a step) start one Ray node: ray start --block")
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--nofile", type=int, default=65536)
    p.add_argument("--job-dir", required=True)
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--job", required=True, help="the Slurm job id, marked on every Ray process")
    p.add_argument("--write-head", action="store_true", help="publish this node's address in head.json")
    p.add_argument("ray_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_node)

    p = sub.add_parser("driver", help="(in a step) wait for every node and GPU, then probe or run a command")
    p.add_argument("--address", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--nofile", type=int, default=65536)
    p.add_argument("--probe", action="store_true", help="a probe run: a task pinned to each node, no command")
    p.add_argument("--hold", type=int, default=0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_driver)

    p = sub.add_parser("reap", help="(in a step) kill what is left of this job's Ray on this node")
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--wait", type=float, default=40.0, help="seconds to wait for the job's other steps to end")
    p.set_defaults(func=cmd_reap)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ray-slurm",
        help="bootstrap Ray on a Slurm allocation and run a recipe",
        description=DESCRIPTION,
    )
    add_commands(p.add_subparsers(dest="ray_command", metavar="COMMAND", required=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=DESCRIPTION)
    add_commands(parser.add_subparsers(dest="ray_command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
