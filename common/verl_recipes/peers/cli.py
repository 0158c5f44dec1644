"""`verl-recipes peers`: TRL and OpenRLHF beside the 7b-lora recipe on one workload.

`peers compose` prints each side's command line for a batch, `peers run PEER` runs one peer under
the monitor into a run folder, `peers table` sets run folders side by side (by default the
committed ones recipes/7b-lora/comparisons/peers.yaml names).
"""

from __future__ import annotations

import argparse
import shlex

from verl_recipes.peers import run as run_cmd
from verl_recipes.peers import table
from verl_recipes.peers.compose import sides
from verl_recipes.peers.workload import BATCHES


def compose(args: argparse.Namespace) -> int:
    for s in sides(args.batch):
        if args.peer in (None, s.side):
            print(f"# {s.side}, {s.row}\n{shlex.join(s.command)}\n")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("peers", help="TRL and OpenRLHF on the 7b-lora workload: compose, run, compare")
    inner = p.add_subparsers(dest="peers_command", metavar="COMMAND", required=True)
    c = inner.add_parser("compose", help="each side's command line for a batch")
    c.add_argument("peer", nargs="?", choices=["verl", *sorted(run_cmd.PEERS)])
    c.add_argument("--batch", choices=sorted(BATCHES), default="8x8")
    c.set_defaults(func=compose)
    run_cmd.register(inner)
    table.register(inner)
