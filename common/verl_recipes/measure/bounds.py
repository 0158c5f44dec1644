"""`verl-recipes check-bounds`: check measured runs against a recipe's expected bounds.

Bounds files live at `recipes/<id>/expected/<name>.yaml` (torchtitan keeps expected losses per
GPU the same way) and are written from real runs by `verl-recipes check-bounds --write-bounds RUN...`:
upper bound = largest measured x 1.05, lower bound = smallest measured x 0.8, for the NVML device
peak of every phase on every GPU, the median step time and the median throughput over steps 2+
(`rundir.steady_steps`: step 1 carries compile and warm-up). Each file names
the runs it came from (`source_runs`, folders under the recipe's results/) and their provenance.
Several runs of one configuration give honest bands where a 10 Hz sampler sees a short-lived peak
in some runs and not in others (vLLM's KV cache coming back at the very end of update_weights).

A lower memory bound matters too: memory far under the bound means the run did not do the work the
recipe describes (a smaller batch, a skipped critic), so it fails as loudly as an overrun. Time is
one-sided: a slower step (or fewer tokens/s) than the band fails; a faster one passes with a note
to refresh the bounds.

A verl example of the suite (`--verl-example NAME` instead of a recipe id) keeps its bounds the
same way under validation/verl-examples/expected/NAME/, its runs under results/NAME/
(`recipe.verl_suite.example_recipe`).

GPUs are compared by their position in the run (0 = the run's first GPU), not by NVML index, so a
run on CUDA_VISIBLE_DEVICES=1 is checked against bounds measured on GPU 0.

Host RAM is bounded too, where a run measured it: the peak RSS of the run's process tree, read at
2 Hz, with the same two-sided margins (an offloaded recipe that holds far less RAM than its bounds
did not offload). PSS is kept in `measured` but never bounded: the monitor reads it minutes apart
and at RSS highs, not at 2 Hz, so its largest read can fall below the true peak; in the committed
runs, read once a minute (`--full-mem-interval`), the same configuration's largest read was 32.16
GiB in h200x1-ppo and 20.27 GiB in h200x1-ppo-3. RSS counts shared pages once per
process, so the true PSS peak lies between the largest PSS read and the RSS peak. Both grow with the
host's cores (Ray starts more worker processes), so a host bound holds for hosts like the one its
runs had; the file's note names it. A rank rehearsal's host band holds for rank rehearsals that ran
the same share of the job's CPU worker pools (`host_comparable`): a rank that ran its share is not
held to the band of ranks that ran them whole, and the check says so.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError, cli_types, inflight
from verl_recipes.layout import POOLS_SHARED
from verl_recipes.recipe.metadata import Recipe, get_recipe
from verl_recipes.recipe.verl_suite import example_recipe
from verl_recipes.rundir import Summary, read_provenance, read_summary, steady_steps
from verl_recipes.worker.markers import VERL_PHASES

SCHEMA = "verl-recipes/expected/1"
UPPER, LOWER = 1.05, 0.8
#: phases whose peaks are bounded: verl's marked_timer names, as the report attributes them.
BOUNDED_PHASES = VERL_PHASES


def _ordinals(summary: Summary) -> dict[str, str]:
    """NVML index -> position of that GPU among the run's GPUs."""
    indices = sorted(int(g["index"]) for g in summary.get("gpus") or [] if "index" in g)
    return {str(idx): str(pos) for pos, idx in enumerate(indices)}


def measured(summary: Summary) -> dict[str, Any]:
    """The quantities bounds are set on: phase peaks per GPU, the host RAM peaks, median step time and
    throughput (steps 2+)."""
    mem: dict[str, dict[str, float]] = {}
    pos = _ordinals(summary)
    for phase, peaks in (summary.get("phases") or {}).items():
        if phase not in BOUNDED_PHASES:
            continue
        for gpu, v in (peaks.get("gpu") or {}).items():
            if v.get("used_gib") is not None:
                mem.setdefault(phase, {})[pos.get(str(gpu), str(gpu))] = float(v["used_gib"])
    steps = summary.get("steps") or []
    times = [t for s in steady_steps(steps) if (t := s.get("time_s"))]
    tput = [x for s in steady_steps(steps) if (x := s.get("throughput"))]
    peak = summary.get("peak")
    host = peak.get("host") if peak else None
    reads = (("rss", host.get("rss_gib") if host else None), ("pss", host.get("pss_gib") if host else None))
    return {
        "memory_gib": mem,
        "host_gib": {k: float(v) for k, v in reads if v is not None},
        "step_time_s": statistics.median(times) if times else None,
        "throughput_tok_s": statistics.median(tput) if tput else None,
        # the steps the run finished: one cut open (a crash, a host gone) has no time
        "steps": sum(1 for s in steps if s.get("time_s") is not None),
    }


def write_bounds(run_dirs: list[Path], out: Path, recipe: Recipe, note: str = "") -> dict[str, Any]:
    """Bounds from one or more real runs of one configuration, with each run's provenance."""
    ms = []
    for run_dir in run_dirs:
        m = measured(read_summary(run_dir))
        if not m["memory_gib"]:
            raise RecipeError(f"{run_dir}: the run has no per-phase GPU memory; bounds need an NVML-monitored run")
        ms.append(m)

    def lo_hi(values: list[float | None]) -> list[float] | None:
        xs = [x for x in values if x is not None]
        return [round(min(xs) * LOWER, 3), round(max(xs) * UPPER, 3)] if xs else None

    phases = sorted({ph for m in ms for ph in m["memory_gib"]}, key=list(BOUNDED_PHASES).index)
    mem_bounds: dict[str, dict[str, list[float] | None]] = {}
    for ph in phases:
        gpus = sorted({g for m in ms for g in m["memory_gib"].get(ph, {})}, key=int)
        mem_bounds[ph] = {g: lo_hi([m["memory_gib"].get(ph, {}).get(g) for m in ms]) for g in gpus}

    def source(run_dir: Path) -> str:
        try:
            return str(run_dir.resolve().relative_to(recipe.dir.resolve()))
        except ValueError:
            return str(run_dir)

    def prov(run_dir: Path) -> dict[str, Any]:
        p = read_provenance(run_dir).raw  # the bounds file quotes the record's own keys
        keys = (
            "date_utc",
            "command",
            "packages",
            "gpu",
            "git_commit",
            "variants",
            "sets",
            "cap_gib",
            "steps",
            "verl_fixes_off",
            "compile_cache",
            "rank_rehearsal",
            "backend",  # absent (None) for verl; `deepspeed` for verl-vs-deepspeed's other side
        )
        return {k: p.get(k) for k in keys}

    # One GPU standing in for rank R of N (`train --rank`) measures that rank, never the whole job:
    # the file says so, and one file holds one such configuration, its CPU worker pools included.
    provs = [read_provenance(r) for r in run_dirs]
    ranks = {p.rank_rehearsal for p in provs}
    if len(ranks) > 1:
        named = sorted(r.label if r else "the whole job" for r in ranks)
        raise RecipeError(f"--write-bounds: the runs stand in for different ranks ({named}); one file a rank")
    rank = ranks.pop()
    shared = {p.rank_pools_shared for p in provs}
    if rank and len(shared) > 1:
        raise RecipeError(
            "--write-bounds: some runs ran the job's whole CPU worker pools and some their rank's share "
            "(rank_rehearsal.pools in provenance.json): their host memory differs; one file each"
        )
    pools = {"pools": POOLS_SHARED} if rank and shared.pop() else {}

    doc = {
        "schema": SCHEMA,
        "recipe": recipe.id,
        "source_runs": [source(r) for r in run_dirs],
        **({"rank_rehearsal": {"rank": rank.rank, "world": rank.world, **pools}} if rank else {}),
        "note": note,
        "margins": {"upper": UPPER, "lower": LOWER},
        "measured": {source(r): m for r, m in zip(run_dirs, ms, strict=True)},
        "bounds": {
            "memory_gib": mem_bounds,
            **({"host_gib": {"rss": rss}} if (rss := lo_hi([m["host_gib"].get("rss") for m in ms])) else {}),
            "step_time_s": lo_hi([m["step_time_s"] for m in ms]),
            "throughput_tok_s": lo_hi([m["throughput_tok_s"] for m in ms]),
            "min_steps": min(m["steps"] for m in ms),
        },
        "provenance": {source(r): prov(r) for r in run_dirs},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    inflight.write_text(out, yaml.safe_dump(doc, sort_keys=False), "the bounds")
    return doc


def _two_sided(what: str, got: float | None, band: list[float] | None) -> list[str]:
    """A memory figure against its band: over or far under it is one line naming it."""
    if band is None:
        return []
    if got is None:
        return [f"{what} not measured (bound {band[0]}-{band[1]} GiB)"]
    if got > band[1]:
        return [f"{what} {got:.2f} GiB > upper bound {band[1]:.2f} GiB"]
    if got < band[0]:
        return [f"{what} {got:.2f} GiB < lower bound {band[0]:.2f} GiB"]
    return []


def host_comparable(run: Path, bounds_doc: dict[str, Any]) -> bool:
    """Whether `run`'s host memory can be held to the bounds' host band: a rank rehearsal that ran
    its share of the job's CPU worker pools holds several GiB less than one that ran them whole
    (`layout.JOB_POOLS`), so the two are judged only against their own kind."""
    prov = read_provenance(run)
    if not (prov.rank_rehearsal and bounds_doc.get("rank_rehearsal")):
        return True
    return prov.rank_pools_shared == (bounds_doc["rank_rehearsal"].get("pools") == POOLS_SHARED)


def check(
    summary: Summary, bounds_doc: dict[str, Any], label: str, judge_host: bool = True, judge_time: bool = True
) -> list[str]:
    """Every violated bound as one line naming the phase and GPU; empty when the run passes.
    `judge_host` False leaves the host band out (`host_comparable`). `judge_time` False prints the
    step time and throughput against their bands without judging them: a GPU test holds a run's
    memory, which a host does not move, and leaves speed to the benchmarks, which a host does (the
    GSM8K quickstart's rank 0 took 57.2 s a step on one H100 and 72.0 on another the same day, its
    memory within 1% in every phase, the slower host's CPUs 1.1-1.3 cores stolen in gen)."""
    m = measured(summary)
    b = bounds_doc["bounds"]
    errors: list[str] = []
    if m["steps"] < int(b.get("min_steps") or 0):
        errors.append(f"{label}: {m['steps']} steps measured, the bounds need at least {b['min_steps']}")
    for phase, gpus in (b.get("memory_gib") or {}).items():
        for gpu, band in gpus.items():
            got = m["memory_gib"].get(phase, {}).get(str(gpu))
            errors += _two_sided(f"{label}: phase {phase} GPU {gpu}:", got, band)
    rss_band = (b.get("host_gib") or {}).get("rss") if judge_host else None
    errors += _two_sided(f"{label}: host RSS peak", m["host_gib"].get("rss"), rss_band)
    # Time is one-sided: slower fails, faster only notes that the bounds could be refreshed.
    for key, unit, slower_is_high in (("step_time_s", "s", True), ("throughput_tok_s", "tokens/s", False)):
        band = b.get(key)
        got = m.get(key)
        if band is None:
            continue
        if not judge_time:
            shown = "not measured" if got is None else f"{got:.2f} {unit}"
            print(f"note: {label}: {key} {shown} against [{band[0]:.2f}, {band[1]:.2f}], not judged (--memory-only)")
        elif got is None:
            errors.append(f"{label}: {key} not measured")
        elif (got > band[1]) if slower_is_high else (got < band[0]):
            limit = band[1] if slower_is_high else band[0]
            errors.append(f"{label}: {key} {got:.2f} {unit} is slower than the bound {limit:.2f}")
        elif not band[0] <= got <= band[1]:
            print(
                f"note: {label}: {key} {got:.2f} {unit} is faster than [{band[0]:.2f}, {band[1]:.2f}]; "
                "refresh the bounds with --write-bounds if this holds"
            )
    return errors


def check_bounds(
    recipe: Recipe, run: Path | None = None, expected: str | None = None, judge_time: bool = True
) -> list[str]:
    names = [expected] if expected else recipe.expected
    if not names:
        raise RecipeError(
            f"recipe {recipe.id} has no expected/ bounds yet; measure a run and write them with "
            "`verl-recipes check-bounds --write-bounds RUN --out recipes/<id>/expected/<gpu>x<n>.yaml`"
        )
    errors: list[str] = []
    for name in names:
        path = recipe.dir / name
        if not path.is_file():
            have = ", ".join(recipe.expected) or "none"
            raise RecipeError(f"{path}: no such bounds file; recipe {recipe.id} has: {have}")
        doc = yaml.safe_load(path.read_text())
        if doc.get("status") == "predicted":
            raise RecipeError(
                f"{path}: a prediction from truncated runs (status: predicted), not measured bounds; "
                "measure the full configuration and write bounds with --write-bounds"
            )
        if doc.get("schema") != SCHEMA:
            raise RecipeError(f"{path}: schema: expected {SCHEMA}")
        sources = doc.get("source_runs") or [doc["source_run"]]
        for run_dir in [run] if run else [recipe.dir / s for s in sources]:
            judge_host = host_comparable(run_dir, doc)
            if not judge_host:
                print(
                    f"note: {recipe.id} {name}: host RSS not judged: the bounds' runs and {run_dir} ran "
                    "different shares of the job's CPU worker pools (rank_rehearsal.pools in provenance.json); "
                    "write bounds from runs like it with --write-bounds"
                )
            try:
                errs = check(read_summary(run_dir), doc, f"{recipe.id} {name}", judge_host, judge_time)
            except RecipeError as e:  # a summary cut short fails its own check; the others still run
                errs = [str(e)]
            print(f"{'FAIL' if errs else 'ok  '} {recipe.id} {name} <- {run_dir}")
            errors += errs
    return errors


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-bounds", help="check a run's memory and throughput against a recipe's bounds")
    p.add_argument("recipe", nargs="?")
    p.add_argument(
        "--verl-example",
        metavar="NAME",
        help="a verl example of validation/verl-examples/suite.yaml instead of a recipe: its bounds "
        "under validation/verl-examples/expected/NAME/, its runs under results/NAME/",
    )
    cli_types.add_set_option(
        p, "with --verl-example: a --set line the entry needs to map (as `train` and `plan` take it)"
    )
    p.add_argument("--run", type=Path, help="a run folder (default: each bounds file's source run)")
    p.add_argument("--expected", help="one bounds file, relative to the recipe folder")
    p.add_argument(
        "--memory-only",
        action="store_true",
        help="judge memory, host RAM and steps; print step time and throughput against their bands "
        "unjudged (what a GPU test holds: a host's CPUs move a step's time, not its memory)",
    )
    p.add_argument(
        "--write-bounds",
        type=Path,
        nargs="+",
        metavar="RUN",
        help="write bounds from these runs (one configuration) to --out",
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--note", default="")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if bool(args.recipe) == bool(args.verl_example):
        raise RecipeError("check-bounds: give a recipe id or --verl-example NAME (one of them)")
    if args.memory_only and args.write_bounds:
        raise RecipeError("check-bounds: --memory-only judges a run; --write-bounds writes bounds (give one of them)")
    if args.sets and not args.verl_example:
        raise RecipeError("check-bounds: --set applies to --verl-example; a recipe's runs name their own")
    recipe = example_recipe(args.verl_example, args.sets) if args.verl_example else get_recipe(args.recipe)
    if args.verl_example and not (recipe.expected or args.expected or args.write_bounds):
        raise RecipeError(
            f"verl example {recipe.id} has no bounds yet; measure a run and write them with `verl-recipes "
            f"check-bounds --verl-example {recipe.id} --write-bounds RUN --out "
            f"validation/verl-examples/expected/{recipe.id}/<run name>.yaml`"
        )
    if args.write_bounds:
        if not args.out:
            raise RecipeError("--write-bounds needs --out recipes/<id>/expected/<name>.yaml")
        write_bounds(args.write_bounds, args.out, recipe, args.note)
        print(f"wrote {args.out}")
        return 0
    errors = check_bounds(recipe, args.run, args.expected, judge_time=not args.memory_only)
    for e in errors:
        print(e)
    return 1 if errors else 0
