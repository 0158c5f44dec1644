"""`verl-recipes plan`: predicted per-phase, per-GPU peak memory of a verl configuration.

    verl-recipes plan 7b-lora --variant 24gib --gpu a10g-24g --gpu 24GiB
    verl-recipes plan my-config.yaml --arch llama-2-7b --set data.train_batch_size=16 --json
    verl-recipes plan 70b-3d --variant tp1pp1 --gpus 1 --layers 2 --gpu h200-141g
    verl-recipes plan --errors [--tolerance 0.10] [--allow-empty]
    verl-recipes plan --speed-errors [--write validation/speed-errors.md]
    verl-recipes plan 70b-3d --gpu h100-80g --from-layers RUN_L2 RUN_L4 --write recipes/70b-3d/expected/h100x32-ppo.yaml
    verl-recipes plan run_qwen2-7b.sh [-- KEY=VALUE ...]      (a verl script as written; also --verl-script)
    verl-recipes plan --verl-example grpo-qwen3-8b             (an entry of validation/verl-examples/suite.yaml)
    verl-recipes plan -- python3 -m verl.trainer.main_ppo KEY=VALUE ...

A recipe id is composed exactly as `verl-recipes train` composes it (verl's Hydra config, the
recipe's deltas and variants, the recipe's GPU count or `--gpus`, then `--set`; `--layers` truncates the
model as `train --layers` does); a path is a file of deltas
on verl's `ppo_trainer` (or `--config-name`). The model's config.json comes from the recipe, or
`--arch` (a bundled name or a path), or `actor_rollout_ref.model.path`/config.json.

A gate a script can trust: with `--gpu`, the verdict of the worst GPU named is the exit status,
in three words (`verl_recipes.predict.margin`): 0 fits, 3 tight (under the card by less than the
margin that moves the peak, which `plan` states part by part, with what buys it), 1 does not fit;
2 is bad input, as everywhere. Where the recipe commits a calibrated prediction for the layout
(`expected/*.yaml`, status predicted), it decides the verdict, beside the planner's own figure
(`verl_recipes.plan.advice`); a recipe variant that fits is named before any knob, and every
suggestion shows its host RAM.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import GIB, RecipeError, cli_types, inflight
from verl_recipes.fixes import FIXES, LAYERED_SUMMON_FIX, MERGE_FIX
from verl_recipes.paths import repo_root
from verl_recipes.plan.advice import (
    Advice,
    Calibrated,
    calibrated,
    excess,
    fitting_variants,
    judged_gpu,
    measured,
    verdict,
    verdict_margin,
)
from verl_recipes.plan.errors import main_errors
from verl_recipes.plan.evidence import behind_line
from verl_recipes.plan.layers import document, predict, render
from verl_recipes.plan.render import Judgement, plan_json, render_text
from verl_recipes.plan.runs import capped_runs, memory_run, rate_run, unpriced_runs
from verl_recipes.plan.speed_errors import main_speed_errors
from verl_recipes.plan.verl_script import compose_job, header, suite_plans, suite_table, with_summary
from verl_recipes.predict.budgets import TOLERANCE, largest
from verl_recipes.predict.cost import compute_cost, from_verl_throughput, load_prices, pick_offer, prices_file
from verl_recipes.predict.gpus import GPU, catalogue, parse_gpu
from verl_recipes.predict.host import plan_host
from verl_recipes.predict.inputs import Setup
from verl_recipes.predict.knobs import helpful, path_to_fit
from verl_recipes.predict.margin import EXIT, TIGHT, Margin, margin
from verl_recipes.predict.phases import Constants, GPUPlan, plan_gpu
from verl_recipes.predict.setup import load_setup
from verl_recipes.predict.speed import estimate
from verl_recipes.recipe.metadata import Recipe
from verl_recipes.recipe.run_config import Composition
from verl_recipes.recipe.verl_load import load_job


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser(
        "plan",
        help="predict per-phase, per-GPU peak memory of a verl configuration",
        epilog="exit status: 0 the job fits every --gpu named (or none is named: plan only informs); "
        "1 it does not fit a --gpu named; 2 bad input (one error: line)",
    )
    p.add_argument("target", nargs="?", help="recipe id, a path to a config.yaml of deltas, or a verl script (.sh)")
    p.add_argument(
        "rest", nargs="*", help="after --: a verl command line, or with a script the words its $@ passes to verl"
    )
    p.add_argument("--verl-script", type=Path, metavar="PATH", help="a verl job's bash script, as its users write it")
    p.add_argument("--verl-example", metavar="NAME", help="a verl example of validation/verl-examples/suite.yaml")
    p.add_argument(
        "--verl-examples",
        action="store_true",
        help="the table of every verl example of the suite (with --write: validation/verl-examples/table.md)",
    )
    p.add_argument("--variant", action="append", default=[], help="a recipe variant (repeatable)")
    p.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="ID|NGiB",
        help=f"GPU to judge against (repeatable): {', '.join(catalogue())} or a size like 24GiB; default: all of them",
    )
    cli_types.add_set_option(p)
    p.add_argument("--arch", help="bundled arch name or path to a config.json (for a config path)")
    p.add_argument(
        "--gpus",
        type=cli_types.count,
        help="GPUs on one node, as `train --gpus N` runs it (a scaled-down run; default: the recipe's layout)",
    )
    p.add_argument(
        "--layers", type=cli_types.count, help="the model truncated to this many layers, as `train --layers N` makes it"
    )
    p.add_argument("--config-name", default=None, help="verl root config for a path (default ppo_trainer)")
    p.add_argument("--tokens-per-s", type=cli_types.positive, help="whole-job tokens/s, for a cost estimate per step")
    p.add_argument("--provider", help="price this provider's offer (validation/prices.yaml) instead of the cheapest")
    p.add_argument(
        "--verl-fix-off",
        action="append",
        default=[],
        metavar="NAME",
        choices=list(FIXES),
        help=f"plan the run `train --verl-fix-off NAME` makes (host RAM: {MERGE_FIX}, {LAYERED_SUMMON_FIX})",
    )
    p.add_argument(
        "--budgets",
        action="store_true",
        help="the largest token budgets and vLLM settings that fit each --gpu, as --set lines, with the "
        "step they predict (verl_recipes.predict.budgets, .speed)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--errors", action="store_true", help="the planner's error against every committed measured run")
    p.add_argument(
        "--speed-errors",
        action="store_true",
        help="the step-time model's error against every committed run's verl timings (verl_recipes.plan.speed_errors)",
    )
    p.add_argument("--tolerance", type=cli_types.positive, default=0.10, help="--errors: allowed relative error (0.10)")
    p.add_argument("--allow-empty", action="store_true", help="--errors: pass when no run is committed")
    p.add_argument(
        "--from-layers",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="runs of the target's widths truncated in depth (two depths or more per layout): scale the "
        "planner's per-layer and fixed terms by what they measured (verl_recipes.plan.layers); one --gpu",
    )
    p.add_argument(
        "--write",
        type=Path,
        help="--errors, --speed-errors: also write the error table (Markdown) here; "
        "--from-layers: write the predicted file here",
    )
    p.set_defaults(func=run)


def _unpriced_line(s: Setup, recipe_id: str) -> str:
    """The cost line of a job no committed run prices (`runs.rate_run`): why the runs of its
    configuration do not, so the user knows what a `--tokens-per-s` of their own stands in for."""
    capped = capped_runs(s, recipe_id)
    if capped:
        caps = ", ".join(
            f"{r.run_dir.name} {r.per_gpu_throughput:,.0f} tokens/s per GPU under {r.provenance.cap_gib:g} GiB"
            for r in capped
        )
        return (
            f"cost: this configuration's committed runs ran on a larger GPU under --cap-gib ({caps}): "
            "that measures a card of the cap's size in memory, not in speed; pass --tokens-per-s"
        )
    unfixed = unpriced_runs(s, recipe_id)
    if unfixed:
        (newest, off), older = unfixed[0], len(unfixed) - 1
        return (
            f"cost: the newest committed run of this configuration, {newest.run_dir.name} "
            f"({newest.per_gpu_throughput:,.0f} tokens/s per GPU), went without {', '.join(off)}, which "
            f"changes the rate{f' (so did {older} older run(s))' if older else ''}: its rate is not the "
            "recipe's; pass --tokens-per-s"
        )
    return "cost: no committed run of this configuration measured a rate; pass --tokens-per-s"


def _costs(
    s: Setup, gpus: list[GPU], tokens_per_s: float | None, provider: str | None, label: str, recipe: Any
) -> tuple[list[str], list[dict[str, Any]]]:
    rate, where = tokens_per_s, "--tokens-per-s"
    measured_on: str | None = None  # a measured rate prices only the GPU it was measured on
    if rate is None and recipe is not None:
        run = rate_run(s, recipe.id)
        if run is None:
            return [_unpriced_line(s, recipe.id)], []
        assert run.per_gpu_throughput is not None
        rate = from_verl_throughput(run.per_gpu_throughput, s.world)
        where = f"measured run {run.run_dir.name}: {run.per_gpu_throughput:,.0f} tokens/s per GPU x {s.world}"
        devs = run.provenance.gpu_names
        measured_on = devs[0] if devs else None
    if rate is None:
        return [], []
    offers = load_prices(prices_file())
    tokens = s.train_batch_size * s.rollout.n * s.seq_len
    lines = [f"cost at {rate:,.0f} tokens/s ({where}), {tokens} tokens per step (upper bound), {s.world} GPU(s):"]
    js = []
    for g in gpus:
        if measured_on is not None and not g.runs_as(measured_on):
            lines.append(f"  {g.id}: no throughput measured on it (the run was on {measured_on}); use --tokens-per-s")
            continue
        o = pick_offer(offers, g.id, provider)
        if o is None:
            lines.append(f"  {g.id}: no sourced price in validation/prices.yaml")
            continue
        c = compute_cost(o, s.world, rate, tokens)
        lines.append(
            f"  {g.id}: ${c.usd_per_step:.4f}/step ({c.step_seconds:.1f} s), ${c.usd_per_million_tokens:.2f} "
            f"per million tokens at {o.provider} ${o.usd_per_gpu_hour}/GPU-h ({o.date}, {o.source})"
        )
        js.append({**asdict(c), "offer": asdict(o)})
    return lines, js


def run(args: argparse.Namespace) -> int:
    if args.speed_errors:
        return main_speed_errors(write=args.write)
    if args.errors:
        return main_errors(args.tolerance, args.allow_empty, write=args.write)
    if args.verl_examples:
        rows = suite_plans()
        if not args.write:
            print(suite_table(rows), end="")
            return 0
        readme = repo_root() / "README.md"
        text = with_summary(readme.read_text(), rows)  # refused before anything is written
        inflight.write_text(args.write, suite_table(rows), "the table")
        inflight.write_text(readme, text, "README.md")
        print(f"wrote {args.write} and {readme}'s table of verl's examples")
        return 0

    vjob = load_job(args.target, args.rest, args.verl_script, args.verl_example, args.sets, args.arch)
    if vjob is not None:
        return _verl_job(args, vjob)
    if args.rest:
        raise RecipeError(f"{args.target} {' '.join(args.rest)}: one recipe or file; a verl command goes after --")
    if not args.target:
        raise RecipeError("give a recipe id, a config.yaml path or a verl script (or --errors)")
    if args.gpus is not None and args.gpus < 1:
        raise RecipeError(f"--gpus {args.gpus}: give at least 1")
    label, s, recipe = load_setup(
        args.target,
        args.variant,
        args.sets,
        args.arch,
        args.config_name,
        args.layers,
        gpus=args.gpus,
        fixes_off=args.verl_fix_off or (),
    )
    if args.from_layers:
        return _from_layers(args, s)
    if args.budgets:
        if args.json or args.tokens_per_s:
            raise RecipeError(
                "--budgets prints its own predicted rate and cost as text; drop --json and --tokens-per-s"
            )
        print(budgets_text(label, s, [parse_gpu(g) for g in args.gpu] or [catalogue()["h100-80g"]], args.provider))
        return 0
    if args.write:
        raise RecipeError("--write goes with --errors or --from-layers")
    gpus = [parse_gpu(g) for g in args.gpu]
    asked = Composition(tuple(args.variant), tuple(args.sets), args.gpus, args.layers, tuple(args.verl_fix_off))
    j = judgement(label, s, recipe, asked, gpus, args.tokens_per_s, args.provider)
    print(json.dumps(plan_json(j), indent=2) if args.json else render_text(j))
    return gate(j, gpus)


def gate(j: Judgement, gpus: list[GPU]) -> int:
    """plan's exit status, for a recipe and a verl job alike: with --gpu, the worst verdict of the
    GPUs named (predict.margin.EXIT: 0 fits, 3 tight, 1 does not fit); without, plan only informs."""
    return max(EXIT[m.word] for m in j.margins.values()) if gpus else 0


def _verl_job(args: argparse.Namespace, vjob: Any) -> int:
    """`plan` of a verl job: the header of what was mapped and not modelled, then the plan."""

    for flag, given in (("--variant", args.variant), ("--gpus", args.gpus), ("--from-layers", args.from_layers)):
        if given:
            raise RecipeError(f"{flag} applies to recipes; a verl job sets its layout with trainer.* (--set)")
    if args.write:
        raise RecipeError("--write goes with --errors or --from-layers")
    _, s = compose_job(vjob, args.layers, args.verl_fix_off)
    gpus = [parse_gpu(g) for g in args.gpu]
    label = f"{vjob.name}" + (f" at {args.layers} layer(s)" if args.layers else "")
    asked = Composition(layers=args.layers, fixes_off=tuple(args.verl_fix_off))
    j = judgement(label, s, None, asked, gpus, args.tokens_per_s, args.provider)
    lines = header(vjob)
    if args.json:
        doc = plan_json(j)
        doc["verl_job"] = {"source": vjob.source, "mapped": list(vjob.mapped), "header": lines}
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join([*lines, "", render_text(j)]))
    return gate(j, gpus)


def judgement(
    label: str,
    s: Setup,
    recipe: Recipe | None = None,
    asked: Composition | None = None,
    gpus: list[GPU] | None = None,
    tokens_per_s: float | None = None,
    provider: str | None = None,
) -> Judgement:
    """One configuration judged on `gpus` (default: every catalogued GPU): the plans, the evidence
    and the verdict per GPU with its margin (`predict.margin`), what would make it fit where it
    does not, what buys a tight one its margin, the host RAM and the cost."""
    asked = asked or Composition()
    fixes_off = asked.fixes_off
    gpus = gpus or list(catalogue().values())
    c = Constants()
    plans = [plan_gpu(s, g, c) for g in gpus]
    # the most reliable evidence per GPU: a committed run of this job there, else a committed
    # calibrated prediction, else the planner alone
    held_by = memory_run(s, recipe.id) if recipe is not None else None
    cals = {
        p.gpu.id: measured(recipe, s, p.gpu, held_by) or calibrated(recipe, asked.variants, s, p.gpu) for p in plans
    }
    fits = {p.gpu.id: verdict(p, cals[p.gpu.id]) for p in plans}
    margins = {p.gpu.id: _margin(s, p, cals[p.gpu.id], c) for p in plans}
    advice: dict[str, Advice] = {}
    for p in plans:
        if fits[p.gpu.id]:
            continue
        # where the calibration shows the planner short, knobs and variants are judged on a card
        # smaller by that much, so nothing is suggested that the calibrated figure would not hold
        extra = excess(p, cals[p.gpu.id])
        g = judged_gpu(p.gpu, extra)
        sg = helpful(s, g, c)
        same = path_to_fit(s, g, c, more_gpus=False)
        advice[p.gpu.id] = Advice(
            judged_against=g if extra else None,
            variants=fitting_variants(recipe, asked, g),
            best=sg[0] if sg else None,
            path=same,
            more_gpus_path=None if same else path_to_fit(s, g, c),
        )
    headroom = {
        p.gpu.id: _headroom(recipe, asked, s, p, cals[p.gpu.id], margins[p.gpu.id], c)
        for p in plans
        if margins[p.gpu.id].word == TIGHT
    }
    cost_lines, cost_js = _costs(s, gpus, tokens_per_s, provider, label, recipe)
    # a job of several GPUs: say whether a full run, a rehearsed rank or nothing stands behind it
    behind = behind_line(recipe, asked.variants, s.world) if recipe is not None and s.world > 1 else None
    return Judgement(
        label,
        s,
        plans,
        c,
        dict(cals),
        fits,
        advice,
        plan_host(s, fixes_off),
        fixes_off,
        cost_lines,
        cost_js,
        behind,
        margins,
        headroom,
    )


def _margin(s: Setup, p: Any, cal: Any, c: Constants) -> Margin:
    """The verdict's figure (the calibrated or measured one where there is one, else the
    planner's) against its card, with the band that moves it (`advice.verdict_margin`)."""
    return verdict_margin(s, p, cal, c)


def _headroom(
    recipe: Recipe | None, asked: Composition, s: Setup, p: GPUPlan, cal: Calibrated | None, m: Margin, c: Constants
) -> Advice:
    """What buys a tight job its margin on one GPU: the recipe's variants and the planner's knobs
    judged on the card less the band (and less what a calibration adds to the planner); of the
    knobs that buy it, one that keeps what is trained (not LoRA, not bf16 master weights) first."""
    g = judged_gpu(p.gpu, excess(p, cal) + m.band)
    sg = [x for x in helpful(s, g, c) if x.plan.fits and x.knob.setup.world == s.world]
    sg.sort(key=lambda x: x.knob.changes_training)  # stable: the lowest peak first within each kind
    return Advice(
        judged_against=g,
        variants=fitting_variants(recipe, asked, g),
        best=sg[0] if sg else None,
        path=path_to_fit(s, g, c, more_gpus=False) if not sg else None,
    )


def budgets_text(label: str, s: Setup, gpus: list[GPU], provider: str | None = None) -> str:
    """`plan --budgets`: per GPU, the largest settings that fit (`predict.budgets`), the peaks with
    them, and the step they predict (`predict.speed`) with its cost per million tokens."""

    gib = 1024**3
    lines = [
        f"budgets: {label}: the largest that fit, every trainer term taken {TOLERANCE:.0%} larger "
        "(PREDICTED; verl_recipes/predict/budgets.py)"
    ]
    offers = load_prices(prices_file())
    for g in gpus:
        b = largest(s, g)
        lines.append(f"{g.id}:")
        lines += [f"  --set {x}" for x in b.sets()]
        peaks = ", ".join(f"{p.phase} {p.total / gib:.1f}" for p in b.plan.phases)
        lines.append(f"  peaks with them, GiB of {g.visible_gib:.1f}: {peaks}; KV cache {b.plan.kv_tokens:,} tokens")
        if not (g.bandwidth and g.bf16_flops):
            lines.append("  step: no bandwidth or bf16 rate for this card in predict/gpus.yaml")
            continue
        e = estimate(b.applied(s), g)
        d, pr = e.decode, e.priors
        lines.append(
            f"  decode roofline: {d.concurrent} sequences at once, {d.step_ms:.1f} ms a decode step (weights + KV "
            f"read / {g.bandwidth / 1e12:.2f} TB/s), {d.tokens_per_s:,.0f} generated tokens/s, "
            f"{d.rollout_s:.0f} s for {d.sequences} x {d.response_tokens} tokens"
        )
        phases = ", ".join(f"{k} {v:.0f} s" if v >= 10 else f"{k} {v:.1f} s" for k, v in e.phases.items())
        lines.append(
            f"  step, PREDICTED ({pr.describe()}; predict/speed_fits.yaml; {g.bf16_flops / 1e12:.0f} TFLOPS, "
            f"every sequence at full length): {phases}; "
            f"{e.step_s:.0f} s a step, {e.tokens:,} tokens, {e.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; "
            f"a run of 2 / 3 / 4 steps with a {pr.start_s:.0f} s start: "
            + " / ".join(f"{e.run_s(n):.0f}" for n in (2, 3, 4))
            + " s"
        )
        o = pick_offer(offers, g.id, provider)
        if o is not None:
            c = compute_cost(o, s.world, e.tokens_per_s_per_gpu * s.world, e.tokens)
            lines.append(
                f"  cost at that rate, PREDICTED: ${c.usd_per_million_tokens:.2f} per million tokens, "
                f"${c.usd_per_step:.3f} a step at {o.provider} ${o.usd_per_gpu_hour}/GPU-h ({o.date}, {o.source})"
            )
    return "\n".join(lines)


def _from_layers(args: argparse.Namespace, s: Setup) -> int:
    """`plan TARGET --gpu G --from-layers RUN...`: the truncated-depth calibration (plan/layers.py)."""
    if len(args.gpu) != 1:
        raise RecipeError("--from-layers predicts for one GPU type: give exactly one --gpu (e.g. --gpu h100-80g)")
    gpu = parse_gpu(args.gpu[0])
    result, fits = predict(s, gpu, args.from_layers)
    peak = result["peak_phase"]
    word = margin(
        s,
        peak,
        round(result["predicted_gib"][peak] * GIB),
        gpu.visible_bytes,
        Constants().nccl_bytes_per_communicator,
        starts=bool(result["fits"]),
    ).word
    print(render(result, fits, gpu, word))
    if args.write:
        command = shlex.join(["verl-recipes", "plan", *sys.argv[2:]]) if len(sys.argv) > 2 else "verl-recipes plan"
        doc = document(args.target, args.variant, s, gpu, result, fits, command)
        header = (
            "# PREDICTED, not measured: no run of every GPU of this job stands behind it. Written by\n"
            f"# `{command}`\n# from the runs under `fit`: fewer layers, or one rank rehearsed at this layout\n"
            "# (verl_recipes/plan/layers.py says how).\n"
        )
        inflight.write_text(args.write, header + yaml.safe_dump(doc, sort_keys=False, width=110), "the prediction")
        print(f"wrote {args.write}")
    return 0
