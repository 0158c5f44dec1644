"""`verl-recipes train`: run a recipe with verl's own trainer, or rehearse it on a CPU.

Both paths compose the recipe against verl's Hydra config and run one pre-flight on the job as
it will run (`verl_recipes.preflight`) before anything is made or written, so what a GPU host
would refuse, the rehearsal refuses, with the same line. The user's `--model` and `--data` are
read, never written (`verl_recipes.userpaths`), and a `--run-dir` is new, empty, or resumed.

With a GPU it then makes (or takes) the model and dataset, and starts
``python -m verl.trainer.main_ppo`` on the saved, fully composed config under the NVML monitor,
with provenance, phase attribution and a report in one run folder.

Without a GPU it rehearses everything a CPU can check: install verification, the pre-flight, the
model (a tiny synthetic one unless `--model`) loading in transformers, the dataset loading in
verl's RLHFDataset, and the exact command a GPU host would run; then it says plainly that
training needs a GPU and exits 0.

verl runs its trainer loop and FSDP workers as Ray actors, so the launcher reaches them through
Ray's ``worker_process_setup_hook`` (`verl_recipes.hooks.setup`) and environment variables.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from verl_recipes import RUN_DIR_ENV, RecipeError
from verl_recipes.compose import compose_recipe
from verl_recipes.provenance import gpus as nvml_gpus
from verl_recipes.provenance import record
from verl_recipes.recipes import Recipe, get_recipe

GIB = 1024**3
CLI = [sys.executable, "-m", "verl_recipes.cli"]


def _cache_dir() -> Path:
    return Path(os.environ.get("VERL_RECIPES_CACHE", Path.home() / ".cache" / "verl-recipes"))


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None, check: bool = True) -> int:
    print(f"+ {shlex.join(cmd)}", flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0 and check:
        raise RecipeError(f"{what} failed (exit {rc}): {shlex.join(cmd)}")
    return rc


def ensure_model(
    recipe: Recipe, layers: int | None, scale: str, device: str, out: Path | None, arch: str | None = None
) -> Path:
    """A synthetic checkpoint of the recipe's architecture (or `arch`), made once and cached."""
    arch = arch or recipe.model.arch
    tag = f"{arch}-{scale}-L{layers or 'all'}"
    path = out or _cache_dir() / "models" / tag
    if (path / "synth.json").is_file():
        print(f"model: reusing {path}")
        return path
    cmd = [*CLI, "synth-model", "--arch", arch, "--scale", scale, "--device", device, "--out", str(path)]
    if layers:
        cmd += ["--layers", str(layers)]
    _run(cmd, "synth-model")
    return path


def ensure_dataset(out: Path | None) -> Path:
    """The user's folder as given (checked up front, never written into), else the embedded
    dataset, made once in the cache."""
    if out is not None:
        return out
    path = _cache_dir() / "data" / "arith"
    if (path / "train.parquet").is_file() and (path / "test.parquet").is_file():
        return path
    _run([*CLI, "dataset", "--out", str(path)], "dataset")
    return path


def launcher_settings(
    recipe: Recipe, model: Path, data: Path, run_dir: Path, steps: int, n_gpus: int, nnodes: int | None = None
) -> Any:
    """What the launcher owns in verl's config: paths, GPUs, steps, logging, the Ray hook."""
    from omegaconf import OmegaConf

    from verl_recipes import reward

    settings: dict[str, Any] = {
        "actor_rollout_ref": {"model": {"path": str(model)}},
        "critic": {"model": {"path": str(model), "tokenizer_path": str(model)}},
        "data": {"train_files": str(data / "train.parquet"), "val_files": str(data / "test.parquet")},
        "reward": {"custom_reward_function": {"path": reward.__file__, "name": "compute_score"}},
        "trainer": {
            "n_gpus_per_node": n_gpus,
            "nnodes": nnodes or recipe.gpus.nodes,
            "total_training_steps": steps,
            "total_epochs": 1000,
            "logger": ["console", "file"],
            "default_local_dir": str(run_dir / "checkpoints"),
        },
    }
    return OmegaConf.create(settings)


def _open_runtime_env(cfg: Any) -> Any:
    """Add Ray's setup hook to verl's (struct) ray_init.runtime_env."""
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        renv = cfg.ray_kwargs.ray_init.runtime_env
        renv.worker_process_setup_hook = "verl_recipes.hooks.setup"
    return OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env)


def preflight_fit(cfg: Any, model: Path, budget_gib: float, label: str) -> None:
    """Refuse, in one line, a run the memory planner predicts cannot fit the GPU (or the cap).

    The planner (`verl_recipes.plan`) is validated against the committed runs
    (`verl-recipes plan --validate`); its best knob is named so the user knows what to change.
    `preflight.fit` is the check itself, shared with the CPU rehearsal.
    """
    from verl_recipes.plan.inputs import setup_from_config
    from verl_recipes.plan.model import Arch
    from verl_recipes.preflight import Budget, fit

    setup = setup_from_config(cfg, Arch.from_file(model / "config.json"))
    for msg in fit(setup, [Budget(f"{budget_gib:.2f}GiB", label)], force=False):
        print(msg)


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
    _run([*CLI, "verify", "--recipe", recipe.id], "verify", check=False)
    print(f"== 2/5 composed against verl's schema: {run_dir / 'verl_config.yaml'}")
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
    print(f"   {(run_dir / 'command.sh').read_text().strip().splitlines()[-1]}")
    print(
        f"training needs an NVIDIA GPU ({recipe.gpus.count} x {recipe.gpus.target}); {reason}. "
        "Everything above is what a CPU can check; run the same command on a GPU host to train."
    )
    return 0


def _check_model_and_data(model: Path, data: Path, cfg: Any) -> None:
    """Load the model in transformers and the dataset in verl's own RLHFDataset."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    m = AutoModelForCausalLM.from_pretrained(model)
    n = sum(p.numel() for p in m.parameters())
    print(f"   model {model}: {n:,} parameters loaded in transformers")
    from verl.utils.dataset.rl_dataset import RLHFDataset

    ds = RLHFDataset(data_files=[str(data / "train.parquet")], tokenizer=tok, config=cfg.data)  # type: ignore[arg-type]
    item = ds[0]
    print(
        f"   dataset {data}: {len(ds)} rows in verl's RLHFDataset; first prompt {len(item['raw_prompt'])} message(s)"
        if "raw_prompt" in item
        else f"   dataset {data}: {len(ds)} rows in verl's RLHFDataset"
    )


def run(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    from verl_recipes import preflight, userpaths

    recipe = get_recipe(args.recipe)
    variants = args.variant
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = "-".join([recipe.id, *variants]) + ("-smoke" if args.smoke else "")
    run_dir = (args.run_dir or Path("runs") / f"{name}-{stamp}").resolve()
    # What the user gives is read, never written; what this writes is new, empty or its own.
    if args.data:
        userpaths.check_data_dir(args.data)
    resume = userpaths.check_run_dir(run_dir, args.resume)

    n_gpus, gpu_gib = _gpu_info()
    # --gpus N: a scaled-down run on this one node (e.g. a truncated 70B on 2 GPUs), whatever the
    # recipe's node count; verify checks N GPUs instead of the recipe's.
    nnodes = 1 if args.gpus else None
    need = args.gpus or (1 if args.smoke else recipe.gpus.count) * recipe.gpus.nodes
    per_node = min(need, n_gpus) if n_gpus else need // recipe.gpus.nodes
    gpu_ok = n_gpus > 0 and n_gpus >= per_node
    rehearsing = args.rehearse or not gpu_ok
    if rehearsing:
        per_node = args.gpus or (1 if args.smoke else recipe.gpus.count)
    elif args.gpu:
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

    # Compose once before anything is made, so a typo in a key fails in seconds, not after a 7B
    # checkpoint has been written; the paths are filled in again below once they exist.
    model = args.model or Path("/nonexistent/model-made-at-launch")
    ours = _cache_dir() / "data" / "arith"
    data = args.data or ours
    extra = launcher_settings(recipe, model, data, run_dir, args.steps, per_node, nnodes)
    cfg = compose_recipe(recipe, variants, args.sets, extra=extra)
    runtime_env = _open_runtime_env(cfg)

    # The pre-flight, the same for the rehearsal and the GPU launch: the job as it will run.
    layers = recipe.smoke.layers if args.smoke else args.layers
    scale = recipe.smoke.scale if args.smoke else "full-width"
    arch = args.arch or recipe.model.arch
    arch_cfg, source = preflight.model_config(args.model, arch, layers, scale)
    if args.model_out and not args.model:
        made = (recipe.smoke.layers, "tiny") if rehearsing else (layers, scale)
        full = preflight.model_config(None, arch, made[0], made[1])[0]["num_hidden_layers"]
        userpaths.check_model_out(args.model_out, arch, int(full), made[1])
    if rehearsing:
        budgets = [preflight.Budget(args.gpu, args.gpu)] if args.gpu else None
    else:
        label = "the --cap-gib budget" if args.cap_gib else "this GPU"
        budgets = [preflight.Budget(f"{args.cap_gib or gpu_gib:.2f}GiB", label)]
    verdict = preflight.check(cfg, arch_cfg, source, ours, budgets, args.force, args.model is not None)

    cfg_path = run_dir / "verl_config.yaml"
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", str(run_dir), "--config-name", "verl_config"]

    def write_run(cfg: Any) -> None:
        """The run folder's command and config, once the model and data exist (a resumed run keeps its own)."""
        if resume:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "command.sh").write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + shlex.join(cmd) + "\n")
        OmegaConf.save(cfg, cfg_path)

    if rehearsing:
        reason = (
            "--rehearse was given"
            if args.rehearse
            else f"this host has {n_gpus} NVIDIA GPU(s), the recipe needs {per_node}"
        )
        if not args.model:
            model = ensure_model(recipe, recipe.smoke.layers, "tiny", "cpu", args.model_out, args.arch)
        extra = launcher_settings(recipe, model, ensure_dataset(args.data), run_dir, args.steps, per_node, nnodes)
        cfg = compose_recipe(recipe, variants, args.sets, extra=extra)
        _open_runtime_env(cfg)
        if resume:
            verdict.append(f"--resume: {run_dir} holds a run; a GPU host continues it (nothing here is rewritten)")
        write_run(cfg)
        return rehearse(recipe, args, cfg, run_dir, reason, verdict)

    for msg in verdict:
        print(msg)
    # A GPU host: check the install and the host first (driver, CUDA, NCCL, versions, /dev/shm),
    # then make what is missing, then train under the monitor.
    if not args.skip_verify:
        gpus_arg = ["--gpus", str(args.gpus)] if args.gpus else []
        _run([*CLI, "verify", "--recipe", recipe.id, *gpus_arg], "verify (pass --skip-verify to run anyway)")
    if not args.model:
        model = ensure_model(recipe, layers, scale, "cuda", args.model_out, args.arch)
    data = ensure_dataset(args.data)
    extra = launcher_settings(recipe, model, data, run_dir, args.steps, per_node, nnodes)
    cfg = compose_recipe(recipe, variants, args.sets, extra=extra)
    _open_runtime_env(cfg)
    vllm_util = None
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

    env.update(
        {
            RUN_DIR_ENV: str(run_dir),
            "VERL_FILE_LOGGER_PATH": str(run_dir / "verl_metrics.jsonl"),
            "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
            "PYTHONUNBUFFERED": "1",
        }
    )
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
            "runtime_env": runtime_env,
        },
    )
    (run_dir / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    # USS/PSS at most once a minute, and further apart when a read is costly: smaps_rollup of every
    # member (large CUDA processes) was the monitor's main cost on the H200 (0.32-0.37 s a read); the
    # monitor keeps those reads under 0.1% of a core. RSS is read at 2 Hz, the device total at 10 Hz.
    mon = [*CLI, "monitor", "--out", str(run_dir), "--full-mem-interval", "60", "--", *cmd]
    with open(run_dir / "train.log", "wb") as logf:
        print(f"+ {shlex.join(mon)}  (log: {run_dir / 'train.log'})", flush=True)
        proc = subprocess.Popen(mon, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            logf.flush()
            if not args.quiet:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    (run_dir / "exit_code").write_text(f"{rc}\n")
    _run([*CLI, "report", str(run_dir)], "report", check=False)
    if rc != 0:
        raise RecipeError(f"verl exited {rc}; the log and everything measured up to then are in {run_dir}")
    if args.cap_gib:
        over = cap_overrun(run_dir, args.cap_gib)
        if over:
            (run_dir / "cap_exceeded.txt").write_text(over + "\n")
            raise RecipeError(over)
    print(f"run folder: {run_dir}")
    return 0


def cap_overrun(run_dir: Path, cap_gib: float) -> str | None:
    """The first phase whose device total (NVML, every process on the GPU) went over the cap.

    The cap is enforced per process (torch's memory fraction, vLLM's share), but the question a
    24 GiB card asks is the device total, so that is what decides whether the run fitted.
    """
    summary = json.loads((run_dir / "summary.json").read_text())
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
    p.set_defaults(func=run)
