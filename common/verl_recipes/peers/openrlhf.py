"""OpenRLHF's side: the workload as the command line of `python -m openrlhf.cli.train_ppo_ray`.

OpenRLHF 0.11.2's RL trainer is its `train_ppo_ray` module: Ray actors for the policy and the
reference (DeepSpeed ZeRO engines), vLLM engines for generation, GRPO as
`--algo.advantage.estimator group_norm`. `peers.run_openrlhf` runs that module's own `__main__`
on these flags, with the phases marked.

The `docs` row is the workload plus OpenRLHF's own recommendation, its README's RL example with
the Hybrid Engine ("RL Training: PPO/REINFORCE++ with Ray and vLLM", and "Execution Modes" /
"Performance Tuning": https://github.com/OpenRLHF/OpenRLHF#rl-training-ppo-reinforce-with-ray-and-vllm,
https://openrlhf.readthedocs.io/en/latest/performance.html), with its GPU counts set to one GPU:
every model and the vLLM engine colocated (`--train.colocate_all`), vLLM at 0.5 of the GPU, both
vLLM and DeepSpeed put to sleep between phases, NCCL weight sync, ZeRO stage 3, bf16, gradient
checkpointing, vLLM in eager mode as the example runs it. Two of its speed settings cannot run
here and are left out: sample packing (`--ds.packing_samples`) and dynamic batches (which turn
packing on) make OpenRLHF switch attention to flash_attention_2, and flash-attn has no wheel
(images/peers/openrlhf.toml); attention is OpenRLHF's `--ds.attn_implementation sdpa`.

The `tuned` row turns what we would turn were it ours: ZeRO stage 2 (one GPU has nothing to
partition; stage 3 gathers every layer's weights for each use), vLLM with CUDA graphs (no
`--vllm.enforce_eager`), prefix caching (the README's table: when answers per prompt > 1), and
micro-batches of twice the sequences.

The `full` row is what can be compared where the workload cannot run: OpenRLHF 0.11.2 syncs a
LoRA policy to vLLM by its PEFT parameter names (`base_model.model....base_layer.weight`,
`lora_A`/`lora_B` in float32), which vLLM's loader has no parameter for, so a LoRA run stops at
its first weight sync (OpenRLHF/OpenRLHF#1349, open, on 0.11.0 and 0.11.3). The `full` row trains
every weight instead (no `--ds.lora.*`), with the Adam state on the CPU (`--ds.adam_offload`: a
7B model's fp32 master weights and moments are 75 GiB), everything else as `docs`: its generation
and its memory per phase compare with verl's; its update does not (all weights, not LoRA).

`ppo_argv` composes recipe verl-vs-deepspeed's workload (PPO with a critic, every weight trained)
for OpenRLHF: there it is the maintained DeepSpeed-based trainer beside the recipe's own ZeRO-3
loop (`recipes/verl-vs-deepspeed/compare.py openrlhf-args`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import importlib.util
import io
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import RecipeError
from verl_recipes.peers.workload import LINEAR, Knob, Paths, Workload, argv_of

PEER = "openrlhf"
VERSION = "0.11.2"
#: the module whose `__main__` the launcher runs
MODULE = "openrlhf.cli.train_ppo_ray"
ROWS = ("docs", "tuned", "full")
DOCS = "https://github.com/OpenRLHF/OpenRLHF#rl-training-ppo-reinforce-with-ray-and-vllm"
DOCS_TUNING = "https://openrlhf.readthedocs.io/en/latest/performance.html"
LORA_SYNC_ISSUE = "https://github.com/OpenRLHF/OpenRLHF/issues/1349"
#: the dataset's columns the launcher writes (peers.data): the prompt rendered by the checkpoint's
#: own chat template, and the answer
INPUT_KEY, LABEL_KEY = "prompt_text", "ground_truth"


def workload_knobs(w: Workload, p: Paths, reward_file: str) -> list[Knob]:
    """What the workload fixes, in OpenRLHF's words."""
    b = w.batch
    wl = "the workload"
    one = "one GPU"
    return [
        *(Knob(f"--{role}.num_nodes", "1", one) for role in ("actor", "ref", "critic", "reward")),
        *(Knob(f"--{role}.num_gpus_per_node", "1", one) for role in ("actor", "ref", "critic", "reward")),
        Knob("--vllm.num_engines", "1", f"{one}: one vLLM engine"),
        Knob("--vllm.tensor_parallel_size", "1", one),
        Knob("--actor.model_name_or_path", p.model, f"{wl}: the synthetic {w.arch} checkpoint"),
        Knob("--data.prompt_dataset", p.data, f"{wl}: the embedded prompts (peers.data)"),
        Knob(
            "--data.input_key",
            INPUT_KEY,
            f"{wl}: the prompt as the checkpoint's chat template renders it, as verl and TRL send it "
            "(OpenRLHF's --data.apply_chat_template turns string contents into content lists, which the "
            "synthetic ChatML template prints as lists)",
        ),
        Knob("--data.label_key", LABEL_KEY, f"{wl}: the answer the reward checks"),
        Knob("--data.max_samples", str(b.steps * b.prompts), f"{wl}: {b.steps} steps of {b.prompts} prompts"),
        Knob("--reward.remote_url", reward_file, f"{wl}: the recipe's rule reward, as OpenRLHF's reward_func file"),
        Knob("--ckpt.output_dir", p.out, "where OpenRLHF saves the final model"),
        Knob("--ckpt.path", str(Path(p.out) / "ckpt"), "OpenRLHF's checkpoint folder (no checkpoints are saved)"),
        Knob("--train.num_episodes", "1", f"{wl}: one pass over its {b.steps * b.prompts} prompts"),
        Knob("--rollout.batch_size", str(b.prompts), f"{wl}: {b.prompts} prompts a step"),
        Knob("--rollout.n_samples_per_prompt", str(b.answers), f"{wl}: {b.answers} answers a prompt"),
        Knob("--train.batch_size", str(b.sequences), f"{wl}: one optimizer step over all {b.sequences} sequences"),
        Knob("--train.micro_batch_size", str(b.micro_batch), f"{wl}: micro-batches of {b.micro_batch} sequences"),
        Knob("--rollout.micro_batch_size", str(b.micro_batch), f"{wl}: log-prob forwards of {b.micro_batch}"),
        Knob("--train.max_epochs", "1", f"{wl}: one pass over each batch"),
        Knob("--rollout.max_new_tokens", str(b.max_response_tokens), f"{wl}: answers up to this many tokens"),
        Knob("--data.max_len", str(w.max_model_len), f"{wl}: prompt plus answer"),
        Knob("--rollout.temperature", str(w.temperature), f"{wl}: sampling"),
        Knob("--rollout.top_p", str(w.top_p), f"{wl}: sampling (OpenRLHF samples without top-k)"),
        Knob("--algo.advantage.estimator", "group_norm", f"{wl}: GRPO (OpenRLHF's name for it)"),
        Knob("--algo.kl.use_loss", None, f"{wl}: the KL as a loss"),
        Knob("--algo.kl.estimator", w.kl_estimator, f"{wl}: the k3 estimator"),
        Knob("--algo.kl.init_coef", str(w.kl_coef), f"{wl}: the KL loss's weight"),
        Knob("--actor.eps_clip", str(w.clip), f"{wl}: the PPO clip"),
        Knob("--actor.adam.lr", str(w.learning_rate), f"{wl}: AdamW's rate"),
        Knob("--actor.lr_scheduler", "constant", f"{wl}: a constant rate"),
        Knob("--actor.max_norm", str(w.grad_clip), f"{wl}: the gradient clip"),
        Knob("--ds.lora.rank", str(w.lora_rank), f"{wl}: LoRA rank"),
        Knob("--ds.lora.alpha", str(w.lora_alpha), f"{wl}: LoRA alpha"),
        Knob("--ds.lora.dropout", str(w.lora_dropout), f"{wl}: no LoRA dropout"),
        Knob(
            "--ds.lora.target_modules",
            LINEAR,
            f"{wl}: every linear layer, by name (given on the command line, OpenRLHF passes PEFT a list, "
            "in which 'all-linear' is no shorthand)",
        ),
        Knob("--ds.attn_implementation", "sdpa", "flash-attn has no wheel (images/peers/openrlhf.toml)"),
        Knob("--actor.gradient_checkpointing_enable", None, f"{wl} (and the README's example)"),
        Knob("--train.seed", str(w.seed), f"{wl}: the seed"),
        Knob("--logger.logging_steps", "1", "a log line every step"),
    ]


def docs_knobs() -> list[Knob]:
    """OpenRLHF's own recommendation (module docstring)."""
    return [
        Knob("--train.colocate_all", None, f"Hybrid Engine: every model and vLLM on the GPU ({DOCS})"),
        Knob("--vllm.gpu_memory_utilization", "0.5", f"the README's Hybrid Engine setting ({DOCS})"),
        Knob("--vllm.enable_sleep", None, f"Hybrid Engine: vLLM sleeps while the models train ({DOCS})"),
        Knob("--ds.enable_sleep", None, f"Hybrid Engine: DeepSpeed's states leave the GPU while vLLM runs ({DOCS})"),
        Knob("--vllm.sync_backend", "nccl", f"the README: 'Always use --vllm.sync_backend nccl' ({DOCS_TUNING})"),
        Knob("--vllm.enforce_eager", None, f"as the README's RL example runs vLLM ({DOCS})"),
        Knob("--ds.zero_stage", "3", f"the README's RL example ({DOCS})"),
        Knob("--ds.param_dtype", "bf16", f"the README's RL example; the workload's bf16 ({DOCS})"),
    ]


def tuned_knobs(w: Workload) -> dict[str, Knob | str]:
    """The knobs we would turn were OpenRLHF ours, by flag; a string drops the flag, and says why."""
    micro = str(2 * w.batch.micro_batch)
    return {
        "--ds.zero_stage": Knob(
            "--ds.zero_stage", "2", "time (-): one GPU has nothing to partition; stage 3 gathers each layer per use"
        ),
        "--vllm.enforce_eager": "time (-): vLLM decodes with CUDA graphs",
        "--vllm.enable_prefix_caching": Knob(
            "--vllm.enable_prefix_caching", None, f"time (-): the answers of a prompt share it ({DOCS_TUNING})"
        ),
        "--train.micro_batch_size": Knob(
            "--train.micro_batch_size", micro, "time (-), memory (+): half the launches of the update"
        ),
        "--rollout.micro_batch_size": Knob(
            "--rollout.micro_batch_size", micro, "time (-), memory (+): half the launches of the log-prob forwards"
        ),
    }


def full_knobs() -> dict[str, Knob | str]:
    """The `full` row's changes to `docs`: every weight trained, Adam's state on the CPU."""
    why = f"every weight trains: OpenRLHF {VERSION} cannot sync a LoRA policy to vLLM ({LORA_SYNC_ISSUE})"
    return {
        **dict.fromkeys((f"--ds.lora.{k}" for k in ("rank", "alpha", "dropout", "target_modules")), why),
        "--ds.adam_offload": Knob(
            "--ds.adam_offload",
            None,
            "memory (-): a full 7B fine-tune's fp32 master weights and Adam moments (75 GiB) live on the CPU",
        ),
    }


def _apply(base: list[Knob], changes: dict[str, Knob | str]) -> list[Knob]:
    """`base` with each changed flag replaced (a Knob) or dropped (a string, the reason), then the
    new flags."""
    out = [changes.get(k.flag, k) for k in base]
    new = [k for f, k in changes.items() if isinstance(k, Knob) and f not in {b.flag for b in base}]
    return [k for k in out if isinstance(k, Knob)] + new


def dropped(w: Workload, row: str) -> dict[str, str]:
    """The flags of `docs` a row leaves out, each with why."""
    changes = {"tuned": tuned_knobs(w), "full": full_knobs()}.get(row, {})
    return {f: why for f, why in changes.items() if isinstance(why, str)}


def knobs(w: Workload, row: str, p: Paths, reward_file: str) -> list[Knob]:
    base = [*workload_knobs(w, p, reward_file), *docs_knobs()]
    if row == "docs":
        return base
    if row == "tuned":
        return _apply(base, tuned_knobs(w))
    if row == "full":
        return _apply(base, full_knobs())
    raise RecipeError(f"OpenRLHF's rows are {', '.join(ROWS)}, not {row!r}")


def argv(w: Workload, row: str, p: Paths, reward_file: str) -> list[str]:
    """`python -m openrlhf.cli.train_ppo_ray ARGV`."""
    return argv_of(knobs(w, row, p, reward_file))


# --- OpenRLHF's own parser, without its training stack -------------------------------------------


def _main_block(tree: ast.Module) -> list[ast.stmt]:
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        t = node.test
        if (
            isinstance(t, ast.Compare)
            and isinstance(t.left, ast.Name)
            and t.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in t.comparators)
        ):
            return node.body
    raise RecipeError('train_ppo_ray.py has no `if __name__ == "__main__":` block: not OpenRLHF 0.11\'s layout')


def parse_args(package: Path, argv: list[str]) -> types.SimpleNamespace:
    """OpenRLHF's own `__main__` block of train_ppo_ray.py, from the package folder `package`
    (`.../openrlhf`), run on `argv` up to the `train(args)` it ends with: its argparse definitions,
    `hierarchize` and every check it makes of the arguments, without importing Ray, DeepSpeed or
    vLLM (the module's imports above the block are not run). Returns the arguments `train` would
    get; a flag OpenRLHF does not know, a value it refuses or a failed check is a RecipeError with
    OpenRLHF's own message."""
    source = package / "cli" / "train_ppo_ray.py"
    config = package / "utils" / "config.py"
    if not source.is_file() or not config.is_file():
        raise RecipeError(f"{package}: no cli/train_ppo_ray.py and utils/config.py; give the openrlhf package folder")
    block = ast.Module(body=_main_block(ast.parse(source.read_text())), type_ignores=[])
    spec = importlib.util.spec_from_file_location("openrlhf.utils.config", config)
    assert spec is not None and spec.loader is not None
    cfg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cfg)
    stubs = {"openrlhf": types.ModuleType("openrlhf"), "openrlhf.utils": types.ModuleType("openrlhf.utils")}
    stubs["openrlhf.utils"].config = cfg  # type: ignore[attr-defined]
    stubs["openrlhf"].utils = stubs["openrlhf.utils"]  # type: ignore[attr-defined]
    got: list[types.SimpleNamespace] = []
    scope = {"argparse": argparse, "datetime": datetime.datetime, "os": os, "train": got.append}
    saved = {k: sys.modules.get(k) for k in [*stubs, "openrlhf.utils.config"]}
    argv0, err = sys.argv, io.StringIO()
    try:
        sys.modules.update(stubs)
        sys.modules["openrlhf.utils.config"] = cfg
        sys.argv = ["train_ppo_ray.py", *argv]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(block, str(source), "exec"), scope)
    except SystemExit:
        said = err.getvalue().strip().splitlines()
        raise RecipeError(f"OpenRLHF {VERSION} refuses the arguments: {said[-1] if said else 'exit'}") from None
    except AssertionError as e:
        raise RecipeError(f"OpenRLHF {VERSION}'s own check failed: {e}") from None
    finally:
        sys.argv = argv0
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    if not got:
        raise RecipeError("train_ppo_ray.py's main block ended without calling train(args)")
    return got[0]


# --- recipe verl-vs-deepspeed's PPO workload ------------------------------------------------------


@dataclass(frozen=True)
class PPOJob:
    """Recipe verl-vs-deepspeed's workload (its `compare.py` Workload and verl's PPO constants):
    PPO with a critic and a reference, every weight trained, prompts of exactly `prompt_len`
    tokens; sizes are global, micro-batches per GPU."""

    prompt_len: int
    response_len: int
    batch: int  # prompts a step
    mini_batch: int  # prompts an optimizer step
    train_micro: int
    infer_micro: int
    steps: int
    use_ref: bool
    seed: int
    gpus: int
    kl_coef: float
    gamma: float
    lam: float
    clip: float
    value_clip: float
    actor_lr: float
    critic_lr: float
    grad_clip: float


def ppo_knobs(job: PPOJob, model: str, p: Paths, reward_file: str) -> list[Knob]:
    """The DeepSpeed-based peer on recipe verl-vs-deepspeed's workload, as OpenRLHF's README
    recommends (the Hybrid Engine of the `docs` row); where OpenRLHF has no such setting, it says
    so: EOS cannot be ignored (answers end where a random model samples its stop token, rarely),
    and its data loader shuffles the (equal-length) prompts."""
    wl = "recipe verl-vs-deepspeed's workload"
    n = str(job.gpus)
    return [
        *(Knob(f"--{role}.num_nodes", "1", "one node") for role in ("actor", "ref", "critic", "reward")),
        *(Knob(f"--{role}.num_gpus_per_node", n, f"{n} GPU(s)") for role in ("actor", "ref", "critic", "reward")),
        Knob("--vllm.num_engines", n, "one vLLM engine a GPU (colocated)"),
        Knob("--vllm.tensor_parallel_size", "1", "each engine on one GPU"),
        Knob("--actor.model_name_or_path", model, f"{wl}: the synthetic checkpoint"),
        Knob("--critic.model_name_or_path", model, f"{wl}: the critic from the same checkpoint"),
        Knob("--data.prompt_dataset", p.data, f"{wl}: its prompts of exactly {job.prompt_len} tokens"),
        Knob("--data.input_key", INPUT_KEY, f"{wl}: the prompt as the checkpoint's template renders it"),
        Knob("--data.label_key", LABEL_KEY, f"{wl}: the answer the reward checks"),
        Knob("--data.max_samples", str(job.batch * job.steps), f"{wl}: {job.steps} steps of {job.batch} prompts"),
        Knob("--reward.remote_url", reward_file, f"{wl}: the rule reward, as OpenRLHF's reward_func file"),
        Knob("--ckpt.output_dir", p.out, "where OpenRLHF saves the final model"),
        Knob("--ckpt.path", str(Path(p.out) / "ckpt"), "OpenRLHF's checkpoint folder (no checkpoints are saved)"),
        Knob("--train.num_episodes", "1", f"{wl}: one pass over the prompts"),
        Knob("--rollout.batch_size", str(job.batch), f"{wl}: {job.batch} prompts a step"),
        Knob("--rollout.n_samples_per_prompt", "1", f"{wl}: one answer a prompt"),
        Knob("--train.batch_size", str(job.mini_batch), f"{wl}: {job.mini_batch} sequences an optimizer step"),
        Knob("--train.micro_batch_size", str(job.train_micro), f"{wl}: update micro-batches per GPU"),
        Knob("--rollout.micro_batch_size", str(job.infer_micro), f"{wl}: log-prob and value micro-batches per GPU"),
        Knob("--train.max_epochs", "1", f"{wl}: one pass over each batch"),
        Knob("--rollout.max_new_tokens", str(job.response_len), f"{wl}: answers of up to {job.response_len} tokens"),
        Knob("--data.max_len", str(job.prompt_len + job.response_len), f"{wl}: prompt plus answer"),
        Knob("--rollout.temperature", "1.0", f"{wl}: sampling"),
        Knob("--rollout.top_p", "1.0", f"{wl}: sampling"),
        Knob("--algo.advantage.estimator", "gae", f"{wl}: PPO's GAE with a critic"),
        Knob("--algo.advantage.gamma", str(job.gamma), f"{wl}: verl's gamma"),
        Knob("--algo.advantage.lambd", str(job.lam), f"{wl}: verl's lambda"),
        Knob("--algo.kl.init_coef", str(job.kl_coef if job.use_ref else 0.0), f"{wl}: the KL penalty in the reward"),
        Knob("--algo.kl.estimator", "k1", f"{wl}: verl's `kl` penalty (k1)"),
        Knob("--actor.eps_clip", str(job.clip), f"{wl}: the PPO clip"),
        Knob("--critic.value_clip", str(job.value_clip), f"{wl}: the value clip"),
        Knob("--actor.adam.lr", str(job.actor_lr), f"{wl}: verl's actor rate"),
        Knob("--critic.adam.lr", str(job.critic_lr), f"{wl}: verl's critic rate"),
        *(Knob(f"--{m}.lr_scheduler", "constant", f"{wl}: a constant rate") for m in ("actor", "critic")),
        *(Knob(f"--{m}.max_norm", str(job.grad_clip), f"{wl}: the gradient clip") for m in ("actor", "critic")),
        Knob("--ds.attn_implementation", "sdpa", "flash-attn has no wheel (images/peers/openrlhf.toml)"),
        Knob("--actor.gradient_checkpointing_enable", None, f"{wl} (and the README's example)"),
        Knob("--train.seed", str(job.seed), f"{wl}: the seed"),
        Knob("--logger.logging_steps", "1", "a log line every step"),
        *docs_knobs(),
    ]


def ppo_argv(job: PPOJob, model: str, p: Paths, reward_file: str) -> list[str]:
    """`python -m openrlhf.cli.train_ppo_ray ARGV` for recipe verl-vs-deepspeed's workload."""
    if job.batch % job.mini_batch or job.mini_batch % job.gpus:
        raise RecipeError(f"batch {job.batch}, mini-batch {job.mini_batch}, {job.gpus} GPUs do not divide")
    return argv_of(ppo_knobs(job, model, p, reward_file))
