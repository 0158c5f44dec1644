"""`verl-recipes validate`: check measured runs against a recipe's expected bounds.

Bounds files live at `recipes/<id>/expected/<name>.yaml` (torchtitan keeps expected losses per
GPU the same way) and are written from a real run by `verl-recipes validate --write-bounds`:
upper bound = measured x 1.05, lower bound = measured x 0.8, for the NVML device peak of every
phase on every GPU, the median step time and the median throughput. Each file names the run it
came from (`source_run`, a folder under the recipe's results/) and carries its provenance.

A lower bound matters too: memory far under the bound means the run did not do the work the
recipe describes (a smaller batch, a skipped critic), so it fails as loudly as an overrun.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError
from verl_recipes.phases import VERL_PHASES
from verl_recipes.recipes import Recipe, get_recipe

SCHEMA = "verl-recipes/expected/1"
UPPER, LOWER = 1.05, 0.8
#: phases whose peaks are bounded: verl's marked_timer names, as the report attributes them.
BOUNDED_PHASES = VERL_PHASES


def load_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise RecipeError(f"{run_dir}: no summary.json; run `verl-recipes report {run_dir}` first")
    return json.loads(path.read_text())


def measured(summary: dict[str, Any]) -> dict[str, Any]:
    """The quantities bounds are set on: phase peaks per GPU, median step time and throughput."""
    mem: dict[str, dict[str, float]] = {}
    for phase, peaks in (summary.get("phases") or {}).items():
        if phase not in BOUNDED_PHASES:
            continue
        for gpu, v in (peaks.get("gpu") or {}).items():
            if v.get("used_gib") is not None:
                mem.setdefault(phase, {})[str(gpu)] = float(v["used_gib"])
    steps = summary.get("steps") or []
    times = [s["time_s"] for s in steps if s.get("time_s")]
    tput = [s["throughput"] for s in steps if s.get("throughput")]
    return {
        "memory_gib": mem,
        "step_time_s": statistics.median(times) if times else None,
        "throughput_tok_s": statistics.median(tput) if tput else None,
        "steps": len(steps),
    }


def write_bounds(run_dir: Path, out: Path, recipe: Recipe, note: str = "") -> dict[str, Any]:
    """Bounds from one real run, with the run's provenance."""
    m = measured(load_summary(run_dir))
    if not m["memory_gib"]:
        raise RecipeError(f"{run_dir}: the run has no per-phase GPU memory; bounds need an NVML-monitored run")
    prov_path = run_dir / "provenance.json"
    prov = json.loads(prov_path.read_text()) if prov_path.is_file() else {}

    def band(x: float | None) -> list[float] | None:
        return None if x is None else [round(x * LOWER, 3), round(x * UPPER, 3)]

    try:
        source = str(run_dir.resolve().relative_to(recipe.dir.resolve()))
    except ValueError:
        source = str(run_dir)
    doc = {
        "schema": SCHEMA,
        "recipe": recipe.id,
        "source_run": source,
        "note": note,
        "margins": {"upper": UPPER, "lower": LOWER},
        "measured": m,
        "bounds": {
            "memory_gib": {ph: {g: band(v) for g, v in gpus.items()} for ph, gpus in m["memory_gib"].items()},
            "step_time_s": band(m["step_time_s"]),
            "throughput_tok_s": band(m["throughput_tok_s"]),
            "min_steps": m["steps"],
        },
        "provenance": {
            k: prov.get(k)
            for k in ("date_utc", "command", "packages", "gpu", "git_commit", "variants", "sets", "cap_gib", "steps")
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


def check(summary: dict[str, Any], bounds_doc: dict[str, Any], label: str) -> list[str]:
    """Every violated bound as one line naming the phase and GPU; empty when the run passes."""
    m = measured(summary)
    b = bounds_doc["bounds"]
    errors: list[str] = []
    if m["steps"] < int(b.get("min_steps") or 0):
        errors.append(f"{label}: {m['steps']} steps measured, the bounds need at least {b['min_steps']}")
    for phase, gpus in (b.get("memory_gib") or {}).items():
        for gpu, band in gpus.items():
            if band is None:
                continue
            got = m["memory_gib"].get(phase, {}).get(str(gpu))
            if got is None:
                errors.append(f"{label}: phase {phase} GPU {gpu}: not measured (bound {band[0]}-{band[1]} GiB)")
            elif got > band[1]:
                errors.append(f"{label}: phase {phase} GPU {gpu}: {got:.2f} GiB > upper bound {band[1]:.2f} GiB")
            elif got < band[0]:
                errors.append(f"{label}: phase {phase} GPU {gpu}: {got:.2f} GiB < lower bound {band[0]:.2f} GiB")
    for key, unit in (("step_time_s", "s"), ("throughput_tok_s", "tokens/s")):
        band = b.get(key)
        got = m.get(key)
        if band is None:
            continue
        if got is None:
            errors.append(f"{label}: {key} not measured")
        elif not band[0] <= got <= band[1]:
            errors.append(f"{label}: {key} {got:.2f} {unit} outside [{band[0]:.2f}, {band[1]:.2f}]")
    return errors


def validate_recipe(recipe: Recipe, run: Path | None = None, expected: str | None = None) -> list[str]:
    names = [expected] if expected else recipe.expected
    if not names:
        raise RecipeError(
            f"recipe {recipe.id} has no expected/ bounds yet; measure a run and write them with "
            "`verl-recipes validate --write-bounds RUN --out recipes/<id>/expected/<gpu>x<n>.yaml`"
        )
    errors: list[str] = []
    for name in names:
        path = recipe.dir / name
        doc = yaml.safe_load(path.read_text())
        if doc.get("schema") != SCHEMA:
            raise RecipeError(f"{path}: schema: expected {SCHEMA}")
        run_dir = run or recipe.dir / doc["source_run"]
        errs = check(load_summary(run_dir), doc, f"{recipe.id} {name}")
        print(f"{'FAIL' if errs else 'ok  '} {recipe.id} {name} <- {run_dir}")
        errors += errs
    return errors


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a run's memory and throughput against a recipe's bounds")
    p.add_argument("recipe")
    p.add_argument("--run", type=Path, help="a run folder (default: each bounds file's source run)")
    p.add_argument("--expected", help="one bounds file, relative to the recipe folder")
    p.add_argument("--write-bounds", type=Path, metavar="RUN", help="write bounds from this run to --out")
    p.add_argument("--out", type=Path)
    p.add_argument("--note", default="")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    recipe = get_recipe(args.recipe)
    if args.write_bounds:
        if not args.out:
            raise RecipeError("--write-bounds needs --out recipes/<id>/expected/<name>.yaml")
        write_bounds(args.write_bounds, args.out, recipe, args.note)
        print(f"wrote {args.out}")
        return 0
    errors = validate_recipe(recipe, args.run, args.expected)
    for e in errors:
        print(e)
    return 1 if errors else 0
