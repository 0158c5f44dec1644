"""One pre-flight for `train`: the same checks on a CPU rehearsal and before a GPU launch.

Whatever a GPU host would refuse, the rehearsal refuses first, with the same one line and a
non-zero exit, so it checks the job as it will run, before anything is made or written:

* the config composed with every override (variants, `--set`, and what `--gpus`, `--model`,
  `--arch`, `--layers` and `--smoke` give the launcher), each value typed and in range
  (`verl_recipes.recipe.verl_schema`, at composition);
* the model's real config.json: the user's `--model` folder (`userpaths.check_model_dir`), or the
  shape the synthetic checkpoint will have (`synth.shape_config`), never the stock recipe's;
* the user's data files, against what verl reads from them (`userpaths.check_parquet`), and a
  `--model-out` folder: new, empty, or a synthetic checkpoint of the same shape (`check_model_out`);
* the GPU layout (`verl_recipes.layout`, through the planner's `setup_from_config`);
* verl's own start-up validation, `verl.utils.config.validate_config`, which `main_ppo` runs
  before Ray starts;
* the host's RAM against the planner's host figure for the run (a warning only);
* the memory plan: a GPU host judges its own GPU (or its `--cap-gib` budget); a CPU host the GPU
  named by `--gpu`, else every GPU of the planner's catalogue, and the job is refused when it fits
  none of them (a host with one of the GPUs it does not fit refuses it; the line names them), in
  one line that ends with the whole fix (`plan.advice.whole_fix`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_recipes import GIB, RecipeError
from verl_recipes.job import Budget, Job
from verl_recipes.layout import RankSpec, layout_of

__all__ = ["Budget", "check", "fit", "model_config", "preflight", "verl_validate"]


def preflight(job: Job) -> tuple[Any, Any, list[str]]:
    """The job composed against verl's config, once, as it will run, and judged (module doc):
    returns the config, the planner's `Setup` the verdict was reached on (the rehearsal's closing
    line judges the same one) and the lines to print; raises the one line a refusal is."""
    from verl_recipes.predict.host import run_label
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.predict.model import Arch
    from verl_recipes.recipe.run_config import compose_run, default_data_dir
    from verl_recipes.rundir import PROFILE

    model = job.model
    cfg = compose_run(
        job.recipe,
        list(job.variants),
        list(job.sets),
        job.layout,
        model=model.path,
        data=job.data,
        run_dir=job.run_dir,
        steps=job.steps,
    )
    if cfg.global_profiler.tool and not any(x.startswith("global_profiler.save_path=") for x in job.sets):
        # verl's default is a relative outputs/profile under whatever folder the workers run in
        cfg.global_profiler.save_path = str(job.run_dir / PROFILE)
    world = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    if job.rank is not None and world != job.rank.world:
        raise RecipeError(
            f"--rank {job.rank.rank}: the composed job has {world} GPU(s), its layout {job.rank.world}; "
            "set the GPUs per node with --gpus, not --set trainer.*"
        )
    # The job as it will run: the user's checkpoint, else the shape a GPU host makes, never the
    # tiny stand-in a CPU loads.
    arch, source = model_config(model.path if model.theirs else None, model.arch, *model.trained)
    if model.out is not None and not model.theirs:
        from verl_recipes.workload.userpaths import check_model_out

        made = model_config(None, model.arch, model.layers, model.scale)[0]  # the checkpoint written here
        check_model_out(model.out, model.arch, int(made["num_hidden_layers"]), model.scale)
    here = job.rehearsal is None
    setup = setup_from_config(cfg, Arch.from_config(arch, source), job.fixes_off)
    if job.rank is not None:
        setup = setup.with_rank(job.rank.rank)
    verdict = check(
        cfg,
        arch,
        source,
        default_data_dir(),
        list(job.budgets) if job.budgets is not None else None,
        job.force,
        model.theirs,
        (run_label(job.recipe.id, job.variants, job.sets), list(job.fixes_off), here),
        setup=setup,
        calibration=(job.recipe, list(job.variants)),
        ranks_here=1 if job.rank is not None else None,
    )
    if job.rank is not None:
        verdict[:0] = rank_lines(cfg, job.rank, arch)
    return cfg, setup, verdict


def rank_lines(cfg: Any, rank: RankSpec, arch: dict[str, Any]) -> list[str]:
    """What a rank rehearsal of the composed job is, or the one line why it cannot be: the share
    the driver will run (`rank_rehearsal.localize`, on a copy) and, on Megatron, where the rank
    sits in the layout and which ranks hold the pipeline's two ends."""
    from verl_recipes.worker.rank_rehearsal import localize

    localize(copy.deepcopy(cfg), rank, arch)
    lines = [f"rank: {rank.label}; the plan below is one GPU's share of the job"]
    layout = layout_of(cfg, rank.world)
    if layout is not None:
        lines.append(f"rank: {layout.describe(rank.rank)}")
    return lines


def model_config(model: Path | None, arch: str, layers: int | None, scale: str) -> tuple[dict[str, Any], str]:
    """The config.json the job trains, and where it comes from: the user's folder (checked), or
    the synthetic checkpoint's shape, as `synth-model` will write it."""
    from verl_recipes.workload.userpaths import check_model_dir

    if model is not None:
        return check_model_dir(model), str(model / "config.json")
    from verl_recipes.workload.arch import resolve_arch
    from verl_recipes.workload.synth import shape_config

    return shape_config(resolve_arch(arch), layers, scale), f"{arch} ({scale}, {layers or 'all'} layers)"


VAL_MISSING = (
    "add a test.parquet (verl's validation set) in the same layout next to train.parquet, or pass "
    "--set data.val_files=FILE (nothing is written into your folder)"
)


def check_data(cfg: Any, ours: Path) -> None:
    """The data files the config names, unless they are the embedded dataset under `ours` (made
    when missing) or remote (verl copies those in; this host cannot look)."""
    from omegaconf import OmegaConf

    from verl_recipes.workload.userpaths import MAKE_DATA, check_parquet

    prompt_key = str(OmegaConf.select(cfg, "data.prompt_key") or "prompt")
    batch = int(OmegaConf.select(cfg, "data.train_batch_size"))
    for key, rows, missing in (("data.train_files", batch, MAKE_DATA), ("data.val_files", 1, VAL_MISSING)):
        raw = OmegaConf.select(cfg, key)
        listed = OmegaConf.to_container(raw) if OmegaConf.is_config(raw) else [raw]
        files = listed if isinstance(listed, list) else [listed]
        for f in files:
            path = Path(str(f)).expanduser()
            if path.parent == ours or "://" in str(f):
                continue
            # Several files make one dataset: only a lone file must hold a batch by itself.
            check_parquet(path, prompt_key, rows if len(files) == 1 else 1, f"{key}:", missing)


def verl_validate(cfg: Any, shape: dict[str, Any] | None = None) -> str | None:
    """verl's start-up validation on a copy; a refusal is one RecipeError line. Returns a note when
    a check needs a package this host lacks (vLLM's LoRA ranks on a CPU host).

    verl builds the critic's model config from the checkpoint folder while it validates. Before a
    synthetic checkpoint exists, `shape` (its config.json) stands in for it in a scratch folder,
    and its tokenizer, which `synth-model` makes with it, is not loaded.
    """
    import tempfile

    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = copy.deepcopy(cfg)
    with tempfile.TemporaryDirectory(prefix="verl-recipes-shape-") as tmp:
        if shape is not None:
            (Path(tmp) / "config.json").write_text(json.dumps(shape))
            with open_dict(cfg):
                cfg.critic.model.path = cfg.critic.model.tokenizer_path = tmp
                cfg.critic.model.load_tokenizer = False
        return _validate(validate_config, cfg, need_reference_policy(cfg), need_critic(cfg))


def _validate(validate_config: Any, cfg: Any, ref: bool, critic: bool) -> str | None:
    import contextlib
    import io

    said = io.StringIO()  # verl prints its verdict and notices; ours is one line
    try:
        with contextlib.redirect_stdout(said):
            validate_config(cfg, use_reference_policy=ref, use_critic=critic)
    except ImportError as e:  # the last check imports vLLM for the LoRA ranks it allows
        if "vllm" not in str(e.name or e):
            raise
        return "verl's LoRA-rank check for vLLM needs vLLM, which this host lacks; a GPU host runs it"
    except Exception as e:  # verl raises AssertionError, ValueError and Hydra's InstantiationException
        msg = " ".join(str(e).split()) or type(e).__name__
        raise RecipeError(f"verl refuses the configuration at start-up: {msg}") from None
    notes = [x for x in said.getvalue().splitlines() if x.strip() and "All configuration checks passed" not in x]
    return "; ".join(f"verl: {x.strip()}" for x in notes) or None


def refusal(setup: Any, gpu: Any, label: str, fixes_off: Sequence[str] = (), cal: Any = None) -> str:
    """The one line a host refuses a job with that does not fit `gpu`, with the whole fix: every
    knob of the planner's path to fit at once (`plan.advice.whole_fix`), never one of several.
    Where the recipe commits a calibrated prediction for the job (`cal`), the reason is that figure
    and the fix is judged against the card less what the calibration adds, as `plan` judges it."""
    from verl_recipes.plan.advice import excess, judged_gpu, whole_fix
    from verl_recipes.predict.phases import plan_gpu

    plan = plan_gpu(setup, gpu)
    if cal is not None and not cal.fits:
        why = f"the {cal.kind} puts {cal.peak_phase} at {cal.peak_bytes / GIB:.1f} GiB"
        tip = f"; {whole_fix(setup, judged_gpu(gpu, excess(plan, cal)), fixes_off)}"
    else:
        why = plan.problems[0]
        tip = f"; {whole_fix(setup, gpu, fixes_off)}"
    return (
        f"predicted not to fit {label} ({gpu.visible_bytes / GIB:.1f} GiB): {why}{tip} "
        "(`verl-recipes plan` explains; --force runs anyway)"
    )


def _peak_text(plan: Any, cal: Any) -> str:
    if cal is not None:
        return f"{cal.peak_phase} {cal.peak_bytes / GIB:.1f} GiB ({cal.kind})"
    return f"{plan.peak.phase} {plan.peak.total / GIB:.1f} GiB"


def _word(setup: Any, plan: Any, cal: Any) -> str:
    """`plan`'s word for a job under the card: fits, or tight with the margin it lacks
    (`predict.margin`); a tight job runs, and is told so."""
    from verl_recipes.predict.margin import TIGHT, margin
    from verl_recipes.predict.phases import Constants

    phase, peak = (cal.peak_phase, cal.peak_bytes) if cal is not None else (plan.peak.phase, plan.peak.total)
    m = margin(setup, phase, peak, plan.gpu.visible_bytes, Constants().nccl_bytes_per_communicator)
    if m.word != TIGHT:
        return "fits"
    return (
        f"tight (under the card by {m.headroom / GIB:.1f} GiB, less than the {m.band / GIB:.1f} GiB "
        "`plan` states moves it) on"
    )


def fit(
    setup: Any,
    budgets: list[Budget] | None,
    force: bool,
    fixes_off: Sequence[str] = (),
    calibration: tuple[Any, Sequence[str]] | None = None,
) -> list[str]:
    """The memory verdict: refuses (unless `force`) a job that fits none of `budgets`, or, without
    budgets, none of the planner's catalogue; returns the lines to print. `fixes_off` (the verl
    fixes the run goes without) sets the host RAM the refusal's fix states. `calibration` (the
    recipe and its variants) lets a calibrated prediction the recipe commits for exactly this job
    decide, as it decides in `plan` (`plan.advice.verdict`): one verdict per job and GPU."""
    from verl_recipes.plan.advice import calibrated, verdict
    from verl_recipes.predict.gpus import catalogue, parse_gpu
    from verl_recipes.predict.phases import plan_gpu

    named = [(parse_gpu(b.gpu), b.label) for b in budgets or []]
    gpus = named or [(g, g.id) for g in catalogue().values()]
    judged = []
    for g, label in gpus:
        cal = calibrated(calibration[0], calibration[1], setup, g) if calibration is not None else None
        judged.append((plan_gpu(setup, g), g, label, cal))
    fits = [(p, label, cal) for p, _, label, cal in judged if verdict(p, cal)]
    lines = [f"plan: {_word(setup, p, cal)} {label}: peak {_peak_text(p, cal)}" for p, label, cal in fits]
    short = [
        label + (f" ({_peak_text(p, cal)})" if cal is not None else "")
        for p, _, label, cal in judged
        if not verdict(p, cal)
    ]
    if fits and short:
        lines.append(f"plan: does not fit {', '.join(short)}: a host with one of those refuses it")
    if not fits:
        _, gpu, label, cal = max(judged, key=lambda x: x[1].visible_bytes)
        where = label if budgets else f"even the largest GPU the planner knows, {label}"
        line = refusal(setup, gpu, where, fixes_off, cal)
        if not force:
            raise RecipeError(line)
        lines.append(f"{line} [--force: going on]")
    return lines


def check(
    cfg: Any,
    arch: dict[str, Any],
    source: str,
    ours: Path,
    budgets: list[Budget] | None,
    force: bool,
    user_model: bool,
    host_run: tuple[str, list[str], bool] | None = None,
    *,
    setup: Any = None,
    calibration: tuple[Any, Sequence[str]] | None = None,
    ranks_here: int | None = None,
) -> list[str]:
    """The whole pre-flight (module doc); returns what to print, raises the refusal. `arch` is the
    config.json trained (`model_config`), `ours` the embedded dataset's folder, `user_model` whether
    the config's model path is the user's checkpoint (else it is made after the pre-flight).

    `host_run` (the run's label, e.g. `7b-lora --variant 24gib`, the verl fixes it runs without,
    and whether it runs on this host) adds the planner's host RAM for the run: on the host that
    trains, RAM below it is one `WARN host-ram` line, never a refusal (`predict.host.host_ram_warning`);
    a rehearsal states the figure for the GPU host to have. `setup` is the planner's reading of
    `cfg` when the caller has made it (`preflight`), else it is read here. `ranks_here` is how many
    of a node's ranks the host runs when not all (a rank rehearsal: 1), for the host-RAM figure."""
    from verl_recipes.predict.host import host_ram_warning, plan_host
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.predict.model import Arch

    check_data(cfg, ours)
    fixes_off = host_run[1] if host_run is not None else []
    if setup is None:
        setup = setup_from_config(cfg, Arch.from_config(arch, source), fixes_off)
    note = verl_validate(cfg, None if user_model else arch)
    lines = [f"layout: {setup.nnodes} node(s) x {setup.gpus_per_node} GPU(s), checked; verl's start-up checks pass"]
    if note:
        lines.append(f"note: {note}")
    if host_run is not None:
        what, fixes_off, here = host_run
        need = plan_host(setup, fixes_off, ranks_here=ranks_here, pools_shared=bool(ranks_here)).peak.pss
        what = f"{what} (one rank's processes)" if ranks_here else what
        warn = host_ram_warning(what, need) if here else None
        if warn:
            lines.append(f"WARN host-ram {warn}")
        elif not here:
            lines.append(f"host RAM: {what} needs about {need / GIB:.0f} GiB on the GPU host (planner, PSS peak)")
    return lines + fit(setup, budgets, force, fixes_off, calibration)
