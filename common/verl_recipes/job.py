"""The job `verl-recipes train` runs, decided once from the command line.

`decide` reads the command line and this host (its GPUs) and returns a frozen `Job`: which recipe,
composed how, on which layout, with which model and data, into which run folder, under which caps
and budgets, and whether this host trains it or previews it. Everything that can be refused
from the command line alone is refused here, in one line, before anything is composed or written;
the pre-flight (`verl_recipes.preflight`) then judges the composed job, and the preview or the
launch (`verl_recipes.train`) carries it out. No later step reads the command line again.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_recipes import GIB, RecipeError
from verl_recipes.fixes import FIXES
from verl_recipes.layout import RankSpec
from verl_recipes.measure.provenance import gpus
from verl_recipes.plan.verl_script import header
from verl_recipes.predict.gpus import Budget, gpu_family_of
from verl_recipes.recipe.metadata import Recipe, get_recipe
from verl_recipes.recipe.run_config import Composition, Layout, default_data_dir, gpu_layout
from verl_recipes.recipe.run_names import RunName, algorithm, check_label, gpu_family
from verl_recipes.recipe.verl_load import load_job
from verl_recipes.workload import userpaths
from verl_recipes.workload.arch import resolve_arch
from verl_recipes.workload.synth import model_dir, shape_config


@dataclass(frozen=True)
class Model:
    """The checkpoint the job trains: the user's folder, or a synthetic one made before the run."""

    # the folder the composed config names (the user's --model, else where the synthetic one is made)
    path: Path
    # True for the user's --model: read, never written; False for a synthetic checkpoint
    theirs: bool
    # the bundled architecture (or config.json) a synthetic checkpoint is drawn from (--arch)
    arch: str
    # decoder layers of the checkpoint made here (None: all of the architecture's)
    layers: int | None
    # width of the checkpoint made here: "full-width", or "tiny" for a preview on a CPU
    scale: str
    # where its weights are drawn: "cuda" on a GPU host, "cpu" for a preview's tiny stand-in
    device: str
    # the shape the job trains, (layers, scale): what the pre-flight plans, even when a CPU makes
    # a tiny stand-in (--smoke: the recipe's smoke shape; else --layers at full width)
    trained: tuple[int | None, str]
    # --model-out: where the synthetic checkpoint goes instead of the cache
    out: Path | None
    # False: config and tokenizer only, the trainer initialises its weights (a Megatron rank
    # rehearsal on a GPU host: a 70B checkpoint does not fit its disk)
    weights: bool = True

    def config(self) -> tuple[dict[str, Any], str]:
        """The config.json the job trains, and where it comes from: the user's folder (checked), or
        the shape the GPU host's synthetic checkpoint has (`trained`), as `synth-model` writes it."""
        if self.theirs:
            return userpaths.check_model_dir(self.path), str(self.path / "config.json")
        layers, scale = self.trained
        return shape_config(resolve_arch(self.arch), layers, scale), f"{self.arch} ({scale}, {layers or 'all'} layers)"


@dataclass(frozen=True)
class Job:
    """One run of a recipe, as `train` carries it out: the only thing later steps read."""

    # the recipe (recipes/<id>/recipe.yaml)
    recipe: Recipe
    # its variants, in the order layered (--variant)
    variants: tuple[str, ...]
    # verl config overrides, checked against verl's schema at composition (--set KEY=VALUE)
    sets: tuple[str, ...]
    # GPUs per node and nodes (--gpus, --smoke, else the recipe's): verl's trainer layout
    layout: Layout
    # the checkpoint trained
    model: Model
    # the folder with train.parquet and test.parquet (--data, else the embedded dataset's cache)
    data: Path
    # True for the user's --data: checked, never written into
    data_theirs: bool
    # the run folder everything of the run is written to (--run-dir, else runs/<name>-<time>),
    # claimed by this process (`userpaths.claim_run_dir`) until it exits
    run_dir: Path
    # the run folder holds this job's earlier attempt, which verl continues (--resume)
    resume: bool
    # the device total the run may use on a larger GPU (--cap-gib), and the fraction of this GPU
    # that is (each torch process's memory fraction, vLLM's share); None when uncapped
    cap_gib: float | None
    cap_scale: float | None
    # the GPUs the memory plan is judged against: this GPU or the cap on a GPU host, --gpu on a CPU
    # host; None: every GPU of the planner's catalogue (refused only when it fits none)
    budgets: tuple[Budget, ...] | None
    # training steps (--steps)
    steps: int
    # the recipe's tiny smoke model and steps (--smoke)
    smoke: bool
    # the verl fixes this run goes without (--verl-fix-off), each a name of `fixes.FIXES`
    fixes_off: tuple[str, ...]
    # vLLM's compiled graphs persist between runs (not --no-compile-cache)
    compile_cache: bool
    # the trainer's output goes to the run folder's log only (--quiet)
    quiet: bool
    # run even when the planner predicts the job does not fit (--force)
    force: bool
    # do not check the install and the host before training (--skip-verify)
    skip_verify: bool
    # why this host previews the job instead of training it (--preview, or too few GPUs); None: it trains
    preview: str | None
    # rank R of the job's world of N GPUs, rehearsed on one local GPU (--rank); None: the whole job
    rank: RankSpec | None
    # the run's name by the rule (`run_name`): its folder's under runs/<recipe>/ unless --run-dir
    name: RunName
    # the command line named the run folder (--run-dir): the same command comes back to it
    run_dir_named: bool = True
    # a verl job as the command line names it (`typed_name`), for the lines that name the job;
    # None for a recipe id
    typed: str | None = None

    @property
    def label(self) -> str:
        """The job as the user types it, `7b-lora --variant 24gib --set k=v` or `--verl-example NAME`
        with the user's own --set lines (not the dozens a verl script sets): what the pre-flight's
        host-RAM line names."""
        if self.typed is not None:
            return self.typed
        return " ".join(
            [self.recipe.id, *(f"--variant {v}" for v in self.variants), *(f"--set {x}" for x in self.sets)]
        )

    @property
    def composition(self) -> Composition:
        """How the job composes its recipe (`recipe.run_config.Composition`): what `plan` is asked,
        so a variant that fits is planned as this job runs (`--gpus` gives one node; a variant is
        planned on the recipe's own layout otherwise)."""
        return Composition(
            self.variants,
            self.sets,
            self.layout.per_node if self.layout.nnodes == 1 else None,
            self.model.trained[0],
            self.fixes_off,
        )

    @property
    def fixes(self) -> list[str]:
        """The verl fixes the run gets (every one of `fixes.FIXES` not turned off), for its
        provenance: the planner reads a run by what verl did in it."""
        return [name for name in FIXES if name not in set(self.fixes_off)]

    @property
    def gpu_checkpoint_weights(self) -> bool:
        """Whether the checkpoint the GPU run trains from holds weights (`trains_from_weights`):
        what the disk check judges, on a CPU preview too, whose tiny stand-in has weights either way."""
        return trains_from_weights(self.recipe, self.rank)


def trains_from_weights(recipe: Recipe, rank: RankSpec | None) -> bool:
    """False for a Megatron rank rehearsal: its checkpoint is config and tokenizer only, Megatron
    initialises the weights and vLLM draws dummy ones, since a 70B checkpoint (about 138 GB in bf16)
    does not fit a one-GPU host's disk. Every other run trains from a checkpoint with weights."""
    return not (rank is not None and recipe.backend == "megatron")


def local_gpus() -> tuple[int, float, str]:
    """This host's NVIDIA GPUs (NVML), the smallest one's memory in GiB and their family (`h200`);
    (0, 0.0, "") without any."""

    devs = gpus().get("gpus") or []
    if not devs:
        return 0, 0.0, ""
    return len(devs), min(d["memory_total_bytes"] for d in devs) / GIB, gpu_family(devs[0]["name"])


def run_name(
    recipe: Recipe,
    variants: Sequence[str],
    layout: Layout,
    gpu: str,
    *,
    sets: Sequence[str] = (),
    layers: int | None = None,
    cap_gib: float | None = None,
    rank: RankSpec | None = None,
    labels: Sequence[str] = (),
) -> RunName:
    """A run's name by the rule (`recipe.run_names.RULE`), from what the job is: the GPU family it
    runs on (or, for a preview, is judged for), the GPUs it uses (one for a rank rehearsal), the
    algorithm, the variants, `--layers`, `--cap-gib`, the rank and the `--label` words. `train`
    names its run folder by it (`Job.name`), and a campaign line must carry the name it gives the
    line's arguments, so a run keeps one name from campaign line to committed folder."""
    algo = algorithm(recipe, variants, sets)
    return RunName(
        gpu=gpu,
        n=1 if rank is not None else layout.world,
        algo=algo,
        variants=tuple(v for v in variants if v != algo),
        layers=layers,
        cap_gib=cap_gib,
        rank=rank,
        labels=tuple(check_label(x) for x in labels),
        repeat=None,
    )


def recipe_sets_layout(args: argparse.Namespace) -> tuple[Recipe, tuple[str, ...], Layout]:
    """The recipe, its --set lines and its layout: a recipe id's, or a verl job's as its users
    write it (a script, a suite entry, a command line after `--`: `recipe.verl_job`), whose own
    overrides come before the user's --set lines and whose trainer.* keys are its layout."""

    vjob = load_job(args.recipe, args.rest, args.verl_script, args.verl_example, args.sets, args.arch)
    if vjob is None:
        if args.rest:
            raise RecipeError(f"{args.recipe} {' '.join(args.rest)}: one recipe; a verl command goes after --")
        if not args.recipe:
            raise RecipeError("give a recipe id, a verl script (--verl-script PATH) or --verl-example NAME")
        recipe = get_recipe(args.recipe)
        return recipe, tuple(args.sets), gpu_layout(recipe, args.gpus, args.smoke)
    for flag, given in (("--variant", args.variant), ("--gpus", args.gpus), ("--smoke", args.smoke)):
        if given:
            raise RecipeError(f"{flag} applies to recipes; a verl job's layout is its trainer.* keys (--set)")

    print("\n".join(header(vjob)))  # what `plan` says above the same job
    return vjob.recipe, vjob.sets, vjob.layout


def typed_name(args: argparse.Namespace) -> str | None:
    """A verl job as its command line names it, with the user's own --set lines; None for a recipe."""
    if args.verl_example:
        named = f"--verl-example {args.verl_example}"
    elif args.verl_script:
        named = f"--verl-script {args.verl_script}"
    elif args.recipe and str(args.recipe).endswith(".sh"):
        named = str(args.recipe)
    elif args.rest:
        named = "the verl command after --"
    else:
        return None
    return " ".join([named, *(f"--set {x}" for x in args.sets)])


def decide(args: argparse.Namespace) -> Job:
    """The job the command line asks for on this host; refuses in one line what cannot run."""
    recipe, sets, layout = recipe_sets_layout(args)
    bad_fix = next((f for f in args.verl_fix_off if f not in FIXES), None)
    if bad_fix:
        raise RecipeError(f"--verl-fix-off {bad_fix}: no such fix; the fixes are {', '.join(FIXES)}")
    rank = RankSpec(args.rank, layout.world) if args.rank is not None else None

    if args.resume and args.run_dir is None:
        raise RecipeError(
            "--resume continues the run in --run-dir DIR, and none was given; pass the folder of the run "
            "to continue (a run without --run-dir goes to a new folder under runs/)"
        )
    # A rank rehearsal trains on one GPU; the whole job needs its GPUs per node.
    n_gpus, gpu_gib, family = local_gpus()
    need = 1 if rank else layout.per_node
    gpu_ok = 0 < need <= n_gpus
    preview = None
    if args.preview:
        preview = "--preview was given"
    elif not gpu_ok:
        what = f"a rank rehearsal of {recipe.id} needs" if rank else "the recipe needs"
        preview = f"this host has {n_gpus} NVIDIA GPU(s), {what} {need}"
    if args.gpu and not preview:
        raise RecipeError("--gpu names the GPU a preview plans for; this host trains on its own: drop it, or --preview")

    cap_scale = None
    if args.cap_gib:
        if not gpu_ok:
            raise RecipeError("--cap-gib needs a GPU: the cap is a fraction of the GPU's total memory")
        if args.cap_gib >= gpu_gib:
            raise RecipeError(f"--cap-gib {args.cap_gib} is not below this GPU's {gpu_gib:.1f} GiB; drop it")
        # Each torch process may use at most the cap; vLLM gets the same GiB it would get on a
        # card of cap_gib (its gpu_memory_utilization is a fraction of the card's total).
        cap_scale = args.cap_gib / gpu_gib

    if preview:
        budgets = (Budget(args.gpu, args.gpu),) if args.gpu else None
        # a preview is named for the GPU it is judged for: --gpu's, else the recipe's card
        family = gpu_family_of(args.gpu or f"{recipe.gpus.per_gpu_gib:g}GiB")
    else:
        label = "the --cap-gib budget" if args.cap_gib else "this GPU"
        budgets = (Budget(f"{args.cap_gib or gpu_gib:.2f}GiB", label),)

    labels = [*args.label, *(["smoke"] if args.smoke else []), *(["preview"] if preview else [])]
    layers = None if args.smoke else args.layers
    name = run_name(
        recipe, args.variant, layout, family, sets=sets, layers=layers, cap_gib=args.cap_gib, rank=rank, labels=labels
    )
    # a default folder, runs/<recipe>/<name>, is made here: the next repeat of the name when it is
    # taken, never one another command has (two started in one second)
    run_dir = args.run_dir.resolve() if args.run_dir else userpaths.new_run_dir(Path("runs") / recipe.id, name.text)
    # What the user gives is read, never written; what this writes is new, empty or its own. The
    # run folder is claimed for as long as this process runs: of two launches into it, one goes
    # on; an attempt that was stopped before it finished is set aside (attempt-N/), never a bar.
    if args.data:
        userpaths.check_data_dir(args.data)
    resume = userpaths.claim_run_dir(run_dir, args.resume)

    # The user's checkpoint, else the synthetic one: the shape trained, and the one made here (a
    # tiny model of the same family on a CPU: loading it in transformers takes seconds).
    arch = args.arch or recipe.model.arch
    trained = (recipe.smoke.layers, recipe.smoke.scale) if args.smoke else (args.layers, "full-width")
    (layers, scale), device = ((recipe.smoke.layers, "tiny"), "cpu") if preview else (trained, "cuda")
    weights = device != "cuda" or trains_from_weights(recipe, rank)
    path = args.model or model_dir(arch, layers, scale, args.model_out, weights)
    if args.model_out is not None and args.model is None:
        made = shape_config(resolve_arch(arch), layers, scale)  # the checkpoint written here
        userpaths.check_model_out(args.model_out, arch, int(made["num_hidden_layers"]), scale)
    model = Model(path, args.model is not None, arch, layers, scale, device, trained, args.model_out, weights)

    return Job(
        recipe=recipe,
        variants=tuple(args.variant),
        sets=sets,
        layout=layout,
        model=model,
        data=args.data or default_data_dir(),
        data_theirs=args.data is not None,
        run_dir=run_dir,
        resume=resume,
        cap_gib=args.cap_gib,
        cap_scale=cap_scale,
        budgets=budgets,
        steps=args.steps,
        smoke=args.smoke,
        fixes_off=tuple(args.verl_fix_off),
        compile_cache=not args.no_compile_cache,
        quiet=args.quiet,
        force=args.force,
        skip_verify=args.skip_verify,
        preview=preview,
        rank=rank,
        name=name,
        run_dir_named=args.run_dir is not None,
        typed=typed_name(args),
    )
