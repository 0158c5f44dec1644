"""Tables generated from the recipe metadata and the committed measurements.

The README's recipe table sits between `<!-- recipes:begin -->` and `<!-- recipes:end -->`, the
measured-results table (with cost) between `<!-- results:begin -->` and `<!-- results:end -->`,
the planner's predicted fit per GPU type between `<!-- plans:begin -->` and `<!-- plans:end -->`;
`verl-recipes docs --write` regenerates all three (and recipes/index.json, which noxfile.py reads),
`verl-recipes report --summary` prints the second, and tests/test_spine.py fails when the README is
stale. Every number comes from an
`expected/*.yaml` file, which names the committed runs it came from: a recipe with no measured run
shows "not measured yet", never a guess. The plans table is a prediction and says so in its
heading; its error against every measured run is `validation/planner-errors.md`.

Cost per million tokens = GPUs x (1e6 / job tokens/s) / 3600 x the cheapest on-demand price of the
GPU the run was measured on (`validation/prices.yaml`, each price dated and sourced;
`verl_recipes.plan.cost`). A run under `--cap-gib` still ran on that GPU: its speed and price are
the H200's, not those of the smaller card the cap stands for.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError, inflight
from verl_recipes.paths import repo_root
from verl_recipes.recipe.metadata import Recipe, discover
from verl_recipes.rundir import measured_runs, read_provenance

BEGIN, END = "<!-- recipes:begin -->", "<!-- recipes:end -->"
RBEGIN, REND = "<!-- results:begin -->", "<!-- results:end -->"
PBEGIN, PEND = "<!-- plans:begin -->", "<!-- plans:end -->"


def _runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured runs of a bounds file (one-run files of the first schema, or `source_runs`)."""
    m = doc.get("measured") or {}
    if "memory_gib" in m:
        return [m]
    return [v for v in m.values() if isinstance(v, dict)]


def _figures(doc: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(peak GiB per GPU over all runs, median tokens/s per GPU, median step s)."""
    runs = _runs(doc)
    peaks = [v for r in runs for gpus in (r.get("memory_gib") or {}).values() for v in gpus.values()]
    tputs = [r["throughput_tok_s"] for r in runs if r.get("throughput_tok_s")]
    times = [r["step_time_s"] for r in runs if r.get("step_time_s")]
    return (
        max(peaks, default=None),
        statistics.median(tputs) if tputs else None,
        statistics.median(times) if times else None,
    )


def _measured_cell(recipe: Recipe) -> str:
    cells = []
    for name in recipe.expected:
        doc = yaml.safe_load((recipe.dir / name).read_text())
        peak, tput, _ = _figures(doc)
        label = Path(name).stem
        parts = [f"{peak:.1f} GiB peak" if peak is not None else "", f"{tput:,.0f} tok/s" if tput else ""]
        cells.append(f"[{label}](recipes/{recipe.id}/{name}): " + ", ".join(p for p in parts if p))
    if cells:
        return "<br>".join(cells)
    results = recipe.dir / "results"
    runs = sorted({d.relative_to(results).parts[0] for d in measured_runs(results) if d != results})
    if runs:  # measured, but no run makes bounds yet (partial, or another setup than the recipe's)
        links = ", ".join(f"[{r}](recipes/{recipe.id}/results/{r}/)" for r in runs)
        return f"no bounds yet; runs: {links}"
    return "not measured yet"


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


_GPU_IDS = {"NVIDIA H200": "h200-141g", "NVIDIA H100 80GB HBM3": "h100-80g", "NVIDIA A100-SXM4-80GB": "a100-80g"}


def results_table(recipes: dict[str, Recipe] | None = None) -> str:
    """One row per bounds file: what ran, where, its memory, speed and cost per million tokens."""
    from verl_recipes.plan.cost import compute_cost, from_verl_throughput, load_prices, pick_offer, prices_file
    from verl_recipes.recipe.drift import drift_label
    from verl_recipes.rundir import CONFIG

    recipes = recipes if recipes is not None else discover()
    offers = load_prices(prices_file())
    rows = [
        "| recipe | configuration | measured on | peak GiB/GPU | tokens/s/GPU | step s | GPU-h per M tokens "
        "| $ per M tokens | runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in recipes.values():
        for name in r.expected:
            doc = yaml.safe_load((r.dir / name).read_text())
            prov = doc.get("provenance") or {}
            provs = [prov] if "gpu" in prov else [v for v in prov.values() if isinstance(v, dict)]
            first = provs[0] if provs else {}
            gpus = (first.get("gpu") or {}).get("gpus") or []
            gpu_name = gpus[0]["name"] if gpus else "?"
            # GPUs the run used: those with measured memory (provenance lists every GPU of the host)
            used = {g for run in _runs(doc) for per in (run.get("memory_gib") or {}).values() for g in per}
            n = len(used) or r.gpus.count
            variants = " + ".join(first.get("variants") or []) or "default"
            cap = f", --cap-gib {first['cap_gib']:g}" if first.get("cap_gib") else ""
            # a model truncated in depth is not the recipe's model: say so where the figures are
            runs = doc.get("source_runs") or [doc.get("source_run")]
            argv = (read_provenance(r.dir / runs[0]).get("argv") or []) if runs[0] else []
            if "--layers" in argv[:-1]:
                cap += f", --layers {argv[argv.index('--layers') + 1]}"
            # a configuration measured with one of our verl fixes off is another configuration
            off = sorted({f for p in provs for f in p.get("verl_fixes_off") or []})
            cap += "".join(f", --verl-fix-off {f}" for f in off)
            # and so is one measured before the recipe's deltas moved on: name the keys that differ
            if runs[0] and (r.dir / runs[0] / CONFIG).is_file():
                moved = drift_label(r, r.dir / runs[0])
                cap += f", {moved}" if moved else ""
            peak, tput, step = _figures(doc)
            offer = pick_offer(offers, _GPU_IDS.get(gpu_name, ""))
            cost = compute_cost(offer, n, from_verl_throughput(tput, n)) if offer and tput else None
            rows.append(
                f"| {r.id} | [{variants}{cap}](recipes/{r.id}/{name}) | {n}x {gpu_name} "
                f"| {peak:.1f} | {tput:,.0f} | {step:.1f} "
                f"| {cost.gpu_hours_per_million_tokens:.2f} | {cost.usd_per_million_tokens:.2f} "
                f"| {len(runs)} |"
                if peak is not None and tput and step and cost
                else f"| {r.id} | [{variants}{cap}](recipes/{r.id}/{name}) | {n}x {gpu_name} | "
                f"{'-' if peak is None else f'{peak:.1f}'} | - | - | - | - | {len(runs)} |"
            )
    if len(rows) == 2:
        rows.append("| not measured yet | | | | | | | | |")
    offer = pick_offer(offers, "h200-141g")
    if offer:
        rows.append("")
        rows.append(
            f"Price used for H200 rows: {offer.provider} {offer.product}, ${offer.usd_per_gpu_hour}/GPU-h "
            f"({offer.date}, {offer.source}); tokens = prompt + response, verl's perf/throughput."
        )
    return "\n".join(rows)


def plans_table(recipes: dict[str, Recipe] | None = None) -> str:
    """Predicted per-GPU peak of every recipe and variant on every catalogued GPU type.

    The question users ask before renting ("which GPUs does this job need, will it fit") for the
    recipes not measured yet, answered by the same planner `validate-planner` checks against every
    measured run. A cell is the predicted peak over the step's phases in GiB per GPU, with the GPU
    count the recipe is written for; "no" marks a GPU it does not fit and names the phase, or
    says why vLLM cannot run when the phases' sum would fit. Where the recipe commits a calibrated
    prediction for the layout on that GPU, its figure fills the cell ("calibrated"), as `plan`
    judges it.
    """
    from verl_recipes.plan.advice import calibrated
    from verl_recipes.plan.cli import load_setup
    from verl_recipes.plan.gpus import GIB, catalogue
    from verl_recipes.plan.phases import Constants, plan_gpu

    recipes = recipes if recipes is not None else discover()
    gpus = list(catalogue().values())
    rows = [
        "| recipe | configuration | GPUs | " + " | ".join(f"{g.id} ({g.visible_gib:.0f})" for g in gpus) + " |",
        "|---|---|---|" + "---|" * len(gpus),
    ]
    c = Constants()
    for r in recipes.values():
        for variant in [None, *r.variants]:
            _, setup, _ = load_setup(r.id, [variant] if variant else [], [])
            cells = []
            for g in gpus:
                p = plan_gpu(setup, g, c)
                peak = p.peak.total / GIB
                cal = calibrated(r, [variant] if variant else [], setup, g)
                if cal is not None:  # the same verdict `plan` gives: the calibrated figure decides
                    fig = f"{cal.peak_bytes / GIB:.1f} calibrated"
                    cells.append(fig if cal.fits else f"no: {fig} ({cal.peak_phase})")
                elif p.fits:
                    cells.append(f"{peak:.1f}")
                elif p.peak.total > g.visible_bytes:
                    cells.append(f"no: {peak:.1f} ({p.peak.phase})")
                else:  # the sum fits, vLLM does not (no KV cache, or no room to start)
                    why = next((q for q in p.problems if " needs " not in q), "does not fit")
                    cells.append(f"no: {why.split(':')[0]}")
            rows.append(f"| {r.id} | {variant or 'default'} | {setup.world} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _splice(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        raise RecipeError(f"README.md has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render_readme(text: str, table: str, results: str | None = None, plans: str | None = None) -> str:
    """The README with its generated blocks replaced (the results and plans blocks only when given)."""
    out = _splice(text, BEGIN, END, table)
    out = _splice(out, RBEGIN, REND, results) if results is not None else out
    return _splice(out, PBEGIN, PEND, plans) if plans is not None else out


#: what noxfile.py reads to name its sessions (JSON: nox runs before PyYAML or this package is installed)
INDEX = "recipes/index.json"


def recipe_index(recipes: dict[str, Recipe] | None = None) -> str:
    """recipes/index.json: each recipe's id, title, GPU count and smoke steps, as noxfile.py needs them.

    `pip install nox` brings no YAML parser, and `nox -l` must work on a machine that has only
    Python and nox; so the sessions are named from this file, generated from recipe.yaml by the
    same `docs --write` as the README tables, and tests/test_spine.py fails when it is stale.
    """
    import json

    recipes = recipes if recipes is not None else discover()
    body = {
        "generated_by": "verl-recipes docs --write, from recipes/*/recipe.yaml composed against verl's config",
        "recipes": {
            r.id: {
                "title": r.title,
                "gpus": r.gpus.count,
                "smoke_steps": r.smoke.steps,
                "layouts": {v or "default": _layout_facts(r, v) for v in [None, *r.variants]},
            }
            for r in recipes.values()
        },
    }
    return json.dumps(body, indent=1) + "\n"


def _layout_facts(recipe: Recipe, variant: str | None) -> dict[str, Any]:
    """What the Slurm launcher's check needs to apply `train`'s layout rules without verl or PyYAML
    (it runs on a node's bare python3): the batch and parallel sizes of the composed job."""
    from verl_recipes.plan.inputs import setup_from_config
    from verl_recipes.plan.model import Arch
    from verl_recipes.recipe.run_config import compose_run, gpu_layout

    cfg = compose_run(recipe, [variant] if variant else [], [], gpu_layout(recipe))
    s = setup_from_config(cfg, Arch.from_config(recipe.arch_config, f"{recipe.model.arch}/config.json"))
    a = s.actor
    return {
        "train_batch_size": s.train_batch_size,
        "rollout_n": s.rollout.n,
        "ppo_mini_batch_size": s.ppo_mini_batch_size,
        "backend": a.backend,
        "tp": a.tp,
        "pp": a.pp,
        "cp": a.cp,
        "micro_train": a.micro_train,
        "dynamic_bsz": a.dynamic_bsz,
        "rollout_tp": s.rollout.tp,
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("docs", help="regenerate the README's recipe table from the metadata")
    p.add_argument("--write", action="store_true", help="rewrite README.md in place")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    readme = repo_root() / "README.md"
    new = render_readme(readme.read_text(), recipe_table(), results_table(), plans_table())
    if args.write:
        inflight.write_text(readme, new, "the README")
        inflight.write_text(repo_root() / INDEX, recipe_index(), "the recipe index")
        print(f"wrote {readme} and {INDEX}")
    else:
        print(recipe_table())
    return 0
