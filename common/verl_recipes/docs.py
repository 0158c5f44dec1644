"""Tables generated from the recipe metadata and the committed measurements.

The README's recipe table sits between `<!-- recipes:begin -->` and `<!-- recipes:end -->`;
`verl-recipes docs --write` regenerates it and tests/test_docs.py fails when it is stale. Every
number in it comes from an `expected/*.yaml` file, which names the committed run it came from:
a recipe with no measured run shows "not measured yet", never a guess.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.recipes import Recipe, discover

BEGIN, END = "<!-- recipes:begin -->", "<!-- recipes:end -->"


def _measured_cell(recipe: Recipe) -> str:
    cells = []
    for name in recipe.expected:
        doc = yaml.safe_load((recipe.dir / name).read_text())
        m = doc.get("measured") or {}
        peak = max((v for gpus in (m.get("memory_gib") or {}).values() for v in gpus.values()), default=None)
        tput = m.get("throughput_tok_s")
        label = Path(name).stem
        parts = [f"{peak:.1f} GiB peak" if peak is not None else "", f"{tput:,.0f} tok/s" if tput else ""]
        cells.append(f"[{label}](recipes/{recipe.id}/{name}): " + ", ".join(p for p in parts if p))
    return "<br>".join(cells) if cells else "not measured yet"


def recipe_table(recipes: dict[str, Recipe] | None = None) -> str:
    recipes = recipes if recipes is not None else discover()
    rows = [
        "| recipe | model | algorithm | backend | GPUs | written for | measured (per GPU, NVML) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in recipes.values():
        lora = f", LoRA r{r.model.lora_rank}" if r.model.lora_rank else ""
        variants = f" (+ {', '.join(r.variants)})" if r.variants else ""
        rows.append(
            f"| [{r.id}](recipes/{r.id}/README.md) | {r.model.arch} ({r.model.params / 1e9:.2f}B{lora}) "
            f"| {r.algorithm}{variants} | {r.backend} | {r.gpus.count} ({r.gpus.nodes} node"
            f"{'s' if r.gpus.nodes > 1 else ''}) | {r.gpus.target} | {_measured_cell(r)} |"
        )
    return "\n".join(rows)


def render_readme(text: str, table: str) -> str:
    if BEGIN not in text or END not in text:
        raise RecipeError(f"README.md has no {BEGIN} ... {END} block for the recipe table")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("docs", help="regenerate the README's recipe table from the metadata")
    p.add_argument("--write", action="store_true", help="rewrite README.md in place")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    readme = repo_root() / "README.md"
    new = render_readme(readme.read_text(), recipe_table())
    if args.write:
        readme.write_text(new)
        print(f"wrote {readme}")
    else:
        print(recipe_table())
    return 0
