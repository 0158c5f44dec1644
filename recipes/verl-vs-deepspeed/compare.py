"""verl vs a DeepSpeed ZeRO-3 PPO loop on one workload: run the DeepSpeed side, report both.

Subcommands:
  prep-data       write a parquet whose prompts are exactly --prompt-len tokens (both sides read it)
  ds              run the DeepSpeed baseline (launch with torchrun or the deepspeed launcher)
  verl-overrides  print the Hydra overrides that give verl's trainer the same workload
  openrlhf-args   write the command line that gives OpenRLHF (the DeepSpeed-based peer) the same
                  workload, for `verl-recipes peers run openrlhf --args-from`
  report          results.json, table.md and plot.png from a DeepSpeed run dir and a verl metrics JSONL
  records         phases.jsonl, metrics.jsonl, provenance.json of a DeepSpeed run dir (`ds` writes them
                  too), so `verl-recipes report RUN_DIR` and check-bounds read it as a monitored run

On the GPU host (keep NVLink multicast off: NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1; PYTHONUNBUFFERED=1 for live logs):
  verl-recipes synth-model --arch qwen2-7b --device cuda --out /tmp/m/qwen2-7b
  verl-recipes dataset --out /tmp/d
  C=recipes/verl-vs-deepspeed/compare.py M=/tmp/m/qwen2-7b
  python3 $C prep-data --model $M --data /tmp/d/train.parquet --out /tmp/d/fixed512.parquet
  python3 -m torch.distributed.run --standalone --nproc_per_node 2 $C ds --model $M \\
      --data /tmp/d/fixed512.parquet --out OUT/ds
(torch.distributed.run is torchrun.) `deepspeed --num_gpus 2 $C ds ...` works the same: both
launchers set RANK/LOCAL_RANK/WORLD_SIZE, which is all `ds` reads; --local_rank is accepted.
Full Qwen2-7B needs two H200s: ZeRO-3 model states are 233 GiB in all (the pre-flight says so and
stops on one GPU). On one GPU use a full-width checkpoint with fewer layers: synth-model --layers 8
(85 GiB of states; 12 layers, 115 GiB, is the most that passes the pre-flight).
Everything `ds` measures is defined in ds_ppo/harness.py and ds_ppo/loop.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ds_ppo.workload import Workload

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# Set before torch is imported: three ZeRO-3 models, a KV cache and logits churn the allocator.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def _workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (the same on the verl side)")
    g.add_argument("--model", required=True, help="HF checkpoint dir (verl-recipes synth-model --arch qwen2-7b)")
    g.add_argument("--data", required=True, help="verl RL parquet; use `prep-data` output for exact prompt lengths")
    g.add_argument("--prompt-len", type=int, default=512)
    g.add_argument("--response-len", type=int, default=512)
    g.add_argument("--batch", type=int, default=128, help="prompts per PPO step (global)")
    g.add_argument("--mini-batch", type=int, default=32, help="prompts per optimizer step (global)")
    g.add_argument("--train-micro", type=int, default=4, help="sequences per GPU per update forward")
    g.add_argument("--infer-micro", type=int, default=8, help="sequences per GPU per log-prob/value forward")
    g.add_argument("--gen-micro", type=int, default=0, help="sequences per GPU per generate call; 0 = all")
    g.add_argument("--warmup-steps", type=int, default=2)
    g.add_argument("--measured-steps", type=int, default=5)
    g.add_argument("--no-ref", action="store_true", help="no reference model and no KL in the reward")
    g.add_argument("--seed", type=int, default=1)


def _workload(a: argparse.Namespace) -> Workload:
    from ds_ppo.workload import Workload

    return Workload(
        model=a.model,
        data=a.data,
        prompt_len=a.prompt_len,
        response_len=a.response_len,
        batch=a.batch,
        mini_batch=a.mini_batch,
        train_micro_per_gpu=a.train_micro,
        infer_micro_per_gpu=a.infer_micro,
        gen_micro_per_gpu=a.gen_micro,
        warmup_steps=a.warmup_steps,
        measured_steps=a.measured_steps,
        use_ref=not a.no_ref,
        seed=a.seed,
    )


def cmd_ds(a: argparse.Namespace) -> int:
    from ds_ppo.harness import run_ds

    w = _workload(a)
    try:
        w.check(int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_ds(
        w,
        Path(a.out),
        backend=a.backend,
        device_type=a.device,
        ds_config_path=a.ds_config,
        time_budget_s=a.time_budget_s,
        headroom_gib=a.headroom_gib,
        skip_memory_check=a.skip_memory_check,
        grad_ckpt=a.grad_ckpt,
    )


def cmd_prep(a: argparse.Namespace) -> int:
    from ds_ppo.workload import write_fixed_parquet
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    stats = write_fixed_parquet(a.data, tok, a.prompt_len, a.out, limit=a.limit)
    print(f"{a.out}: {stats['rows']} prompts of exactly {a.prompt_len} tokens ({stats['dropped']} dropped)")
    return 0


def cmd_overrides(a: argparse.Namespace) -> int:
    from ds_ppo.losses import PPOHyper
    from ds_ppo.workload import verl_overrides

    w = _workload(a)
    kl = PPOHyper.from_verl_defaults().kl_coef
    print(" \\\n".join(verl_overrides(w, a.gpus, kl_coef=kl)))
    return 0


def cmd_openrlhf(a: argparse.Namespace) -> int:
    """OpenRLHF's `train_ppo_ray` command line for this workload, with verl's PPO constants (the
    DeepSpeed loop's too), as JSON for `verl-recipes peers run openrlhf --args-from`: the argv and
    what names the run (recipe, estimator, steps)."""
    import json

    from ds_ppo.losses import PPOHyper
    from verl_recipes.peers import openrlhf
    from verl_recipes.peers.workload import Paths

    w, hp = _workload(a), PPOHyper.from_verl_defaults()
    job = openrlhf.PPOJob(
        prompt_len=w.prompt_len,
        response_len=w.response_len,
        batch=w.batch,
        mini_batch=w.mini_batch,
        train_micro=w.train_micro_per_gpu,
        infer_micro=w.infer_micro_per_gpu,
        steps=w.steps,
        use_ref=w.use_ref,
        seed=w.seed,
        gpus=a.gpus,
        kl_coef=hp.kl_coef,
        gamma=hp.gamma,
        lam=hp.lam,
        clip=hp.clip_ratio,
        value_clip=hp.cliprange_value,
        actor_lr=hp.actor_lr,
        critic_lr=hp.critic_lr,
        grad_clip=hp.grad_clip,
    )
    run = Path(a.run_dir).resolve()
    reward = Path(openrlhf.__file__).with_name("rewards.py")
    paths = Paths(model=w.model, data=str(run / "data" / "train.jsonl"), out=str(run / "openrlhf-output"))
    names = {"recipe": "verl-vs-deepspeed", "adv_estimator": "gae", "variants": [], "steps": w.steps}
    doc = {"argv": openrlhf.ppo_argv(job, w.model, paths, str(reward)), "names": names}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{a.out}: OpenRLHF {openrlhf.VERSION}'s command line for {run}")
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from ds_ppo.harness import load_ds_dir, read_verl_metrics, write_report

    run, steps = load_ds_dir(Path(a.ds)) if a.ds else (None, [])
    verl = read_verl_metrics(a.verl) if a.verl else None
    write_report(Path(a.out), run, steps, verl, a.verl_gpus, a.verl_warmup, a.verl_monitor)
    print((Path(a.out) / "table.md").read_text())
    return 0


def cmd_records(a: argparse.Namespace) -> int:
    from ds_ppo.harness import load_ds_dir, record_rehearsal
    from ds_ppo.records import write_records
    from verl_recipes import RecipeError
    from verl_recipes.layout import RankSpec

    run_dir = Path(a.run_dir)
    try:
        if a.rank_rehearsal:
            spec = RankSpec.parse(a.rank_rehearsal)
            record_rehearsal(run_dir, spec.rank, spec.world)
        written = write_records(run_dir, *load_ds_dir(run_dir))
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(p) for p in written)}; next: verl-recipes report {run_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    ds = sub.add_parser("ds", help="run the DeepSpeed ZeRO-3 PPO baseline")
    _workload_args(ds)
    ds.add_argument("--out", required=True)
    ds.add_argument(
        "--backend",
        choices=["deepspeed", "torch"],
        default="deepspeed",
        help="torch = plain-torch stand-in for CPU tests, never a measurement",
    )
    ds.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ds.add_argument("--ds-config", default=None, help="base DeepSpeed config (default: ds_config.json here)")
    ds.add_argument(
        "--time-budget-s",
        type=float,
        default=0,
        help="stop before a step that would end after this many seconds of stepping (0 = no limit)",
    )
    ds.add_argument(
        "--headroom-gib",
        type=float,
        default=12.0,
        help="per-GPU memory the pre-flight keeps free of model states for activations",
    )
    ds.add_argument("--skip-memory-check", action="store_true")
    ds.add_argument(
        "--grad-ckpt",
        choices=["non-reentrant", "reentrant", "off"],
        default="non-reentrant",
        help="gradient checkpointing of actor and critic (the seed's baseline uses it)",
    )
    ds.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    ds.set_defaults(func=cmd_ds)

    prep = sub.add_parser("prep-data", help="write prompts of an exact token length")
    prep.add_argument("--model", required=True, help="checkpoint dir whose tokenizer both sides use")
    prep.add_argument("--data", required=True, help="source parquet (verl-recipes dataset)")
    prep.add_argument("--prompt-len", type=int, default=512)
    prep.add_argument("--limit", type=int, default=2048, help="rows to convert")
    prep.add_argument("--out", required=True)
    prep.set_defaults(func=cmd_prep)

    ov = sub.add_parser("verl-overrides", help="Hydra overrides giving verl this workload")
    _workload_args(ov)
    ov.add_argument("--gpus", type=int, required=True)
    ov.set_defaults(func=cmd_overrides)

    orl = sub.add_parser("openrlhf-args", help="OpenRLHF's command line for this workload, as JSON")
    _workload_args(orl)
    orl.add_argument("--gpus", type=int, required=True)
    orl.add_argument("--run-dir", required=True, help="the OpenRLHF run folder `verl-recipes peers run` will write")
    orl.add_argument("--out", required=True, help="the JSON file to write")
    orl.set_defaults(func=cmd_openrlhf)

    rep = sub.add_parser("report", help="table and plot of a DeepSpeed run and a verl run")
    rep.add_argument("--ds", help="the `ds` output dir")
    rep.add_argument("--verl", help="verl metrics JSONL (trainer.logger file, or the run folder's metrics.jsonl)")
    rep.add_argument("--verl-gpus", type=int, default=None, help="GPUs of the verl run (else from perf/throughput)")
    rep.add_argument("--verl-warmup", type=int, default=None, help="verl warm-up steps (default: the DeepSpeed run's)")
    rep.add_argument("--verl-monitor", help="summary.json of `verl-recipes report` on the verl run (NVML peaks)")
    rep.add_argument("--out", required=True)
    rep.set_defaults(func=cmd_report)

    rec = sub.add_parser("records", help="the project's run records (phases, metrics, provenance) of a `ds` run")
    rec.add_argument("run_dir", help="the `ds` output dir")
    rec.add_argument(
        "--rank-rehearsal",
        metavar="R/N",
        help="a rehearsal made before run.json recorded it: add rank_rehearsal {rank: R, world: N} to run.json",
    )
    rec.set_defaults(func=cmd_records)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return int(a.func(a))


if __name__ == "__main__":
    sys.exit(main())
