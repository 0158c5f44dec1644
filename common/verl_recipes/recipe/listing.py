"""`verl-recipes list`: the recipes the metadata defines, one line each."""

from __future__ import annotations

import argparse
import json

from verl_recipes.recipe.metadata import discover


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the recipes found under recipes/*/recipe.yaml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    recipes = discover()
    if args.json:
        print(json.dumps({k: r.model_dump(mode="json") for k, r in recipes.items()}, indent=2))
        return 0
    for r in recipes.values():
        print(f"{r.id:20s} {r.algorithm:5s} {r.backend:9s} {r.gpus.count:3d} GPU  {r.title}")
    return 0
