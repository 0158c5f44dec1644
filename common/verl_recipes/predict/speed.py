"""How long a step takes, PREDICTED from the card's memory bandwidth and compute: the rollout as
decode steps against the memory roofline, the training phases as FLOPs at an assumed utilisation.

It sets a campaign line's time limit before any run of the configuration exists, and says how far
a measured rollout is from the floor the card allows. Neither is a measurement: every figure this
module gives is printed as a prediction, with the priors it rests on.

The decode roofline. One decode step of B running sequences reads every vLLM weight once and the
KV cache of every token each sequence holds:

    decode_step_s >= (weights_bytes + B x context x kv_bytes_per_token) / memory_bandwidth

For Llama-2-7B (12.55 GiB of bf16 weights, 512 KiB of KV a token: 32 layers x 2 x 4,096 x 2 B, no
grouped KV heads) on an H100 (3.35 TB/s), 84 sequences at a mean context of 558 tokens read
13.5 GB + 24.6 GB a step: 11.4 ms for 84 tokens, 7,400 tokens/s at the floor. At this batch the
KV cache, not the weights, is most of what a step reads, so fewer, shorter sequences at once are
cheaper per step and the rate is bound by how many sequences the KV cache holds.

A rollout of N sequences, P prompt and R response tokens each, at most B at once (vLLM's
`max_num_seqs`, or the sequences the KV cache holds whole): ceil(N / B) waves of R decode steps,
each wave's mean context P + R / 2. Every sequence runs to R (`ignore_eos`): an upper bound.

The training phases. A forward costs 2 x params FLOPs a token plus attention's 4 x layers x
hidden x the mean causal context; old_log_prob and a reference forward one each; the update a
forward and a backward, the backward twice a forward for a full fine-tune and once for LoRA
(gradients of the activations, none of the frozen weights), plus one forward recomputed under
gradient checkpointing.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_recipes import RecipeError
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.inputs import Setup
from verl_recipes.predict.phases import plan_gpu, vllm_weights


@dataclass(frozen=True)
class SpeedPriors:
    """Ratios of measured rates to the card's peaks, from committed runs; priors for any other
    configuration, so every figure built on them is a prediction."""

    # vLLM alone's decode step against this roofline, Llama-2-7B widths on an H200
    # (recipes/7b-lora/comparisons/rollout-vs-vllm.md, prompts of about 46 tokens): 8 answers of
    # 512 tokens, 5.10 ms a step against 3.07 (0.60); 64 answers, 7.91 ms against 4.91 (0.62).
    # 0.55 keeps a time limit on the safe side of both.
    decode_efficiency: float = 0.55
    # Model FLOPs per second over the card's dense bf16 peak in verl's training phases, 7b-lora
    # GRPO 8x8 on an H200 (results/h200x1-grpo-8x8, steps 2-4, padded micro-batches of 8):
    # old_log_prob 4.7e14 FLOPs in 2.2-2.7 s (19%), update_actor 1.4e15 in 5.6-6.0 s (25%).
    train_mfu: float = 0.20
    # One run's start-up, launch to step 1 (results/*/report.md, "Start-up"): 118-159 s for the
    # 7b-lora runs on a warm host (h200x1-ppo-start, -grpo-8x8-packed, -ppo-5, -grpo-8x8), 187 s
    # on a cold one (h200x1-ppo-start-cold).
    start_s: float = 150.0

    def describe(self) -> str:
        """The priors in one line, for every table that prints a figure built on them."""
        return (
            f"decode at {self.decode_efficiency:.0%} of the memory roofline, training at "
            f"{self.train_mfu:.0%} of the card's bf16 peak, {self.start_s:.0f} s start-up"
        )


def load_priors() -> SpeedPriors:
    """The priors every prediction of a step uses."""
    return SpeedPriors()


@dataclass(frozen=True)
class Decode:
    """The decode roofline of one rollout."""

    sequences: int
    concurrent: int  # sequences decoded at once
    prompt_tokens: int
    response_tokens: int
    step_ms: float  # one decode step of `concurrent` sequences at the wave's mean context, floor
    tokens_per_s: float  # generated tokens per second at that floor
    rollout_s: float  # the whole rollout at the floor


@dataclass(frozen=True)
class StepEstimate:
    """A PREDICTED step: seconds per phase, and tokens (prompt + response) per step."""

    gpu: str
    decode: Decode
    phases: dict[str, float]  # gen, old_log_prob, ref, values, update_critic, update_actor
    tokens: int
    priors: SpeedPriors

    @property
    def step_s(self) -> float:
        return sum(self.phases.values())

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / self.step_s

    def run_s(self, steps: int) -> float:
        """A run of `steps` steps from launch: the start-up, then the steps."""
        return self.priors.start_s + steps * self.step_s


def concurrency(s: Setup, gpu: GPU) -> int:
    """Sequences vLLM decodes at once: its `max_num_seqs`, the batch, and the sequences of full
    length its KV cache holds, whichever is least (beyond that vLLM preempts)."""
    seqs = s.train_batch_size * s.rollout.n
    whole = max(1, plan_gpu(s, gpu).kv_tokens // max(1, s.seq_len))
    return max(1, min(s.rollout.max_num_seqs, seqs, whole))


def decode_floor(
    weights_bytes: float,
    kv_bytes_per_token: float,
    bandwidth: float,
    sequences: int,
    concurrent: int,
    prompt_tokens: float,
    response_tokens: float,
) -> Decode:
    """The roofline of `sequences` answers of `response_tokens`, `concurrent` at a time (module
    docstring): each wave's decode steps read the weights and its sequences' KV at the wave's mean
    context, prompt + response / 2."""
    b = max(1, min(concurrent, sequences))
    ctx = prompt_tokens + response_tokens / 2

    def step_s(running: int) -> float:
        return (weights_bytes + running * ctx * kv_bytes_per_token) / bandwidth

    full, rest = divmod(sequences, b)
    total = full * response_tokens * step_s(b) + (response_tokens * step_s(rest) if rest else 0.0)
    one = step_s(b)
    return Decode(sequences, b, round(prompt_tokens), round(response_tokens), round(1000 * one, 3), b / one, total)


def decode_roofline(s: Setup, gpu: GPU, prompt_tokens: int | None = None, response_tokens: int | None = None) -> Decode:
    """The floor of the rollout of one step on one vLLM replica (module docstring)."""
    if not gpu.bandwidth:
        raise RecipeError(f"--gpu {gpu.id}: the catalogue gives no memory bandwidth for it (predict/gpus.yaml)")
    r = s.rollout
    replicas = max(1, s.world // (r.tp * r.pp))
    return decode_floor(
        vllm_weights(s),
        s.arch.kv_bytes_per_token(r.tp, r.dtype_bytes),
        gpu.bandwidth,
        -(-s.train_batch_size * r.n // replicas),
        concurrency(s, gpu),
        s.prompt_len if prompt_tokens is None else prompt_tokens,
        s.response_len if response_tokens is None else response_tokens,
    )


def _forward_flops_per_token(s: Setup, context: float) -> float:
    a = s.arch
    return 2.0 * a.params() + 4.0 * a.layers * a.hidden * context


def estimate(
    s: Setup,
    gpu: GPU,
    prompt_tokens: int | None = None,
    response_tokens: int | None = None,
    priors: SpeedPriors | None = None,
) -> StepEstimate:
    """A step's seconds per phase on `gpu`, PREDICTED (module docstring); sequences at full
    length unless the prompt and response tokens are given."""
    pr = priors or SpeedPriors()
    if not gpu.bf16_flops:
        raise RecipeError(f"--gpu {gpu.id}: the catalogue gives no bf16 rate for it (predict/gpus.yaml)")
    d = decode_roofline(s, gpu, prompt_tokens, response_tokens)
    seq = d.prompt_tokens + d.response_tokens
    tokens = s.train_batch_size * s.rollout.n * seq
    fwd = _forward_flops_per_token(s, seq / 2) * tokens
    rate = gpu.bf16_flops * pr.train_mfu * s.world
    prefill = 2.0 * s.arch.params() * d.prompt_tokens * d.sequences / (gpu.bf16_flops * pr.train_mfu)
    phases = {"gen": d.rollout_s / pr.decode_efficiency + prefill, "old_log_prob": fwd / rate}
    if s.ref != "none":
        phases["ref"] = fwd / rate

    def update(lora: bool, ckpt: bool) -> float:
        return (1.0 + (1.0 if lora else 2.0) + (1.0 if ckpt else 0.0)) * fwd / rate

    if s.critic is not None:
        phases["values"] = fwd / rate
        phases["update_critic"] = update(s.critic.lora_rank > 0, s.critic.grad_ckpt)
    phases["update_actor"] = update(s.actor.lora_rank > 0, s.actor.grad_ckpt)
    return StepEstimate(gpu.id, d, {k: round(v, 2) for k, v in phases.items()}, tokens, pr)
