"""Tables generated from the recipe metadata and the committed measurements.

The front README carries one table, the user's: each job in plain words and the GPU types it fits
(`<!-- gpus:begin -->` ... `<!-- gpus:end -->`). recipes/README.md carries the depth: the recipe
table (`recipes`), the measured results with cost (`results`), the planner's predicted peak per
GPU type (`plans`) and the dated status, what ran and what is predicted (`status`), each between
`<!-- NAME:begin -->` and `<!-- NAME:end -->`. `verl-recipes docs --write` regenerates them all
(and recipes/index.json, which noxfile.py reads), `verl-recipes docs
--results` prints the measured results, and tests/test_docs.py fails when a file is stale. Every
measured number comes from an `expected/*.yaml` file, which names the committed runs it came from: a
recipe with no measured run shows "not measured yet", never a guess. The plans table is a prediction and says so in its
heading; its error against every measured run is `validation/planner-errors.md`.

Cost per million tokens = GPUs x (1e6 / job tokens/s) / 3600 x the cheapest on-demand price of the
GPU the run was measured on (`validation/prices.yaml`, each price dated and sourced;
`verl_recipes.predict.cost`). A run under `--cap-gib` still ran on that GPU: its speed and price are
the H200's, not those of the smaller card the cap stands for.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import GIB, RecipeError, inflight
from verl_recipes.layout import RankSpec
from verl_recipes.measure import throughput as throughput_table
from verl_recipes.paths import repo_root
from verl_recipes.peers import compose as peers_compose
from verl_recipes.peers import table as peers_table
from verl_recipes.plan.advice import calibrated, verdict_margin
from verl_recipes.plan.evidence import behind, sets_words
from verl_recipes.plan.runs import committed_runs, lacks, read_run, results_dir, run_setup
from verl_recipes.predict.cost import compute_cost, from_verl_throughput, load_prices, pick_offer, prices_file
from verl_recipes.predict.gpus import catalogue, catalogued
from verl_recipes.predict.inputs import setup_from_config
from verl_recipes.predict.margin import load_spread
from verl_recipes.predict.model import Arch
from verl_recipes.predict.phases import Constants, plan_gpu
from verl_recipes.predict.setup import load_setup
from verl_recipes.recipe.drift import drift_label
from verl_recipes.recipe.metadata import Recipe, discover
from verl_recipes.recipe.run_config import compose_run, gpu_layout
from verl_recipes.recipe.run_names import parse_bounds_name
from verl_recipes.rundir import CONFIG, SUMMARY, Provenance, read_provenance


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
    verl_bounds = False
    for name in recipe.expected:
        doc = yaml.safe_load((recipe.dir / name).read_text())
        peak, tput, _ = _figures(doc)
        tags = []
        provs = [p for p in (doc.get("provenance") or {}).values() if isinstance(p, dict)]
        backend = Provenance.from_record(provs[0]).backend if provs else None
        if backend:  # the other side of a comparison: its figures are not verl's
            tags.append(f"{backend}, not verl")
        verl_bounds = verl_bounds or backend is None
        rank = RankSpec.from_record(doc.get("rank_rehearsal"))
        if rank:  # a rehearsed rank's memory is that rank's; its speed is never the job's
            tags.append(f"rank rehearsal, {rank.rank} of {rank.world}")
            tput = None
        label = Path(name).stem + (f" ({'; '.join(tags)})" if tags else "")
        parts = [f"{peak:.1f} GiB peak" if peak is not None else "", f"{tput:,.0f} tok/s" if tput else ""]
        cells.append(f"[{label}](recipes/{recipe.id}/{name}): " + ", ".join(p for p in parts if p))
    if verl_bounds:
        return "<br>".join(cells)

    results = results_dir(recipe.dir)
    found = committed_runs(recipe.dir.parent.parent, recipe.id)
    runs = sorted({run.run_dir.relative_to(results).parts[0] for run in found if run.run_dir != results})
    if runs:  # verl measured, but no run makes bounds yet (partial, or another setup than the recipe's)
        links = ", ".join(f"[{r}](recipes/{recipe.id}/results/{r}/)" for r in runs)
        cells.append(f"{'verl: ' if cells else ''}no bounds yet; runs: {links}")
    return "<br>".join(cells) or "not measured yet"


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


def results_table(recipes: dict[str, Recipe] | None = None) -> str:
    """One row per bounds file: what ran, where, its memory, speed and cost per million tokens."""

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
            # the bounds file quotes each run's provenance record (one record, or one per run)
            prov = doc.get("provenance") or {}
            raws = [prov] if "gpu" in prov else [v for v in prov.values() if isinstance(v, dict)]
            provs = [Provenance.from_record(x) for x in raws] or [Provenance.from_record({})]
            first = provs[0]
            gpu_name = first.gpu_names[0] if first.gpu_names else "?"
            # GPUs the run used: those with measured memory (provenance lists every GPU of the host)
            used = {g for run in _runs(doc) for per in (run.get("memory_gib") or {}).values() for g in per}
            n = len(used) or r.gpus.count
            variants = " + ".join(first.variants) or "default"
            if first.backend:  # the other side of a comparison: none of verl's configurations
                variants = f"{first.backend}, not verl"
            cap = f", --cap-gib {first.cap_gib:g}" if first.cap_gib else ""
            # a model truncated in depth is not the recipe's model: say so where the figures are
            runs = doc.get("source_runs") or [doc.get("source_run")]
            first_run = read_provenance(r.dir / runs[0]) if runs[0] else None
            layers = first_run.argv_value("--layers") if first_run else None
            if layers is not None:
                cap += f", --layers {layers}"
            # and so is the job on fewer GPUs than it is written for
            fewer = first_run.argv_value("--gpus") if first_run else None
            if fewer is not None:
                cap += f", --gpus {fewer}"
            # and so is one run with `--set` overrides (EOS ignored, say): name each
            cap += sets_words(first.sets)
            # a configuration measured with one of our verl fixes off is another configuration
            off = _fixes_off(r, runs, provs, rate=not doc.get("rank_rehearsal"))
            cap += "".join(f", --verl-fix-off {f}" for f in off)
            # and so is one measured before the recipe's deltas moved on: name the keys that differ
            if runs[0] and (r.dir / runs[0] / CONFIG).is_file():
                moved = drift_label(r, r.dir / runs[0])
                cap += f", {moved}" if moved else ""
            peak, tput, step = _figures(doc)
            rank = doc.get("rank_rehearsal")
            if rank:  # one GPU stood in for one rank: its memory is that rank's, its speed not the job's
                cap += f"; rank rehearsal ({rank['rank']} of {rank['world']})"
                tput = step = None
            card = catalogued(gpu_name)
            offer = pick_offer(offers, card.id) if card is not None else None
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


def _fixes_off(r: Recipe, runs: list[Any], provs: list[Provenance], rate: bool) -> list[str]:
    """The verl fixes a row's runs went without that change its memory, or its rate where the row
    shows one (`rate`; a rank rehearsal's is not the job's), as `plan` judges them
    (`plan.runs.lacks`): turned off, or not written yet when the run was made. The row names each
    as the `--verl-fix-off` that reproduces it, so the table prices no run as the recipe that
    `plan` would not. A run whose config cannot be read back (another training loop) keeps what
    its record names off."""

    off = {f for p in provs for f in p.verl_fixes_off or []}
    for rel in runs:
        if not rel or not (r.dir / rel / SUMMARY).is_file():
            continue
        run = read_run(r.dir / rel)
        if not run.provenance.verl:
            continue
        try:
            rs = run_setup(run)
        except RecipeError:
            continue
        off |= {f for what in ("device memory", "rate") if rate or what != "rate" for f in lacks(run, rs, what)}
    return sorted(off)


@dataclass(frozen=True)
class PlanRow:
    """One recipe and variant as the planner sees it on every catalogued GPU type."""

    recipe: Recipe
    variant: str | None
    world: int
    #: (GPU, peak GiB, why it does not fit or None, "calibrated" where a committed calibrated
    #: prediction for the layout on that GPU decides, as `plan` judges it, else None, and the
    #: verdict in `plan`'s three words: fits, tight, does not fit, `predict.margin`)
    cells: list[tuple[Any, float, str | None, str | None, str]]


_ROWS: dict[tuple[tuple[str, int], ...], list[PlanRow]] = {}


def plan_rows(recipes: dict[str, Recipe] | None = None) -> list[PlanRow]:
    """Every recipe and variant planned on every catalogued GPU, with the GPU count it is written for
    (composes each against verl's config: the slow part of both plan tables, about 10 s).

    The checkout's own recipes are planned once per process while none of their files changes (the
    key is every recipe file's path and modification time): the front README, recipes/README.md and
    `plan` each read the same rows."""
    if recipes is None:
        key = tuple((str(p), p.stat().st_mtime_ns) for p in sorted((repo_root() / "recipes").glob("*/**/*.yaml")))
        if key not in _ROWS:
            _ROWS.clear()
            _ROWS[key] = _plan_rows(discover())
        return _ROWS[key]
    return _plan_rows(recipes)


def _plan_rows(recipes: dict[str, Recipe]) -> list[PlanRow]:

    gpus = list(catalogue().values())
    c = Constants()
    spread = load_spread()
    out = []
    for r in recipes.values():
        for variant in [None, *r.variants]:
            _, setup, _ = load_setup(r.id, [variant] if variant else [], [])
            cells: list[tuple[Any, float, str | None, str | None, str]] = []
            for g in gpus:
                p = plan_gpu(setup, g, c)
                peak = p.peak.total / GIB
                cal = calibrated(r, [variant] if variant else [], setup, g)
                # the same verdict `plan` gives: the calibrated figure decides, with its margin
                word = verdict_margin(setup, p, cal, c, spread)
                if cal is not None:
                    fig = cal.peak_bytes / GIB
                    cells.append(
                        (g, fig, None if cal.fits else f"{fig:.1f} ({cal.peak_phase})", "calibrated", word.word)
                    )
                elif p.fits:
                    cells.append((g, peak, None, None, word.word))
                elif p.peak.total > g.visible_bytes:
                    cells.append((g, peak, f"{peak:.1f} ({p.peak.phase})", None, word.word))
                else:  # the sum fits, vLLM does not (no KV cache, or no room to start)
                    why = next((q for q in p.problems if " needs " not in q), "does not fit")
                    cells.append((g, peak, why.split(":")[0], None, word.word))
            out.append(PlanRow(r, variant, setup.world, cells))
    return out


def plans_table(recipes: dict[str, Recipe] | None = None, rows: list[PlanRow] | None = None) -> str:
    """Predicted per-GPU peak of every recipe and variant on every catalogued GPU type.

    The question users ask before renting ("which GPUs does this job need, will it fit") for the
    recipes not measured yet, answered by the same planner `plan --errors` checks against every
    measured run. A cell is the predicted peak over the step's phases in GiB per GPU, with the GPU
    count the recipe is written for, after the verdict in `plan`'s three words: "fits", "tight"
    (under the card by less than the margin that moves it, `predict.margin`), "does not fit",
    which names the phase, or says why vLLM cannot run when the phases' sum would fit.
    """
    rows = rows if rows is not None else plan_rows(recipes)
    gpus = [c[0] for c in rows[0].cells] if rows else []
    out = [
        "| recipe | configuration | GPUs | " + " | ".join(f"{g.id} ({g.visible_gib:.0f})" for g in gpus) + " |",
        "|---|---|---|" + "---|" * len(gpus),
    ]
    for row in rows:
        cells = [
            (f"{word} {peak:.1f}" if why is None else f"{word}: {why}") + (f" {basis}" if basis else "")
            for _, peak, why, basis, word in row.cells
        ]
        out.append(f"| {row.recipe.id} | {row.variant or 'default'} | {row.world} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def variant_summary(recipe: Recipe, variant: str | None) -> str:
    """A variant in the user's words: the first sentence of its config file's header comment
    (`# Variant NAME: what it is for, ...`), without where it is layered."""
    if variant is None:
        return "as written"
    lines = []
    for line in (recipe.dir / recipe.variants[variant]).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines).split(":", 1)[-1].strip()
    first = text.split(". ")[0].split(", layered on")[0].split(": ")[0].split("; ")[0].rstrip(".")
    return first or variant


def gpus_table(recipes: dict[str, Recipe] | None = None, rows: list[PlanRow] | None = None) -> str:
    """The front door's table: each job in the user's words, and on which GPU types it fits.

    For a job of several GPUs the last column names what stands behind it (`plan.evidence`): a full
    run, a rank rehearsal (one GPU as one rank: that rank's memory, not the job's speed), or none.

    Predicted by the planner for the GPU count the recipe is written for; the measured figures
    and the planner's error against them are one link away."""
    rows = rows if rows is not None else plan_rows(recipes)
    gpus = [c[0] for c in rows[0].cells] if rows else []
    out = [
        "| job | setting | GPUs | "
        + " | ".join(f"{g.id.split('-')[0].upper()} {g.memory_bytes / GIB:.0f} GB" for g in gpus)
        + " | measured |",
        "|---|---|---|" + "---|" * (len(gpus) + 1),
    ]
    for row in rows:
        r = row.recipe
        cells = [
            (f"{word} ({peak:.0f} GiB" + (f", {basis})" if basis else ")"))
            if why is None
            else (word + (f" ({basis})" if basis else ""))
            for _, peak, why, basis, word in row.cells
        ]
        job = f"[{r.title}](recipes/{r.id}/README.md)" if row.variant is None else ""
        setting = variant_summary(r, row.variant) + ("" if row.variant is None else f" (`--variant {row.variant}`)")
        measured = ""
        if row.variant is None:
            n = len(r.expected)
            measured = (
                f"[{n} configuration{'s' if n > 1 else ''}](recipes/README.md#measured-results)" if n else "not yet"
            )
        if row.world > 1:  # a job of several GPUs: a full run, a rehearsed rank, or nothing behind it
            found = behind(r, [row.variant] if row.variant else [], row.world)
            links = [
                f"[{'rank ' + str(e.rank) + ' of ' + str(e.world) + ' rehearsed' if e.rank is not None else 'full run'}"
                f"{f' at {e.layers} layers' if e.layers else ''}"
                f"{f' at {e.cap_gib:g} GiB' if e.cap_gib else ''}{sets_words(e.sets)}]"
                f"(recipes/{r.id}/expected/{e.path.name})"
                for e in found
            ]
            measured = "; ".join([x for x in (measured if row.variant is None else "", *links) if x])
        out.append(f"| {job} | {setting} | {row.world} | " + " | ".join(cells) + f" | {measured} |")
    return "\n".join(out)


def _run_date(recipe: Recipe, doc: dict[str, Any]) -> str | None:
    """The newest start date (YYYY-MM-DD) of the committed runs behind a bounds file."""
    dates = [str(v.get("date_utc") or "") for v in (doc.get("provenance") or {}).values() if isinstance(v, dict)]
    for run in doc.get("source_runs") or ():
        dates.append(read_provenance(recipe.dir / str(run)).date_utc or "")
    return max((d[:10] for d in dates if d), default=None)


def _algo(r: Recipe) -> str:
    """The run-name word of the recipe's own algorithm (`gae` is PPO)."""
    return "ppo" if r.algorithm.lower() in ("ppo", "gae") else r.algorithm.lower()


def status_block(recipes: dict[str, Recipe] | None = None) -> str:
    """recipes/README.md's status, from the tree: per recipe, whether the job as written ran on its
    own GPUs, what else ran (rank rehearsals, truncated depths, caps), and each prediction with its
    peak; dated by the newest committed run behind a bounds file, so it never says less than the
    tree holds."""

    recipes = recipes if recipes is not None else discover()
    lines: list[str] = []
    newest: list[str] = []
    for r in recipes.values():
        whole, same, ranks, other, predicted = [], 0, 0, 0, []
        for f in sorted((r.dir / "expected").glob("*.yaml")):
            doc = yaml.safe_load(f.read_text()) or {}
            if doc.get("status") == "predicted":
                t = doc.get("target") or {}
                gib = doc.get("predicted_gib") or {}
                peak = max(gib.values(), default=0.0)
                verdict = "fits" if doc.get("fits") else "does not fit"
                predicted.append(
                    f"[{f.stem}]({r.id}/expected/{f.name}) {peak:.1f} GiB in {doc.get('peak_phase')}, "
                    f"{verdict} {t.get('gpu')}"
                )
                continue
            date = _run_date(r, doc)
            if date:
                newest.append(date)
            name = parse_bounds_name(f.name, r.variants)
            if name.rank is not None:
                ranks += 1
            elif name.n == r.gpus.count and name.layers is None and name.cap_gib is None:
                if name.variants or name.labels or name.algo != _algo(r):
                    same += 1
                    continue
                peak, _, step = _figures(doc)
                figs = ", ".join(
                    x
                    for x in (
                        f"{peak:.1f} GiB" if peak is not None else "",
                        f"{step:.1f} s a step" if step is not None else "",
                    )
                    if x
                )
                whole.append(f"[{f.stem}]({r.id}/expected/{f.name}) ({figs})")
            else:
                other += 1
        parts = [
            f"the job as written, on its {r.gpus.count} GPU(s), measured: " + "; ".join(whole)
            if whole
            else f"the job as written, on its {r.gpus.count} GPU(s), not measured yet"
        ]
        if same:
            parts.append(f"{same} of its variants or settings measured on the same GPU(s)")
        if ranks:
            parts.append(f"{ranks} configuration(s) measured as rank rehearsals (one GPU as one rank of the job)")
        if other:
            parts.append(f"{other} other measured configuration(s) (other GPU counts, depths or caps)")
        if predicted:
            parts.append("predicted, not measured: " + "; ".join(predicted))
        lines.append(f"- `{r.id}`: " + "; ".join(parts) + ".")
    date = max(newest, default="no run")
    head = (
        f"Generated from the bounds files in `expected/` (`verl-recipes docs --write`), as of the newest run "
        f"behind them ({date}); every figure is in the results table above, every prediction in its file."
    )
    return "\n".join([head, "", *lines])


def _splice(text: str, begin: str, end: str, body: str, where: str) -> str:
    if begin not in text or end not in text:
        raise RecipeError(f"{where} has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render(text: str, blocks: dict[str, str], where: str = "README.md") -> str:
    """`text` with each `<!-- NAME:begin -->` ... `<!-- NAME:end -->` block replaced by blocks[NAME]."""
    for name, body in blocks.items():
        text = _splice(text, f"<!-- {name}:begin -->", f"<!-- {name}:end -->", body, where)
    return text


def generated(root: Path | None = None) -> dict[Path, str]:
    """Each file with generated tables, as `docs --write` would write it: the front README's GPU
    table, and recipes/README.md's recipe, measured-results and predicted-fit tables."""
    root = root or repo_root()
    rows = plan_rows()
    front, detail = root / "README.md", root / "recipes" / "README.md"
    lora = root / "recipes" / "7b-lora" / "README.md"
    # the tables link from the checkout's root; recipes/README.md sits in recipes/
    tables = {
        "recipes": recipe_table(),
        "results": results_table(),
        "plans": plans_table(rows=rows),
        "status": status_block(),
    }
    front_blocks = {
        "gpus": gpus_table(rows=rows),
        "peers": peers_table.tables("recipes/7b-lora/", root),
        "throughput": throughput_table.table("recipes/7b-lora/", root),
    }
    return {
        front: render(front.read_text(), front_blocks, "README.md"),
        detail: render(
            detail.read_text(), {k: v.replace("](recipes/", "](") for k, v in tables.items()}, "recipes/README.md"
        ),
        lora: render(
            lora.read_text(),
            {"peers": peers_table.tables("", root), "throughput": throughput_table.table("", root)},
            "recipes/7b-lora/README.md",
        ),
        root / peers_table.INDEX.with_name("peers.md"): peers_compose.markdown(),
        root / INDEX: recipe_index(),
    }


#: what noxfile.py reads to name its sessions (JSON: nox runs before PyYAML or this package is installed)
INDEX = "recipes/index.json"


def recipe_index(recipes: dict[str, Recipe] | None = None) -> str:
    """recipes/index.json: each recipe's id, title, GPU count and smoke steps, as noxfile.py needs them.

    `pip install nox` brings no YAML parser, and `nox -l` must work on a machine that has only
    Python and nox; so the sessions are named from this file, generated from recipe.yaml by the
    same `docs --write` as the README tables, and tests/test_docs.py fails when it is stale.
    """

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
    p = sub.add_parser("docs", help="regenerate the READMEs' tables from the metadata and the committed runs")
    p.add_argument("--write", action="store_true", help="rewrite README.md and recipes/README.md in place")
    p.add_argument(
        "--results",
        action="store_true",
        help="print the measured-results table of every recipe (memory, speed, cost per million tokens)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.results:
        print(results_table())
        return 0
    if not args.write:
        print(recipe_table())
        return 0
    for path, text in generated().items():
        inflight.write_text(path, text, str(path.relative_to(repo_root())))
        print(f"wrote {path}")
    return 0
