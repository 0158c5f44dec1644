"""The largest batch settings a card holds: training token budgets and vLLM's engine settings.

At a large batch the step's speed comes from how much each phase does at once: the training
phases' micro-batch token budgets (`use_dynamic_bsz`) and vLLM's share of the card, its
concurrency and its prefill chunk. Each is chosen as the largest the memory model lets fit:

- tolerance: every term of a phase outside vLLM's own budget is taken 10% larger (the tolerance
  `plan --errors` holds the planner to; its training phases err by up to 9% on committed runs),
  and the phase must still fit the visible memory. vLLM's budget is exact: vLLM sizes its KV
  cache to `gpu_memory_utilization x` the card itself;
- `actor.ppo_max_token_len_per_gpu`: the largest multiple of 1,024 tokens whose update_actor
  fits with a micro-batch one sequence over the budget (verl balances whole sequences over
  ceil(tokens / budget) micro-batches), no larger than the mini-batch's tokens, and whose
  logits (tokens x vocabulary) stay within 2^31 elements: CUDA kernels of the softmax family
  have indexed in 32 bits and returned wrong values past that (pytorch/pytorch#84144,
  pytorch/pytorch#191565), and a token budget past it buys nothing a step at these sizes (the
  matrix products are compute-bound long before);
- `rollout.log_prob_max_token_len_per_gpu` (and the reference's): the same for old_log_prob and
  the reference's forward;
- `rollout.gpu_memory_utilization`: the largest hundredth whose generation phase fits and which
  vLLM can start beside the loaded trainer;
- `rollout.max_num_seqs`: the sequences of full length (prompt + response bound) its KV cache
  holds whole, no more than the batch: a sequence beyond them is preempted and recomputed;
- `rollout.max_num_batched_tokens`: every running sequence's prompt bound in one prefill chunk,
  a power of two, at least verl's 8,192.

`verl-recipes plan RECIPE --budgets --gpu G` prints them as `--set` lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from verl_recipes import RecipeError
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.inputs import Setup
from verl_recipes.predict.phases import Constants, GPUPlan, PhasePlan, plan_gpu

#: the relative error `plan --errors` tolerates: trainer terms are taken this much larger
TOLERANCE = 0.10
#: token budgets move in steps of this many tokens
STEP = 1024
#: verl's own max_num_batched_tokens
VERL_BATCHED_TOKENS = 8192
#: the most elements one micro-batch's logits may hold (module docstring)
MAX_LOGITS = 2**31 - 1

_A, _R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
_TRAIN = ("old_log_prob", "ref", "update_actor")
_ALL = ("outside", "update_weights", "gen", *_TRAIN)


@dataclass(frozen=True)
class Budgets:
    """The largest settings that fit one card, and the plan with all of them set."""

    gpu: GPU
    train_tokens: int
    infer_tokens: int
    utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    plan: GPUPlan

    def sets(self) -> list[str]:
        """The settings as `--set` lines of `train` and `plan`."""
        return [
            f"{_A}.ppo_max_token_len_per_gpu={self.train_tokens}",
            f"{_R}.log_prob_max_token_len_per_gpu={self.infer_tokens}",
            f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={self.infer_tokens}",
            f"{_R}.gpu_memory_utilization={self.utilization:.2f}",
            f"{_R}.max_num_seqs={self.max_num_seqs}",
            f"{_R}.max_num_batched_tokens={self.max_num_batched_tokens}",
        ]

    def applied(self, s: Setup) -> Setup:
        return with_budgets(
            s, self.train_tokens, self.infer_tokens, self.utilization, self.max_num_seqs, self.max_num_batched_tokens
        )


def with_budgets(s: Setup, train: int, infer: int, util: float, seqs: int, batched: int) -> Setup:
    actor = replace(s.actor, max_tokens_train=train, max_tokens_infer=infer)
    ref_role = replace(s.ref_role, max_tokens_infer=infer) if s.ref_role is not None else None
    rollout = replace(s.rollout, gpu_memory_utilization=util, max_num_seqs=seqs, max_num_batched_tokens=batched)
    return replace(s, actor=actor, ref_role=ref_role, rollout=rollout)


def held(p: PhasePlan) -> float:
    """A phase's bytes with the trainer's and the device's terms taken TOLERANCE larger."""
    return sum(t.bytes if t.process == "vllm" else t.bytes * (1 + TOLERANCE) for t in p.terms)


def _phases_fit(plan: GPUPlan, names: tuple[str, ...]) -> bool:
    return all(held(p) <= plan.gpu.visible_bytes for p in plan.phases if p.phase in names)


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest multiple of STEP in [lo, hi] (hi itself where it is not one) that is ok, or None;
    `ok` is taken monotone (a larger budget never needs less memory)."""
    cands: list[int] = sorted({*range(lo, hi + 1, STEP), hi})
    if not cands or not ok(cands[0]):
        return None
    a, b = 0, len(cands) - 1
    while a < b:
        m = (a + b + 1) // 2
        if ok(cands[m]):
            a = m
        else:
            b = m - 1
    return cands[a]


def largest(s: Setup, gpu: GPU, c: Constants | None = None) -> Budgets:
    """The largest token budgets and vLLM settings `s` holds on `gpu` (module docstring)."""
    c = c or Constants()
    if not s.actor.dynamic_bsz:
        raise RecipeError(
            "--budgets sizes dynamic micro-batches: set actor_rollout_ref.actor.use_dynamic_bsz=true "
            "(the token budgets bound a micro-batch only then)"
        )
    if s.world != 1 or s.rollout.tp != 1:
        raise RecipeError("--budgets plans one GPU running the trainer and one vLLM replica; give --gpus 1")
    seq = s.seq_len
    seqs = s.train_batch_size * s.rollout.n
    lo = -(-seq // STEP) * STEP  # a budget holds one whole sequence at least (verl refuses less)
    r = s.rollout
    cap = (MAX_LOGITS // s.arch.vocab - seq) // STEP * STEP  # logits within 2^31 elements

    def fits(train: int, infer: int, util: float, n: int, batched: int, names: tuple[str, ...]) -> bool:
        p = plan_gpu(with_budgets(s, train, infer, util, n, batched), gpu, c)
        return _phases_fit(p, names) and p.vllm_start_free >= p.vllm_budget

    # verl balances a batch over ceil(tokens / budget) micro-batches by whole sequences, so one may
    # pass the budget by up to a sequence: each budget is judged one sequence larger. The log-prob
    # budget first, then the update's beside it: the allocator's cache of one phase carries into
    # the next (phases._carry_cache_floor), so every training phase is judged with both
    infer = _largest(lo, min(seqs * seq, cap), lambda t: fits(lo + seq, t + seq, 0.05, 1, 1, _TRAIN))
    train = None
    if infer is not None:
        train = _largest(
            lo, min(s.ppo_mini_batch_size * r.n * seq, cap), lambda t: fits(t + seq, infer + seq, 0.05, 1, 1, _TRAIN)
        )
    if train is None or infer is None:
        raise RecipeError(f"{gpu.id}: not even one {seq}-token sequence a micro-batch fits the training phases")
    # vLLM: concurrency and prefill chunk move its activations, which move the KV cache it holds;
    # settle them at each utilisation, from the largest down
    for hundredths in range(95, 4, -1):
        util = hundredths / 100
        n, batched = seqs, VERL_BATCHED_TOKENS
        for _ in range(8):
            p = plan_gpu(with_budgets(s, train, infer, util, n, batched), gpu, c)
            whole = min(seqs, p.kv_tokens // seq)
            want = max(VERL_BATCHED_TOKENS, 1 << max(0, (max(1, whole) * s.prompt_len - 1).bit_length()))
            if (whole, want) == (n, batched):
                break
            n, batched = max(1, whole), want
        if p.kv_tokens >= seq and fits(train + seq, infer + seq, util, n, batched, _ALL):
            return Budgets(
                gpu, train, infer, util, n, batched, plan_gpu(with_budgets(s, train, infer, util, n, batched), gpu, c)
            )
    raise RecipeError(f"{gpu.id}: no gpu_memory_utilization lets vLLM hold one {seq}-token sequence beside the trainer")
