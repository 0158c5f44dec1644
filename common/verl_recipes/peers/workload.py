"""The one workload every side of the peers comparison runs: 7b-lora's GRPO job.

verl runs it as the recipe (`7b-lora --variant grpo --variant 8x8`); TRL and OpenRLHF get it
through `peers.trl` and `peers.openrlhf`, which read every number below and nothing else, so the
three differ only in what each framework chooses for itself (and what a row says it turns).

What is held equal, and why each number is what it is:
- the model: the bundled Llama-2-7B widths as a random-weight checkpoint (`synth-model`), its
  byte-level tokenizer and ChatML template; bf16 weights;
- the prompts: the embedded arithmetic dataset (`verl-recipes dataset`, seed 0), as chat
  messages with the template applied, at most 512 prompt tokens (they are about 45);
- the answers: `answers` per prompt, sampled at temperature 1.0, top-p 1.0, no top-k, up to
  `max_response_tokens` each; EOS ends an answer where it is sampled (a random model samples its
  two stop ids about once in 16,000 tokens), and every side counts the tokens it generated;
- the reward: `verl_recipes.workload.reward.compute_score` (1.0 for the right integer);
- the update: GRPO advantages (group mean and std), the PPO clip 0.2, a KL loss of 0.001 to the
  reference (the k3 estimator: verl's low_var_kl, TRL's and OpenRLHF's k3), one optimizer step
  over every sequence of the step (one epoch, one mini-batch), micro-batches of `micro_batch`
  sequences, gradient norm clipped at 1.0, AdamW at 1e-6 (verl's default, the recipe's);
- LoRA rank 64, alpha 128, dropout 0, on every linear layer; the reference is the base model
  (LoRA's adapter off, where the peer can);
- gradient checkpointing on; `steps` steps; figures are medians of steps 2+ (step 1 carries
  compiles and warm-ups, `rundir.STEADY_FROM`).

Two batches: `8x8` (the recipe's variant: 8 prompts x 8 answers, answers up to 512 tokens) and
`prod` (64 prompts x 8 answers = 512 sequences, answers up to 1024 tokens: the batch people train
with). verl runs `prod` as the 8x8 variant with the batch, the answers' length and the rollout's
concurrency set to it (`verl_train_args`).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_recipes import RecipeError

#: the recipe whose job this is, and the variants that make it on verl
RECIPE = "7b-lora"
VERL_VARIANTS = ("grpo", "8x8")
#: Llama's linear layers: what PEFT's "all-linear" picks (the output layer left out), for a peer
#: whose command line takes names only
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Batch:
    """What one step holds."""

    name: str
    prompts: int
    answers: int  # per prompt (GRPO's group)
    max_response_tokens: int
    micro_batch: int  # sequences per forward/backward of the update
    steps: int

    @property
    def sequences(self) -> int:
        return self.prompts * self.answers


BATCHES: dict[str, Batch] = {
    # the recipe's 8x8 variant: its actor micro-batch of 8, 4 steps as its campaigns run it
    "8x8": Batch("8x8", prompts=8, answers=8, max_response_tokens=512, micro_batch=8, steps=4),
    # 512 sequences of up to 1,024 new tokens: about 550k tokens a step, minutes a step on one GPU,
    # so 3 steps (medians of steps 2-3)
    "prod": Batch("prod", prompts=64, answers=8, max_response_tokens=1024, micro_batch=8, steps=3),
}


@dataclass(frozen=True)
class Workload:
    batch: Batch
    arch: str = "llama-2-7b"
    dtype: str = "bf16"
    dataset_seed: int = 0
    seed: int = 42
    max_prompt_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # none: every token may be sampled
    lora_rank: int = 64
    lora_alpha: int = 128
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"  # PEFT's shorthand: LINEAR on Llama
    learning_rate: float = 1e-6
    clip: float = 0.2
    kl_coef: float = 0.001
    kl_estimator: str = "k3"
    grad_clip: float = 1.0
    gradient_checkpointing: bool = True
    reward: str = "verl_recipes.workload.reward.compute_score"

    @property
    def max_model_len(self) -> int:
        """Prompt and answer together: the rollout engine's context."""
        return self.max_prompt_tokens + self.batch.max_response_tokens

    @property
    def micro_steps(self) -> int:
        """Micro-batches in the one optimizer step over the whole batch."""
        return self.batch.sequences // self.batch.micro_batch

    @property
    def label(self) -> str:
        """The batch as a run name's variant: the recipe's `8x8`, or `prod`."""
        return self.batch.name


def workload(batch: str) -> Workload:
    """The workload at one of BATCHES; an unknown name gets the list."""
    if batch not in BATCHES:
        raise RecipeError(f"batch {batch!r}: choose one of {', '.join(BATCHES)}")
    b = BATCHES[batch]
    if b.sequences % b.micro_batch:
        raise RecipeError(f"batch {batch}: {b.sequences} sequences do not split into micro-batches of {b.micro_batch}")
    return Workload(b)


def verl_train_args(w: Workload) -> list[str]:
    """`verl-recipes train` arguments for verl's side: the recipe's own variants, and for `prod`
    only what the workload changes (the batch, the answers' length, one update over the whole
    batch, and vLLM allowed to hold every sequence of it at once, as the 8x8 variant does with its
    64), nothing verl would choose for itself."""
    args = [RECIPE, *(a for v in VERL_VARIANTS for a in ("--variant", v)), "--steps", str(w.batch.steps)]
    base = workload("8x8")
    if w.batch == base.batch:
        return args
    sets = {
        "data.train_batch_size": w.batch.prompts,
        "data.max_response_length": w.batch.max_response_tokens,
        "actor_rollout_ref.rollout.n": w.batch.answers,
        "actor_rollout_ref.actor.ppo_mini_batch_size": w.batch.prompts,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": w.batch.micro_batch,
        "actor_rollout_ref.rollout.max_num_seqs": w.batch.sequences,
    }
    return [*args, *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]


#: the rows each peer gets: its documentation's one-GPU setting, and the knobs we would turn were
#: it ours (each knob says which way it moves what and why); OpenRLHF adds `full` (peers.openrlhf)
ROWS = ("docs", "tuned")


@dataclass(frozen=True)
class Knob:
    """One setting of a peer's command line, and why it has this value: the workload's number, the
    page of the peer's documentation that recommends it, or the reason we turn it."""

    flag: str
    value: str | tuple[str, ...] | None  # None: a flag without a value (store_true); a tuple: nargs
    why: str

    def argv(self) -> list[str]:
        if self.value is None:
            return [self.flag]
        return [self.flag, *((self.value,) if isinstance(self.value, str) else self.value)]


@dataclass(frozen=True)
class Paths:
    """Where a peer's run reads and writes: the checkpoint, the prompts (jsonl, `peers.data`), its
    own output folder."""

    model: str
    data: str
    out: str


def argv_of(knobs: list[Knob]) -> list[str]:
    """The command line of a row; a flag given twice is a composition error, not a silent override."""
    seen: set[str] = set()
    for k in knobs:
        if k.flag in seen:
            raise RecipeError(f"{k.flag} is set twice in one row; a row names each flag once")
        seen.add(k.flag)
    return [a for k in knobs for a in k.argv()]
