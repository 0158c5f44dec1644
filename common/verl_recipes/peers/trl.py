"""TRL's side: the workload as the command line of TRL's own GRPO script (`trl grpo`).

TRL 1.16.0 ships the script a user runs, `trl/scripts/grpo.py`: its parser (`make_parser`, a
TrlParser over GRPOScriptArguments, GRPOConfig, ModelConfig and DatasetMixtureConfig) reads these
flags, and its `main` builds the GRPOTrainer with vLLM in the training process and a PEFT LoRA
config. `peers.run_trl` runs exactly that `main` on these flags, with the phases marked.

The `docs` row is the workload plus what TRL's documentation recommends for one GPU:
- vLLM colocated in the training process (`--use_vllm true --vllm_mode colocate`), sharing the GPU
  at TRL's default 0.3 of its memory: the vLLM integration guide, "Colocate mode"
  (https://huggingface.co/docs/trl/main/en/vllm_integration), and "No GPU left behind"
  (https://huggingface.co/blog/vllm-colocate: "you may need to adjust vllm_gpu_memory_utilization");
- vLLM's context at prompt plus completion (`vllm_max_model_length`, GRPOConfig's own help: "at
  least the maximum prompt length in the dataset plus max_completion_length");
- LoRA through the script's PEFT flags (`--use_peft --lora_r --lora_alpha --lora_target_modules`):
  the PEFT integration guide (https://huggingface.co/docs/trl/main/en/peft_integration);
- GRPOConfig's own defaults for the rest: gradient checkpointing on, bf16 autocast, TRL's
  "dapo" loss (token-level, the workload's token mean), rewards scaled by the group's std.

The `tuned` row turns what we would turn were it ours, each said in its knob: vLLM's sleep mode
(TRL's "Reducing Memory Usage" guide, https://huggingface.co/docs/trl/main/en/reducing_memory_usage:
the engine's weights and KV cache leave the GPU while the model trains, as verl's rollout does with
`free_cache_engine`), and micro-batches of twice the sequences (half the forward and backward
launches; the recipe measured LoRA's update launch-bound at small micro-batches).
"""

from __future__ import annotations

from verl_recipes import RecipeError
from verl_recipes.peers.workload import Knob, Paths, Workload, argv_of

PEER = "trl"
VERSION = "1.16.0"
#: the script whose parser and main the launcher runs (`trl grpo`)
SCRIPT = "trl.scripts.grpo"
REWARD = "verl_recipes.peers.rewards.trl_reward"
DOCS_VLLM = "https://huggingface.co/docs/trl/main/en/vllm_integration"
DOCS_PEFT = "https://huggingface.co/docs/trl/main/en/peft_integration"
DOCS_MEMORY = "https://huggingface.co/docs/trl/main/en/reducing_memory_usage"
DOCS_GRPO = "https://huggingface.co/docs/trl/main/en/grpo_trainer"


def _b(v: bool) -> str:
    return "true" if v else "false"


def workload_knobs(w: Workload, p: Paths) -> list[Knob]:
    """What the workload fixes, in TRL's words."""
    b = w.batch
    wl = "the workload"
    return [
        Knob("--model_name_or_path", p.model, f"{wl}: the synthetic {w.arch} checkpoint"),
        Knob("--dtype", "bfloat16", f"{wl}: bf16 weights (the script's default loads float32)"),
        Knob("--dataset_name", p.data, f"{wl}: the embedded prompts as chat messages (peers.data)"),
        Knob("--dataset_train_split", "train", f"{wl}: the prompts' split"),
        Knob("--reward_funcs", REWARD, f"{wl}: the recipe's rule reward (peers.rewards)"),
        Knob("--output_dir", p.out, "where TRL writes its adapter and logs"),
        Knob("--max_steps", str(b.steps), f"{wl}: {b.steps} steps"),
        Knob("--per_device_train_batch_size", str(b.micro_batch), f"{wl}: micro-batches of {b.micro_batch} sequences"),
        Knob(
            "--gradient_accumulation_steps",
            str(w.micro_steps),
            f"{wl}: one optimizer step over all {b.sequences} sequences; TRL generates that many at once "
            "(steps_per_generation defaults to it)",
        ),
        Knob("--num_generations", str(b.answers), f"{wl}: {b.answers} answers a prompt"),
        Knob("--max_completion_length", str(b.max_response_tokens), f"{wl}: answers up to this many tokens"),
        Knob("--temperature", str(w.temperature), f"{wl}: sampling"),
        Knob("--top_p", str(w.top_p), f"{wl}: sampling"),
        Knob("--top_k", str(w.top_k or 0), f"{wl}: no top-k (TRL's 0)"),
        Knob("--beta", str(w.kl_coef), f"{wl}: the KL loss to the reference (TRL's is the k3 estimator)"),
        Knob("--epsilon", str(w.clip), f"{wl}: the PPO clip"),
        Knob("--num_iterations", "1", f"{wl}: one pass over each batch"),
        Knob("--learning_rate", str(w.learning_rate), f"{wl}: AdamW's rate"),
        Knob("--lr_scheduler_type", "constant", f"{wl}: a constant rate"),
        Knob("--max_grad_norm", str(w.grad_clip), f"{wl}: the gradient clip"),
        Knob("--gradient_checkpointing", _b(w.gradient_checkpointing), f"{wl} (and GRPOConfig's default)"),
        Knob("--use_peft", "true", f"{wl}: LoRA ({DOCS_PEFT})"),
        Knob("--lora_r", str(w.lora_rank), f"{wl}: LoRA rank"),
        Knob("--lora_alpha", str(w.lora_alpha), f"{wl}: LoRA alpha"),
        Knob("--lora_dropout", str(w.lora_dropout), f"{wl}: no LoRA dropout"),
        Knob("--lora_target_modules", w.lora_targets, f"{wl}: every linear layer"),
        Knob("--seed", str(w.seed), f"{wl}: the seed"),
        Knob("--logging_steps", "1", "a log line every step"),
        Knob("--save_strategy", "no", "no checkpoints: they are not part of a step"),
        Knob("--report_to", "none", "no tracker on an offline host"),
    ]


def docs_knobs(w: Workload) -> list[Knob]:
    """What TRL's documentation recommends for one GPU (module docstring)."""
    return [
        Knob("--use_vllm", "true", f"vLLM generates ({DOCS_VLLM})"),
        Knob("--vllm_mode", "colocate", f"vLLM in the training process, on its GPU ({DOCS_VLLM}, 'Colocate mode')"),
        Knob("--vllm_gpu_memory_utilization", "0.3", "TRL's default share of the GPU for vLLM in colocate mode"),
        Knob("--vllm_max_model_length", str(w.max_model_len), "prompt plus completion (GRPOConfig's help)"),
        Knob("--bf16", "true", f"GRPOConfig's default: bf16 autocast ({DOCS_GRPO})"),
    ]


def tuned_knobs(w: Workload) -> dict[str, Knob]:
    """The knobs we would turn were TRL ours, by flag (module docstring)."""
    micro = 2 * w.batch.micro_batch
    return {
        "--vllm_enable_sleep_mode": Knob(
            "--vllm_enable_sleep_mode",
            "true",
            f"memory (-): vLLM's weights and KV cache leave the GPU while the model trains, as verl's rollout "
            f"sleeps ({DOCS_MEMORY}); time (+): they come back before each generation",
        ),
        "--per_device_train_batch_size": Knob(
            "--per_device_train_batch_size",
            str(micro),
            f"time (-), memory (+): micro-batches of {micro} sequences, half the launches of LoRA's small matmuls",
        ),
        "--gradient_accumulation_steps": Knob(
            "--gradient_accumulation_steps",
            str(w.batch.sequences // micro),
            f"still one optimizer step over all {w.batch.sequences} sequences",
        ),
    }


def knobs(w: Workload, row: str, p: Paths) -> list[Knob]:
    """Every knob of a row, the workload's first."""
    base = [*workload_knobs(w, p), *docs_knobs(w)]
    if row == "docs":
        return base
    if row == "tuned":
        turn = tuned_knobs(w)
        return [turn.pop(k.flag, k) for k in base] + list(turn.values())
    raise RecipeError(f"TRL's rows are docs and tuned, not {row!r}")


def argv(w: Workload, row: str, p: Paths) -> list[str]:
    """The script's command line (`trl grpo ARGV`)."""
    if w.batch.sequences % w.batch.answers:
        raise RecipeError("a TRL generation batch must hold whole groups")
    return argv_of(knobs(w, row, p))
