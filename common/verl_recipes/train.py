"""`verl-recipes train`: run a recipe with verl's own trainer, or a preview of it on a CPU.

`run` is the whole path, in order, each step once:

1. decide (`verl_recipes.job`): the command line and this host's GPUs become one frozen `Job`;
   whatever the command line alone gets wrong is refused there, in one line;
2. pre-flight and plan (`verl_recipes.preflight`): the job composed against verl's Hydra config,
   once, as it will run, and judged (data, layout, verl's start-up checks, host RAM, the memory
   plan) before anything is made or written, so what a GPU host would refuse, the preview
   refuses, with the same line;
3. preview (no GPU, or `--preview`): everything a CPU can check, then a plain statement that
   training needs a GPU, exit 0; or launch: the host's install checked (`stack.verify`), the
   model and dataset made (or taken), and verl's own ``main_ppo`` (through
   `verl_recipes.worker.driver`, which applies the driver-side fixes first) started on the saved,
   fully composed config under the NVML monitor, with provenance, in one run folder;
4. measure (`verl_recipes.measure.outcome`): the report, the failed run's worker errors, the
   profile summary, and the line the run ends with.

The user's `--model` and `--data` are read, never written (`verl_recipes.workload.userpaths`),
and a `--run-dir` is new, empty, or resumed; it is claimed while `train` runs (a second launch
into it is one line) and marked incomplete from its first write until the preview or the
measure step is done, so a run stopped by Ctrl-C or a kill says so and the same `--run-dir` again
starts over (the stopped attempt kept in attempt-N/); without --run-dir, each command makes a new
folder under runs/<recipe>/, named by the rule (`job.run_name`), never one another command has.

verl runs its trainer loop and FSDP workers as Ray actors, so the launch reaches them through
Ray's ``worker_process_setup_hook`` (`verl_recipes.worker.hooks.setup`) and environment
variables; a rank rehearsal (`--rank R`) is one of those variables
(`layout.ENV_RANK`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, cli_types, inflight, procs, rundir
from verl_recipes.fixes import ENV_FIXES_OFF
from verl_recipes.job import Job, decide
from verl_recipes.layout import ENV_RANK
from verl_recipes.measure import outcome
from verl_recipes.measure.provenance import record
from verl_recipes.measure.relay import relay
from verl_recipes.plan.advice import closing_line
from verl_recipes.predict.gpus import parse_gpu
from verl_recipes.predict.inputs import Setup
from verl_recipes.preflight import Preflight, preflight
from verl_recipes.stack.verify import print_checks, run_checks
from verl_recipes.workload import dataset, synth, userpaths

CLI = [sys.executable, "-m", "verl_recipes.cli"]
#: the trainer's entry point: verl's main_ppo behind the driver-side fixes
DRIVER = "verl_recipes.worker.driver"


def run(args: argparse.Namespace) -> int:
    """decide -> pre-flight and plan -> preview or launch -> measure (module doc).

    From its first write (`write_run`) until the preview or the measure step is done, the run
    folder is marked incomplete (`userpaths.mark_incomplete`): a run stopped in between says so,
    and the same command again sets that attempt aside and starts over."""

    job = decide(args)
    checked = preflight(job)
    if job.preview is not None:
        rc = preview(job, checked)
        userpaths.mark_complete(job.run_dir)
        return rc
    rc = launch(job, checked)
    try:
        ended = outcome.conclude(job.run_dir, rc, job.cap_gib)
    except RecipeError:  # a failed or over-cap run is measured whole before its line is raised
        userpaths.mark_complete(job.run_dir)
        raise
    userpaths.mark_complete(job.run_dir)
    return ended


def trainer_command(job: Job) -> list[str]:
    """verl's trainer on the run folder's saved config: what the monitor starts, and command.sh."""
    cfg_path = job.run_dir / rundir.CONFIG
    return [sys.executable, "-m", DRIVER, "--config-path", str(job.run_dir), "--config-name", cfg_path.stem]


def write_run(job: Job, cfg: Any) -> None:
    """The run folder's command and config, once the model and data exist (a resumed run keeps
    its own), the folder marked incomplete first. command.sh carries what a GPU host needs to run
    the same job again, the rank rehearsal's variable included."""
    from omegaconf import OmegaConf

    userpaths.mark_incomplete(job.run_dir, job.run_dir_named)
    if job.resume:
        return
    env = [f"{ENV_RANK}={job.rank.env_value}"] if job.rank else []
    command = "#!/usr/bin/env bash\nset -euo pipefail\n" + shlex.join([*env, *trainer_command(job)]) + "\n"
    # each renamed into place whole: a full disk leaves the file absent, never cut short
    inflight.write_text(job.run_dir / rundir.COMMAND, command, "the run's command")
    inflight.write_text(job.run_dir / rundir.CONFIG, OmegaConf.to_yaml(cfg), "the run's composed config")


def same_job(job: Job, cfg: Any) -> None:
    """A resumed run folder holds this job: its saved config is the one composed now (on a GPU
    host as in a rehearsal), else one line names the first key that differs, and both values."""
    from omegaconf import OmegaConf

    cfg_path = job.run_dir / rundir.CONFIG
    saved, now = cfg_path.read_text(), OmegaConf.to_yaml(cfg)
    if saved == now:
        return
    there, here = _flat(OmegaConf.to_container(OmegaConf.create(saved))), _flat(OmegaConf.to_container(cfg))
    keys = [k for k in dict.fromkeys([*here, *there]) if here.get(k, "(absent)") != there.get(k, "(absent)")]
    named = [f"{k} is {there.get(k, '(absent)')!r} there, {here.get(k, '(absent)')!r} now" for k in keys[:3]]
    which = f"{len(keys)} key(s) differ: " + "; ".join(named) + ("; ..." if len(keys) > 3 else "")
    raise RecipeError(
        f"--resume: the job differs from the one in {cfg_path} ({which}); resume with the arguments that "
        "made it, or pass a new --run-dir"
    )


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config as dotted keys and leaf values."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def ensure_model(job: Job) -> Path:
    """The checkpoint the job trains: the user's as given, else the synthetic one at its path,
    made once and then reused.

    On a CPU the tiny stand-in is written in this process. On a GPU host the writer draws the
    weights on the GPU in a process of its own, so that no CUDA context or cached block of it is
    left on the GPU the run then measures; its crash (the OOM killer included) is one line.
    A Megatron rank rehearsal's has no weights (`Model.weights`).
    """
    model = job.model
    if model.theirs:
        return model.path
    if (model.path / "synth.json").is_file():
        print(f"model: reusing {model.path}")
        return model.path
    argv = ["synth-model", "--arch", model.arch, "--scale", model.scale, "--device", model.device]
    argv += ["--out", str(model.path)] + (["--layers", str(model.layers)] if model.layers else [])
    argv += [] if model.weights else ["--no-weights"]
    if model.device == "cpu":
        try:
            in_process(synth, argv)
        except RecipeError:
            raise
        except Exception as e:  # the writer's own failure, said in one line
            msg = " ".join(str(e).split()) or type(e).__name__
            raise RecipeError(f"synth-model {model.arch} into {model.path} failed: {type(e).__name__}: {msg}") from e
        return model.path
    cmd = [*CLI, *argv]
    print(f"+ {shlex.join(cmd)}", flush=True)
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise RecipeError(f"synth-model failed (exit {rc}): {shlex.join(cmd)}")
    return model.path


def ensure_dataset(job: Job) -> Path:
    """The user's folder as given (checked up front, never written into), else the embedded
    dataset, made in the cache once and again only when it is not whole (`dataset.complete`)."""

    if job.data_theirs:
        return job.data
    if not dataset.complete(job.data):
        in_process(dataset, ["dataset", "--out", str(job.data)])
    return job.data


def in_process(module: Any, argv: list[str]) -> int:
    """`verl-recipes ARGV` in this process: the subcommand's own parser (so its defaults are the
    command's) and its function; its RecipeError is train's one line."""
    parser = argparse.ArgumentParser(prog="verl-recipes")
    module.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    print(f"+ verl-recipes {shlex.join(argv)}", flush=True)
    return int(args.func(args) or 0)


def verify(job: Job, gate: bool) -> None:
    """The host's install and devices (`stack.verify`: driver, CUDA, NCCL, versions, /dev/shm,
    host RAM as a fact); with `gate`, a failed check stops the launch. A rank rehearsal runs on
    one GPU without NCCL between GPUs, so the all-reduce across the host's GPUs is left out.

    It runs in this process: its torch calls (the device count, NCCL's version) do not start
    CUDA here, so nothing of this process stays on the GPU the run measures, and the all-reduce
    runs in processes of its own."""

    checks = run_checks(job.recipe, allreduce=job.rank is None, weights=job.gpu_checkpoint_weights)
    print_checks(checks, indent="   " if not gate else "")
    failed = [c.name for c in checks if c.status == "fail"]
    if failed and gate:
        raise RecipeError(
            f"verify: {len(failed)} check(s) failed ({', '.join(failed)}); fix them as printed above, "
            "or pass --skip-verify to run anyway"
        )


def preview(job: Job, checked: Preflight) -> int:
    """Everything a CPU can check, then the line that says what a GPU host does with the job
    (`plan.advice.closing_line`, judged on the pre-flight's `setup`, as the plan above it)."""
    from omegaconf import OmegaConf

    reason, cfg, verdict = job.preview, checked.cfg, list(checked.lines)
    if job.resume:
        same_job(job, cfg)
    ensure_model(job)
    ensure_dataset(job)
    if job.resume:
        verdict.append(
            f"--resume: {job.run_dir} holds a run of this job; a GPU host continues it (nothing here is rewritten)"
        )
    write_run(job, cfg)

    print(f"== preview of {job.recipe.id}: {reason}")
    if job.rank is not None:
        print(
            f"== {job.rank.label}: a GPU host runs this job's rank {job.rank.rank} on one GPU "
            f"({ENV_RANK}={job.rank.env_value}); collectives return at once, buffers are real"
        )
    print("== 1/5 install verification")
    verify(job, gate=False)
    print(f"== 2/5 composed against verl's schema: {job.run_dir / rundir.CONFIG}")
    print(
        f"   {len(OmegaConf.to_yaml(cfg).splitlines())} lines; algorithm={cfg.algorithm.adv_estimator}, "
        f"lora_rank={cfg.actor_rollout_ref.model.lora_rank}, batch={cfg.data.train_batch_size}"
    )
    print("== 3/5 pre-flight (the same checks a GPU host runs before it starts verl)")
    for line in verdict:
        print(f"   {line}")
    print("== 4/5 model (a tiny synthetic one on CPU unless --model) and dataset")
    _check_model_and_data(Path(cfg.actor_rollout_ref.model.path), Path(cfg.data.train_files).parent, cfg)
    print("== 5/5 the command a GPU host runs")
    print(f"   {(job.run_dir / rundir.COMMAND).read_text().strip().splitlines()[-1]}")
    print(closing(job, checked.setup))
    return 0


def closing(job: Job, setup: Setup) -> str:
    """The preview's last line (`plan.advice.closing_line`) for the job: judged on the GPU it is
    run for (--gpu, else the recipe's per-GPU size), naming the variant that fits where the
    job as asked does not, and the rank a GPU host runs for a rank rehearsal."""

    gpu = parse_gpu(job.budgets[0].gpu if job.budgets else f"{job.recipe.gpus.per_gpu_gib:g}GiB")
    return closing_line(job.recipe, job.composition, setup, gpu, job.preview or "", job.rank)


def _check_model_and_data(model: Path, data: Path, cfg: Any) -> None:
    """Load the model in transformers and the dataset in verl's own RLHFDataset."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    m = AutoModelForCausalLM.from_pretrained(model)
    n = sum(p.numel() for p in m.parameters())
    print(f"   model {model}: {n:,} parameters loaded in transformers")
    from verl.utils.dataset.rl_dataset import RLHFDataset

    ds = RLHFDataset(data_files=[str(data / "train.parquet")], tokenizer=tok, config=cfg.data)  # type: ignore[arg-type,unused-ignore]
    item = ds[0]
    print(
        f"   dataset {data}: {len(ds)} rows in verl's RLHFDataset; first prompt {len(item['raw_prompt'])} message(s)"
        if "raw_prompt" in item
        else f"   dataset {data}: {len(ds)} rows in verl's RLHFDataset"
    )


def launch(job: Job, checked: Preflight) -> int:
    """On a GPU host: the host checked, the model and data made, then verl under the monitor;
    returns verl's exit code (the run folder holds everything measured)."""

    cfg = checked.cfg
    for msg in checked.lines:
        print(msg)
    if not job.skip_verify:
        verify(job, gate=True)
    ensure_model(job)
    ensure_dataset(job)
    vllm_util = None
    if job.cap_scale is not None:
        # the cap is planned as a card of cap_gib; on this larger card vLLM's share is scaled to it
        rollout = cfg.actor_rollout_ref.rollout
        vllm_util = round(float(rollout.gpu_memory_utilization) * job.cap_scale, 4)
        rollout.gpu_memory_utilization = vllm_util
    run_dir = job.run_dir
    if job.resume:
        same_job(job, cfg)
        aside = userpaths.set_aside(run_dir)
        if aside:
            print(f"--resume: the earlier attempt's log and measurements are in {aside}")
    write_run(job, cfg)
    # the model's architecture beside the run: the planner's check of this run reads it (a
    # truncated or user model is not the recipe's bundled one)
    if (job.model.path / "config.json").is_file():
        inflight.write_text(run_dir / rundir.MODEL_CONFIG, (job.model.path / "config.json").read_text())

    env = {**os.environ, **launch_env(job, dict(os.environ))}
    cmd = trainer_command(job)
    rundir.write_provenance(run_dir, run_record(job, cfg, cmd, env, vllm_util))
    # USS/PSS at most once a minute, and further apart when a read is costly: smaps_rollup of every
    # member (large CUDA processes) was the monitor's main cost on the H200 (0.32-0.37 s a read); the
    # monitor keeps those reads under 0.1% of a core. RSS is read at 2 Hz, the device total at 10 Hz.
    mon = [*CLI, "monitor", "--out", str(run_dir), "--full-mem-interval", "60", "--", *cmd]
    with open(run_dir / rundir.LOG, "wb") as logf:
        print(f"+ {shlex.join(mon)}  (log: {run_dir / rundir.LOG})", flush=True)
        # a killed `train` takes the monitor with it, and the monitor forwards that to verl
        proc = subprocess.Popen(
            mon, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=procs.die_with_parent()
        )
        # a run whose vLLM failed and whose trainer waits on it is stopped (`measure.relay`)
        return relay(proc, logf, echo=not job.quiet)


def run_record(job: Job, cfg: Any, cmd: list[str], env: dict[str, str], vllm_util: float | None) -> dict[str, Any]:
    """The run's provenance: the host and stack (`measure.provenance.record`) and the job as it ran."""
    from omegaconf import OmegaConf

    return record(
        cmd,
        {
            "recipe": job.recipe.id,
            "variants": list(job.variants),
            "sets": list(job.sets),
            "steps": job.steps,
            "model": str(job.model.path),
            "data": str(job.data),
            "cap_gib": job.cap_gib,
            "vllm_gpu_memory_utilization": vllm_util,
            "torch_mem_fraction": env.get("VERL_RECIPES_TORCH_MEM_FRACTION"),
            "runtime_env": OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env),
            "verl_fixes_off": list(job.fixes_off),
            "verl_fixes": job.fixes,
            "compile_cache": job.compile_cache,
            "rank_rehearsal": job.rank.record() if job.rank else None,
        },
    )


def launch_env(job: Job, env: dict[str, str]) -> dict[str, str]:
    """What the launch adds to `env` (this process's) for every process of the run: the run
    folder, verl's metrics file, the cap, the fixes turned off, the rank rehearsal, `run_env`."""
    out = {
        rundir.RUN_DIR_ENV: str(job.run_dir),
        "VERL_FILE_LOGGER_PATH": str(job.run_dir / rundir.VERL_METRICS),
        "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
        # verl's TensorBoard logger writes here (a verl job's wandb/mlflow loggers map to it), not
        # into the folder `train` was started from
        "TENSORBOARD_DIR": env.get("TENSORBOARD_DIR", str(job.run_dir / "tensorboard")),
        "PYTHONUNBUFFERED": "1",
    }
    if job.cap_scale is not None:
        out["VERL_RECIPES_TORCH_MEM_FRACTION"] = f"{job.cap_scale:.4f}"
    out.update(run_env(env, compile_cache=job.compile_cache))
    if job.fixes_off:
        out[ENV_FIXES_OFF] = ",".join(job.fixes_off)
    if job.rank is not None:
        out[ENV_RANK] = job.rank.env_value
    return out


def run_env(env: dict[str, str], compile_cache: bool = True) -> dict[str, str]:
    """Variables every run's processes inherit (a user's own setting of any of them wins).

    - vLLM's torch.compile cache: verl 0.9.1 sets ``VLLM_DISABLE_COMPILE_CACHE=1`` in its Ray
      runtime env unless the launching shell sets it, so every start recompiles the model. Set to 0,
      the compiled graphs persist under ``VLLM_CACHE_ROOT`` (default ~/.cache/vllm) and a second run
      of the same architecture on the host loads them. ``--no-compile-cache`` keeps verl's setting.
    - ``VLLM_LOGGING_LEVEL=INFO``: vLLM then logs how long loading, compiling and graph capture took,
      which the report's start-up table shows (verl's default is WARN).
    - ``PYTHONFAULTHANDLER=1``: a process killed by SIGABRT or SIGSEGV prints its Python stack first,
      so a native crash says where it happened (the Ray worker logs kept in ray-logs/).
    """
    want = {"VLLM_LOGGING_LEVEL": "INFO", "PYTHONFAULTHANDLER": "1"}
    if compile_cache:
        want["VLLM_DISABLE_COMPILE_CACHE"] = "0"
    return {k: v for k, v in want.items() if k not in env}


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run a recipe: a preview on CPU, train with verl on GPU")
    p.add_argument("recipe", nargs="?", help="recipe id, or a verl script (.sh) as its users write it")
    p.add_argument(
        "rest", nargs="*", help="after --: a verl command line, or with a script the words its $@ passes to verl"
    )
    p.add_argument("--verl-script", type=Path, metavar="PATH", help="a verl job's bash script, as its users write it")
    p.add_argument("--verl-example", metavar="NAME", help="a verl example of validation/verl-examples/suite.yaml")
    p.add_argument("--variant", action="append", default=[], help="variant from recipe.yaml; repeatable")
    cli_types.add_set_option(p)
    p.add_argument(
        "--model",
        type=Path,
        default=_env_path("MODEL_PATH"),
        help="an HF checkpoint folder (default: $MODEL_PATH, else a synthetic one)",
    )
    p.add_argument("--model-out", type=Path, help="where to write the synthetic model")
    p.add_argument("--arch", help="another bundled architecture for the synthetic model (bring-up, scaling)")
    p.add_argument("--layers", type=cli_types.count, help="truncate the synthetic model to this many layers")
    p.add_argument(
        "--data",
        type=Path,
        default=_env_path("DATA_DIR"),
        help="folder with train.parquet and test.parquet in verl's format (default: $DATA_DIR)",
    )
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--steps", type=cli_types.count, default=3)
    p.add_argument("--gpus", type=cli_types.count, help="GPUs per node to use (default: the recipe's)")
    p.add_argument(
        "--rank",
        type=cli_types.non_negative,
        metavar="R",
        help="rehearse rank R of the job's GPUs (nodes x GPUs per node) on one local GPU; "
        "a CPU host previews the same job",
    )
    p.add_argument(
        "--gpu",
        metavar="ID|NGiB",
        help="preview: the GPU the job is for (a planner catalogue id or a size like 24GiB); "
        "default: refuse only a job that fits no GPU the planner knows",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="--run-dir may hold a run of the same job: continue it from its checkpoints (Slurm requeue)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="WORD",
        help="a lowercase word the run's name carries (recipe/run_names.py's rule); repeatable",
    )
    p.add_argument("--smoke", action="store_true", help="the recipe's tiny smoke model and steps")
    p.add_argument("--preview", action="store_true", help="a preview even where a GPU exists: every check, no training")
    # its old name, kept working
    p.add_argument("--rehearse", dest="preview", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cap-gib", type=cli_types.positive, help="cap the device total at this many GiB on a larger GPU")
    p.add_argument("--quiet", action="store_true", help="log only to the run folder")
    p.add_argument("--force", action="store_true", help="run even when the planner predicts it will not fit")
    p.add_argument("--skip-verify", action="store_true", help="do not check the install and host before training")
    p.add_argument(
        "--verl-fix-off",
        action="append",
        default=[],
        metavar="NAME",
        help="run verl's own code instead of this fix (names: verl_recipes.fixes.FIXES); repeatable",
    )
    p.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="recompile vLLM's model at every start, as verl does by default (VLLM_DISABLE_COMPILE_CACHE=1)",
    )
    p.set_defaults(func=run)
