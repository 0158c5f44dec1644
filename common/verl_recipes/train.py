"""`verl-recipes train`: run a recipe with verl's own trainer, or rehearse it on a CPU.

Both paths compose the recipe against verl's Hydra config once and run one pre-flight on the job
as it will run (`verl_recipes.preflight`) before anything is made or written, so what a GPU host
would refuse, the rehearsal refuses, with the same line. The user's `--model` and `--data` are
read, never written (`verl_recipes.workload.userpaths`), and a `--run-dir` is new, empty, or
resumed.

With a GPU it then makes (or takes) the model and dataset, and starts verl's own ``main_ppo``
(through `verl_recipes.worker.driver`, which applies the driver-side fixes first) on the saved,
fully composed config under the NVML monitor, with provenance, phase attribution and a report in
one run folder.

Without a GPU it rehearses everything a CPU can check: install verification, the pre-flight, the
model (a tiny synthetic one unless `--model`) loading in transformers, the dataset loading in
verl's RLHFDataset, and the exact command a GPU host would run; then it says plainly that
training needs a GPU and exits 0.

verl runs its trainer loop and FSDP workers as Ray actors, so the launcher reaches them through
Ray's ``worker_process_setup_hook`` (`verl_recipes.worker.hooks.setup`) and environment variables.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, procs, rundir
from verl_recipes.measure.provenance import gpus as nvml_gpus
from verl_recipes.measure.provenance import record
from verl_recipes.paths import cache_dir
from verl_recipes.recipe.metadata import Recipe, get_recipe
from verl_recipes.recipe.run_config import compose_run, default_data_dir, gpu_layout
from verl_recipes.worker.rank_rehearsal import ENV_RANK, RankSpec
from verl_recipes.worker.verl_fixes import ENV_FIXES_OFF, FIXES

GIB = 1024**3
CLI = [sys.executable, "-m", "verl_recipes.cli"]
#: the trainer's entry point: verl's main_ppo behind the driver-side fixes
DRIVER = "verl_recipes.worker.driver"


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None, check: bool = True) -> int:
    print(f"+ {shlex.join(cmd)}", flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0 and check:
        raise RecipeError(f"{what} failed (exit {rc}): {shlex.join(cmd)}")
    return rc


def model_dir(arch: str, layers: int | None, scale: str, out: Path | None) -> Path:
    """Where the synthetic checkpoint of `arch` at this shape is kept (known before it is made)."""
    return out or cache_dir() / "models" / f"{arch}-{scale}-L{layers or 'all'}"


def ensure_model(path: Path, arch: str, layers: int | None, scale: str, device: str) -> Path:
    """The synthetic checkpoint at `path`, made once and then reused."""
    if (path / "synth.json").is_file():
        print(f"model: reusing {path}")
        return path
    cmd = [*CLI, "synth-model", "--arch", arch, "--scale", scale, "--device", device, "--out", str(path)]
    if layers:
        cmd += ["--layers", str(layers)]
    _run(cmd, "synth-model")
    return path


def ensure_dataset(path: Path, theirs: bool) -> Path:
    """The user's folder as given (`theirs`: checked up front, never written into), else the
    embedded dataset, made once in the cache."""
    if theirs:
        return path
    if (path / "train.parquet").is_file() and (path / "test.parquet").is_file():
        return path
    _run([*CLI, "dataset", "--out", str(path)], "dataset")
    return path


def _gpu_info() -> tuple[int, float]:
    info = nvml_gpus()
    devs = info.get("gpus") or []
    if not devs:
        return 0, 0.0
    return len(devs), min(d["memory_total_bytes"] for d in devs) / GIB


def rehearse(recipe: Recipe, args: argparse.Namespace, cfg: Any, run_dir: Path, reason: str, verdict: list[str]) -> int:
    """Everything a CPU can check, then a plain statement that training needs a GPU."""
    from omegaconf import OmegaConf

    print(f"== rehearsal of {recipe.id}: {reason}")
    print("== 1/5 install verification")
    _run([*CLI, "verify", "--recipe", recipe.id, *_run_args(args)], "verify", check=False)
    print(f"== 2/5 composed against verl's schema: {run_dir / rundir.CONFIG}")
    print(
        f"   {len(OmegaConf.to_yaml(cfg).splitlines())} lines; algorithm={cfg.algorithm.adv_estimator}, "
        f"lora_rank={cfg.actor_rollout_ref.model.lora_rank}, batch={cfg.data.train_batch_size}"
    )
    print("== 3/5 pre-flight (the same checks a GPU host runs before it starts verl)")
    for line in verdict:
        print(f"   {line}")
    print("== 4/5 model (a tiny synthetic one on CPU unless --model) and dataset")
    model = Path(cfg.actor_rollout_ref.model.path)
    data = Path(cfg.data.train_files).parent
    _check_model_and_data(model, data, cfg)
    print("== 5/5 the command a GPU host runs")
    print(f"   {(run_dir / rundir.COMMAND).read_text().strip().splitlines()[-1]}")
    print(
        f"training needs an NVIDIA GPU ({recipe.gpus.count} x {recipe.gpus.target}); {reason}. "
        "Everything above is what a CPU can check; run the same command on a GPU host to train."
    )
    return 0


def _run_args(args: argparse.Namespace) -> list[str]:
    """The options that change what a run needs: verify judges the host against this run."""
    out = [x for v in args.variant for x in ("--variant", v)] + [x for v in args.sets for x in ("--set", v)]
    return out + [x for v in args.verl_fix_off for x in ("--verl-fix-off", v)]


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


def run(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    from verl_recipes import preflight
    from verl_recipes.plan.host import run_label
    from verl_recipes.workload import userpaths

    recipe = get_recipe(args.recipe)
    variants = args.variant
    bad_fix = next((f for f in args.verl_fix_off if f not in FIXES), None)
    if bad_fix:
        raise RecipeError(f"--verl-fix-off {bad_fix}: no such fix; the fixes are {', '.join(FIXES)}")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    layout = gpu_layout(recipe, args.gpus, args.smoke)
    rank = RankSpec(args.rank, layout.per_node * layout.nnodes) if args.rank is not None else None
    name = "-".join([recipe.id, *variants]) + ("-smoke" if args.smoke else "")
    name += f"-rank{rank.rank}of{rank.world}" if rank else ""
    run_dir = (args.run_dir or Path("runs") / f"{name}-{stamp}").resolve()
    # What the user gives is read, never written; what this writes is new, empty or its own.
    if args.data:
        userpaths.check_data_dir(args.data)
    resume = userpaths.check_run_dir(run_dir, args.resume)

    n_gpus, gpu_gib = _gpu_info()
    # a rank rehearsal runs one rank of the job on one local GPU
    gpu_ok = 0 < (1 if rank else layout.per_node) <= n_gpus
    rehearsal = args.rehearse or not gpu_ok
    if args.gpu and not rehearsal:
        raise RecipeError(
            "--gpu names the GPU a rehearsal plans for; this host trains on its own: drop it, or --rehearse"
        )

    env = dict(os.environ)
    cap_scale = None
    if args.cap_gib:
        if not gpu_ok:
            raise RecipeError("--cap-gib needs a GPU: the cap is a fraction of the GPU's total memory")
        if args.cap_gib >= gpu_gib:
            raise RecipeError(f"--cap-gib {args.cap_gib} is not below this GPU's {gpu_gib:.1f} GiB; drop it")
        # Each torch process may use at most the cap; vLLM gets the same GiB it would get on a
        # card of cap_gib (its gpu_memory_utilization is a fraction of the card's total).
        cap_scale = args.cap_gib / gpu_gib
        env["VERL_RECIPES_TORCH_MEM_FRACTION"] = f"{cap_scale:.4f}"

    # The model's and the dataset's folders are known before either is made, so the run is composed
    # once, first: a misspelt key or a value of the wrong type fails in seconds, not after a 7B
    # checkpoint has been written.
    arch = args.arch or recipe.model.arch
    trained = (recipe.smoke.layers, recipe.smoke.scale) if args.smoke else (args.layers, "full-width")
    if rehearsal:  # a tiny model of the same family: loading it in transformers takes seconds on a CPU
        layers, scale, device = recipe.smoke.layers, "tiny", "cpu"
    else:
        (layers, scale), device = trained, "cuda"
    model = args.model or model_dir(arch, layers, scale, args.model_out)
    data = args.data or default_data_dir()
    cfg = compose_run(recipe, variants, args.sets, layout, model=model, data=data, run_dir=run_dir, steps=args.steps)

    # The pre-flight, the same for the rehearsal and the GPU launch: the job as it will run (the
    # user's checkpoint, else the shape a GPU host makes, never the tiny stand-in a CPU loads).
    arch_cfg, source = preflight.model_config(args.model, arch, *trained)
    if args.model_out and not args.model:
        full = preflight.model_config(None, arch, layers, scale)[0]["num_hidden_layers"]
        userpaths.check_model_out(args.model_out, arch, int(full), scale)
    if rehearsal:
        budgets = [preflight.Budget(args.gpu, args.gpu)] if args.gpu else None
    else:
        label = "the --cap-gib budget" if args.cap_gib else "this GPU"
        budgets = [preflight.Budget(f"{args.cap_gib or gpu_gib:.2f}GiB", label)]
    host_run = (run_label(recipe.id, variants, args.sets), args.verl_fix_off, not rehearsal)
    verdict = preflight.check(
        cfg, arch_cfg, source, default_data_dir(), budgets, args.force, args.model is not None, host_run
    )

    cfg_path = run_dir / rundir.CONFIG
    cmd = [sys.executable, "-m", DRIVER, "--config-path", str(run_dir), "--config-name", cfg_path.stem]

    def write_run(cfg: Any) -> None:
        """The run folder's command and config, once the model and data exist (a resumed run keeps its own)."""
        if resume:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / rundir.COMMAND).write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + shlex.join(cmd) + "\n")
        OmegaConf.save(cfg, cfg_path)

    if rehearsal:
        reason = (
            "--rehearse was given"
            if args.rehearse
            else f"this host has {n_gpus} NVIDIA GPU(s), the recipe needs {layout.per_node}"
        )
        if not args.model:
            ensure_model(model, arch, layers, scale, device)
        ensure_dataset(data, args.data is not None)
        if resume:
            verdict.append(f"--resume: {run_dir} holds a run; a GPU host continues it (nothing here is rewritten)")
        write_run(cfg)
        return rehearse(recipe, args, cfg, run_dir, reason, verdict)

    for msg in verdict:
        print(msg)
    # A GPU host: check the install and the host first (driver, CUDA, NCCL, versions, /dev/shm),
    # then make what is missing, then train under the monitor.
    if not args.skip_verify:
        gpus_arg = ["--gpus", "1" if rank else str(args.gpus)] if (args.gpus or rank) else []
        _run(
            [*CLI, "verify", "--recipe", recipe.id, *gpus_arg, *_run_args(args)],
            "verify (pass --skip-verify to run anyway)",
        )
    if not args.model:
        ensure_model(model, arch, layers, scale, device)
    ensure_dataset(data, args.data is not None)
    vllm_util = None
    if cfg.global_profiler.tool and not any(x.startswith("global_profiler.save_path=") for x in args.sets):
        # verl's default is a relative outputs/profile under whatever folder the workers run in
        cfg.global_profiler.save_path = str(run_dir / rundir.PROFILE)
    if cap_scale is not None:
        rollout = cfg.actor_rollout_ref.rollout
        vllm_util = round(float(rollout.gpu_memory_utilization) * cap_scale, 4)
        rollout.gpu_memory_utilization = vllm_util
    if resume:
        if cfg_path.read_text() != OmegaConf.to_yaml(cfg):
            raise RecipeError(
                f"--resume: the job differs from the one in {cfg_path}; resume with the same arguments "
                "or pass a new --run-dir"
            )
        aside = userpaths.set_aside(run_dir)
        if aside:
            print(f"--resume: the earlier attempt's log and measurements are in {aside}")
    write_run(cfg)
    # the model's architecture beside the run: the planner's check of this run reads it (a
    # truncated or user model is not the recipe's bundled one)
    if (model / "config.json").is_file():
        (run_dir / rundir.MODEL_CONFIG).write_text((model / "config.json").read_text())

    env.update(
        {
            rundir.RUN_DIR_ENV: str(run_dir),
            "VERL_FILE_LOGGER_PATH": str(run_dir / rundir.VERL_METRICS),
            "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(run_env(env, compile_cache=not args.no_compile_cache))
    if args.verl_fix_off:
        env[ENV_FIXES_OFF] = ",".join(args.verl_fix_off)
    if rank:
        env[ENV_RANK] = rank.env_value
        print(f"{rank.label}: this GPU runs rank {rank.rank} of the job's {rank.world} GPUs")
    prov = record(
        cmd,
        {
            "recipe": recipe.id,
            "variants": variants,
            "sets": args.sets,
            "steps": args.steps,
            "model": str(model),
            "data": str(data),
            "cap_gib": args.cap_gib,
            "vllm_gpu_memory_utilization": vllm_util,
            "torch_mem_fraction": env.get("VERL_RECIPES_TORCH_MEM_FRACTION"),
            "runtime_env": OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env),
            "verl_fixes_off": args.verl_fix_off,
            "verl_fixes": applied_fixes(args.verl_fix_off),
            "compile_cache": not args.no_compile_cache,
            "rank_rehearsal": {"rank": rank.rank, "world": rank.world} if rank else None,
        },
    )
    rundir.write_provenance(run_dir, prov)
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
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            logf.flush()
            if not args.quiet:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    (run_dir / rundir.EXIT_CODE).write_text(f"{rc}\n")
    worker_errors(run_dir, rc)
    _run([*CLI, "report", str(run_dir)], "report", check=False)
    try:
        summarize_traces(run_dir)
    except (OSError, MemoryError) as e:  # the run's own outcome below still has to be said
        print(f"profile summary not written: {e}", file=sys.stderr)
    if rc != 0:
        why = failure_reason(run_dir, rc)
        raise RecipeError(f"verl exited {rc}{why}; the log and everything measured up to then are in {run_dir}")
    if args.cap_gib:
        over = cap_overrun(run_dir, args.cap_gib)
        if over:
            (run_dir / rundir.CAP_EXCEEDED).write_text(over + "\n")
            raise RecipeError(over)
    print(f"run folder: {run_dir}")
    return 0


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


def failure_reason(run_dir: Path, rc: int) -> str:
    """`; FILE: LAST ERROR` for the line a failed run ends with: the same cause the report's
    `ended` names (`ending.describe`), so Ray's teardown lines are never given as the reason."""
    from verl_recipes.measure import ending

    phases, _ = rundir.read_jsonl(run_dir / rundir.PHASES)
    ended = ending.describe(run_dir, rc, phases)
    return f"; {ended['error_file']}: {ended['last_error']}" if ended.get("last_error") else ""


def worker_errors(run_dir: Path, rc: int) -> list[dict[str, Any]]:
    """The Ray worker errors of a run that did not exit 0, kept in its folder. Ray's logs of a
    clean exit hold only its teardown (intended exits, force-killed actors, a SIGTERM to the
    dashboard), which reads like errors and says nothing: 42 files of them per 7B run."""
    return collect_worker_errors(run_dir) if rc != 0 else []


def collect_worker_errors(run_dir: Path) -> list[dict[str, Any]]:
    """The run's Ray worker logs that carry an error, copied into RUN_DIR/ray-logs/ (`ending`)."""
    from verl_recipes.measure import ending

    recs, _ = rundir.read_jsonl(run_dir / rundir.SAMPLES)
    start = next((r for r in recs if r.get("kind") == "start"), {})
    pid = start.get("pid")
    try:
        return ending.collect_ray_logs(run_dir, int(pid) if pid else None)
    except OSError as e:
        print(f"ray logs: not collected: {e}", file=sys.stderr)
        return []


def applied_fixes(off: list[str] | None) -> list[str]:
    """The verl fixes a run gets (every one of `verl_fixes.FIXES` not turned off), for its
    provenance: the planner reads a run by what verl did in it."""
    from verl_recipes.worker.verl_fixes import FIXES

    return [name for name in FIXES if name not in set(off or ())]


def summarize_traces(run_dir: Path) -> Path | None:
    """RUN_DIR/profile/summary.md from the torch profiler's traces, when the run was profiled: a
    7B stage's trace is tens of MB of events, and the table is what a reader (or a host whose
    results travel with a size limit) keeps."""
    prof = run_dir / rundir.PROFILE
    summary = prof / rundir.PROFILE_SUMMARY
    if not prof.is_dir() or summary.exists():
        return None
    from verl_recipes.measure import trace

    if not trace.traces_in(prof):
        return None
    summary.write_text(trace.folder_markdown(prof))
    return summary


def cap_overrun(run_dir: Path, cap_gib: float) -> str | None:
    """The first phase whose device total (NVML, every process on the GPU) went over the cap.

    The cap is enforced per process (torch's memory fraction, vLLM's share), but the question a
    24 GiB card asks is the device total, so that is what decides whether the run fitted.
    """
    summary = rundir.read_summary(run_dir)
    worst: tuple[float, str, str] | None = None
    for phase, rec in (summary.get("phases") or {}).items():
        for gpu, g in (rec.get("gpu") or {}).items():
            used = float(g.get("used_gib") or 0.0)
            if used > cap_gib and (worst is None or used > worst[0]):
                worst = (used, phase, gpu)
    if worst is None:
        return None
    used, phase, gpu = worst
    return (
        f"device total {used:.2f} GiB in phase {phase} on GPU {gpu} is over the --cap-gib {cap_gib:g} budget "
        f"(NVML, all processes); the run is in {run_dir}: raise the cap or change the knobs `verl-recipes plan` names"
    )


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run a recipe: rehearse on CPU, train with verl on GPU")
    p.add_argument("recipe")
    p.add_argument("--variant", action="append", default=[], help="variant from recipe.yaml; repeatable")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a verl config override, checked against verl's schema",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=_env_path("MODEL_PATH"),
        help="an HF checkpoint folder (default: $MODEL_PATH, else a synthetic one)",
    )
    p.add_argument("--model-out", type=Path, help="where to write the synthetic model")
    p.add_argument("--arch", help="another bundled architecture for the synthetic model (bring-up, scaling)")
    p.add_argument("--layers", type=int, help="truncate the synthetic model to this many layers")
    p.add_argument(
        "--data",
        type=Path,
        default=_env_path("DATA_DIR"),
        help="folder with train.parquet and test.parquet in verl's format (default: $DATA_DIR)",
    )
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gpus", type=int, help="GPUs per node to use (default: the recipe's)")
    p.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help="rank rehearsal: run rank R of the job's GPUs on one local GPU (PyTorch's fake process group)",
    )
    p.add_argument(
        "--gpu",
        metavar="ID|NGiB",
        help="rehearsal: the GPU the job is for (a planner catalogue id or a size like 24GiB); "
        "default: refuse only a job that fits no GPU the planner knows",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="--run-dir may hold a run of the same job: continue it from its checkpoints (Slurm requeue)",
    )
    p.add_argument("--smoke", action="store_true", help="the recipe's tiny smoke model and steps")
    p.add_argument("--rehearse", action="store_true", help="rehearse even where a GPU exists")
    p.add_argument("--cap-gib", type=float, help="cap the device total at this many GiB on a larger GPU")
    p.add_argument("--quiet", action="store_true", help="log only to the run folder")
    p.add_argument("--force", action="store_true", help="run even when the planner predicts it will not fit")
    p.add_argument("--skip-verify", action="store_true", help="do not run `verl-recipes verify` before training")
    p.add_argument(
        "--verl-fix-off",
        action="append",
        default=[],
        metavar="NAME",
        help="run verl's own code instead of this fix (names: verl_recipes.worker.verl_fixes.FIXES); repeatable",
    )
    p.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="recompile vLLM's model at every start, as verl does by default (VLLM_DISABLE_COMPILE_CACHE=1)",
    )
    p.set_defaults(func=run)
