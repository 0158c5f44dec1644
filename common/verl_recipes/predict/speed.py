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

What the roofline leaves out, each a term whose size the committed runs fit
(`plan.speed_fit` writes `predict/speed_fits.yaml`, read here; `plan --speed-errors` holds every
figure to the runs):

- a training pass costs a fixed time per layer per micro-batch beside its FLOPs (`layer_pass_s`):
  verl's FSDP and autograd launch each layer's kernels from Python, micro-batch by micro-batch,
  so a small model's small matmuls wait on the launches (verl's own `perf/mfu/actor` reads 0.03
  for Qwen2.5-0.5B at 4 sequences a micro-batch on an H100). The passes are those the FLOPs count:
  one for a forward, three or four for an update.
- each decode step samples every running sequence over the whole vocabulary
  (`sample_s_per_logit`: seconds per sequence and vocabulary entry): vLLM's sampler and verl's
  log-probabilities read the logits, which the weights-and-KV roofline does not count; at 256
  sequences of a 151,936-token vocabulary it outweighs a 0.5B model's roofline tenfold.
- the weight sync to vLLM after the update (`weight_sync_s`), one figure.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import yaml

from verl_recipes import RecipeError
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.inputs import Role, Setup
from verl_recipes.predict.phases import plan_gpu, vllm_weights


@dataclass(frozen=True)
class SpeedPriors:
    """Ratios of measured rates to the card's peaks, from committed runs; priors for any other
    configuration, so every figure built on them is a prediction."""

    # The defaults are the roofline's first priors, kept for a reader to compare with; every
    # prediction uses `FITTED`, these with the data file's fitted values in place
    # (predict/speed_fits.yaml names its runs, n and the spread each fit leaves).
    # vLLM alone's decode step against this roofline, Llama-2-7B widths on an H200
    # (recipes/7b-lora/comparisons/rollout-vs-vllm.md, prompts of about 46 tokens): 8 answers of
    # 512 tokens, 5.10 ms a step against 3.07 (0.60); 64 answers, 7.91 ms against 4.91 (0.62).
    # The fit to verl's rollouts finds 0.62 with the sampling term beside it.
    decode_efficiency: float = 0.55
    # Model FLOPs per second over the card's dense bf16 peak in verl's training phases, 7b-lora
    # GRPO 8x8 on an H200 (results/h200x1-grpo-8x8, steps 2-4, padded micro-batches of 8):
    # old_log_prob 4.7e14 FLOPs in 2.2-2.7 s (19%), update_actor 1.4e15 in 5.6-6.0 s (25%). Those
    # ratios include the per-layer cost of each micro-batch; with it apart (layer_pass_s) the fit
    # finds the matmuls' own rate higher.
    train_mfu: float = 0.20
    # One run's start-up, launch to step 1 (results/*/report.md, "Start-up"): 118-159 s for the
    # 7b-lora runs on a warm host (h200x1-ppo-start, -grpo-8x8-packed, -ppo-5, -grpo-8x8), 187 s
    # on a cold one (h200x1-ppo-start-cold).
    start_s: float = 150.0
    # The terms beyond the roofline (module docstring); 0 here, their fitted values in
    # predict/speed_fits.yaml: the Qwen2.5-0.5B quickstart (validation/verl-examples, 64
    # micro-batches of 4 in each update, 256 answers over a 151,936-token vocabulary) is what
    # sizes the first two, the 7B and 13B runs what bound them.
    layer_pass_s: float = 0.0
    sample_s_per_logit: float = 0.0
    weight_sync_s: float = 0.0

    def describe(self) -> str:
        """The priors in one line, for every table that prints a figure built on them."""
        return (
            f"decode at {self.decode_efficiency:.0%} of the memory roofline plus "
            f"{self.sample_s_per_logit * 1e12:.0f} ps per sequence and vocabulary entry a step, training at "
            f"{self.train_mfu:.0%} of the card's bf16 peak plus {self.layer_pass_s * 1e3:.2f} ms per layer, "
            f"pass and micro-batch, weight sync {self.weight_sync_s:.2f} s, {self.start_s:.0f} s start-up"
        )


FITS_FILE = Path(__file__).resolve().parent / "speed_fits.yaml"
FITS_SCHEMA = "verl-recipes/speed-fits/1"


def load_priors(path: Path = FITS_FILE) -> SpeedPriors:
    """The priors every prediction of a step uses: `SpeedPriors` with the data file's fitted
    values (`priors:`) in place; the roofline's own priors where the file is absent."""
    if not path.is_file():
        return SpeedPriors()
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("schema") != FITS_SCHEMA:
        raise RecipeError(f"{path}: not a {FITS_SCHEMA} file")
    known = {f.name for f in fields(SpeedPriors)}
    return replace(SpeedPriors(), **{k: float(v) for k, v in (doc.get("priors") or {}).items() if k in known})


#: the priors of every prediction that names none
FITTED = load_priors()


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


def concurrency(s: Setup, gpu: GPU, seq_tokens: int | None = None) -> int:
    """Sequences vLLM decodes at once: its `max_num_seqs`, the batch, and the sequences of
    `seq_tokens` (full length unless given) its KV cache holds, whichever is least (beyond that
    vLLM preempts; it allocates a sequence's KV blocks as its tokens come, so sequences shorter
    than the bound share the cache among more)."""
    seqs = s.train_batch_size * s.rollout.n
    whole = max(1, plan_gpu(s, gpu).kv_tokens // max(1, seq_tokens or s.seq_len))
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
    prompt = s.prompt_len if prompt_tokens is None else prompt_tokens
    response = s.response_len if response_tokens is None else response_tokens
    given = prompt_tokens is not None or response_tokens is not None
    return decode_floor(
        vllm_weights(s),
        s.arch.kv_bytes_per_token(r.tp, r.dtype_bytes),
        gpu.bandwidth,
        -(-s.train_batch_size * r.n // replicas),
        concurrency(s, gpu, prompt + response if given else None),
        prompt,
        response,
    )


def _forward_flops_per_token(s: Setup, context: float) -> float:
    a = s.arch
    return 2.0 * a.params() + 4.0 * a.layers * a.hidden * context


@dataclass(frozen=True)
class Pass:
    """One training phase's work on one GPU: seconds of FLOPs at the card's full bf16 peak, and
    layer passes (layers x passes x micro-batches) each paying `layer_pass_s`."""

    peak_s: float
    layer_passes: float


@dataclass(frozen=True)
class Terms:
    """A step's work, before the priors turn it into seconds (`seconds`)."""

    decode: Decode
    prefill_peak_s: float  # the prompts' prefill at the card's full bf16 peak, one replica
    logit_steps: float  # decode steps x running sequences x vocabulary, one replica
    train: dict[str, Pass]  # old_log_prob, ref, values, update_critic, update_actor
    tokens: int


def _micro_batches(s: Setup, role: Role, seq: float, train: bool) -> int:
    """Micro-batches of one pass of `role` on one GPU: its sequences of the step over its data
    parallel ranks, `micro` sequences at a time, or verl's dynamic batches of at most
    `max_tokens` tokens."""
    dp = max(1, s.world // max(1, role.tp * role.pp * role.cp * role.ulysses_sp))
    per = -(-s.train_batch_size * s.rollout.n // dp)
    if role.dynamic_bsz:
        cap = role.max_tokens_train if train else role.max_tokens_infer
        return max(1, -(-round(per * seq) // max(1, cap)))
    return max(1, -(-per // max(1, role.micro_train if train else role.micro_infer)))


def terms(
    s: Setup,
    gpu: GPU,
    prompt_tokens: int | None = None,
    response_tokens: int | None = None,
    recompute_log_probs: bool = True,
) -> Terms:
    """The work of one step (module docstring); sequences at full length unless the prompt and
    response tokens are given. Without `recompute_log_probs` (verl's
    `algorithm.rollout_correction.bypass_mode`: the rollout's own log-probabilities stand in for
    the actor's) there is no old_log_prob pass."""
    if not gpu.bf16_flops:
        raise RecipeError(f"--gpu {gpu.id}: the catalogue gives no bf16 rate for it (predict/gpus.yaml)")
    d = decode_roofline(s, gpu, prompt_tokens, response_tokens)
    seq = d.prompt_tokens + d.response_tokens
    tokens = s.train_batch_size * s.rollout.n * seq
    fwd = _forward_flops_per_token(s, seq / 2) * tokens / (gpu.bf16_flops * s.world)
    prefill = 2.0 * s.arch.params() * d.prompt_tokens * d.sequences / gpu.bf16_flops
    logit_steps = float(d.sequences * d.response_tokens * s.arch.vocab)

    def one(role: Role, passes: float, train: bool) -> Pass:
        return Pass(passes * fwd, passes * s.arch.layers * _micro_batches(s, role, seq, train))

    def update(role: Role) -> Pass:
        return one(role, 1.0 + (1.0 if role.lora_rank > 0 else 2.0) + (1.0 if role.grad_ckpt else 0.0), True)

    train = {"old_log_prob": one(s.actor, 1.0, False)} if recompute_log_probs else {}
    if s.ref != "none":
        train["ref"] = one(s.ref_role or s.actor, 1.0, False)
    if s.critic is not None:
        train["values"] = one(s.critic, 1.0, False)
        train["update_critic"] = update(s.critic)
    train["update_actor"] = update(s.actor)
    return Terms(d, prefill, logit_steps, train, tokens)


def seconds(t: Terms, pr: SpeedPriors) -> dict[str, float]:
    """A step's seconds per phase from its work and the priors, PREDICTED."""
    phases = {
        "gen": t.decode.rollout_s / pr.decode_efficiency
        + t.prefill_peak_s / pr.train_mfu
        + t.logit_steps * pr.sample_s_per_logit
    }
    for name, p in t.train.items():
        phases[name] = p.peak_s / pr.train_mfu + p.layer_passes * pr.layer_pass_s
    if pr.weight_sync_s:
        phases["update_weights"] = pr.weight_sync_s
    return phases


def estimate(
    s: Setup,
    gpu: GPU,
    prompt_tokens: int | None = None,
    response_tokens: int | None = None,
    priors: SpeedPriors | None = None,
) -> StepEstimate:
    """A step's seconds per phase on `gpu`, PREDICTED (module docstring); sequences at full
    length unless the prompt and response tokens are given; the fitted priors (`FITTED`) unless
    others are given."""
    pr = priors or FITTED
    t = terms(s, gpu, prompt_tokens, response_tokens)
    return StepEstimate(gpu.id, t.decode, {k: round(v, 2) for k, v in seconds(t, pr).items()}, t.tokens, pr)
