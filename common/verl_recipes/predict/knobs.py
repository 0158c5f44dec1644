"""What to change when a plan does not fit: try each memory knob, report the one that helps most.

The knobs: param_offload and optimizer_offload (actor, critic), FSDP2's CPU `offload_policy`,
bf16 `model_dtype`, gradient checkpointing (Megatron: full recompute), halved micro-batches, the
vLLM budget set to the least that holds one max_model_len sequence (lower or higher), vLLM tensor
parallel x2, a smaller weight-sync bucket, `free_cache_engine`, LoRA (actor, critic) and twice
the GPUs. Each knob is a change to the `Setup` plus the `--set` lines that make the same change in the verl
configuration. The planner re-predicts every phase with the knob applied and scores it by the
bytes still missing on that GPU (`GPUPlan.shortfall`), then by the highest phase peak. Knobs
that do not apply (already on, already 1, no critic) are skipped. `path_to_fit` applies the best
knob repeatedly, so a config that needs two changes gets both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from verl_recipes import RecipeError
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.inputs import Role, Setup, check_layout
from verl_recipes.predict.phases import Constants, GPUPlan, min_utilization, plan_gpu

LORA_RANK = 64  # the rank the LoRA knob proposes (the seed scenarios' rank)
# The smaller weight-sync bucket the knob proposes; never below the largest bf16 tensor, which
# verl's BucketedWeightSender cannot split.
SYNC_BUCKET_MB = 512


@dataclass(frozen=True)
class Knob:
    name: str
    sets: tuple[str, ...]
    setup: Setup
    # the knob changes what is trained, not only where and how: LoRA in place of every weight,
    # bf16 master weights in place of fp32; a margin is bought with the others first
    changes_training: bool = False


@dataclass(frozen=True)
class Suggestion:
    knob: Knob
    plan: GPUPlan
    saves: int  # bytes the knob removes from the binding constraint


def _engine_key(s: Setup, role: Role) -> str:
    base = "actor_rollout_ref.actor" if role.name == "actor" else "critic"
    if role.backend == "megatron":
        return f"{base}.megatron"
    return f"{base}.fsdp_config" if role.name == "actor" else "critic.fsdp"


def _roles(s: Setup) -> list[tuple[str, Role]]:
    out = [("actor", s.actor)]
    if s.critic is not None:
        out.append(("critic", s.critic))
    return out


def _with(s: Setup, which: str, role: Role) -> Setup:
    return replace(s, actor=role) if which == "actor" else replace(s, critic=role)


#: the verl config's rollout section, where the vLLM knobs live
_ROLLOUT = "actor_rollout_ref.rollout"


def _offload_knobs(s: Setup) -> list[Knob]:
    """Per trained role: its parameters, its optimizer, FSDP2's CPU offload policy, bf16 weights."""
    knobs: list[Knob] = []
    for which, role in _roles(s):
        key = _engine_key(s, role)
        fsdp = role.backend == "fsdp"
        options: list[tuple[bool, str, str, Role]] = [
            (not role.param_offload, "param_offload", "param_offload=true", replace(role, param_offload=True)),
            (
                not role.optimizer_offload,
                "optimizer_offload",
                "optimizer_offload=true",
                replace(role, optimizer_offload=True),
            ),
            (
                fsdp and role.fsdp2 and not role.offload_policy,
                "FSDP2 CPU offload_policy",
                "offload_policy=true",
                replace(role, offload_policy=True),
            ),
            (fsdp and role.param_bytes == 4, "model_dtype bf16", "model_dtype=bf16", replace(role, param_bytes=2)),
        ]
        knobs += [
            Knob(f"{which} {name}", (f"{key}.{setting}",), _with(s, which, changed), name == "model_dtype bf16")
            for applies, name, setting, changed in options
            if applies
        ]
    return knobs


def _checkpointing_knob(s: Setup) -> Knob | None:
    """Gradient checkpointing (Megatron: full recompute), for every trained role at once."""
    ck = s
    sets: list[str] = []
    for which, role in _roles(s):
        if role.grad_ckpt:
            continue
        if role.backend == "megatron":
            base = _engine_key(s, role) + ".override_transformer_config"
            sets += [
                f"{base}.recompute_granularity=full",
                f"{base}.recompute_method=uniform",
                f"{base}.recompute_num_layers=1",
            ]
            ck = _with(ck, which, replace(role, grad_ckpt=True, recompute_full=True))
        else:
            model = "actor_rollout_ref.model" if which == "actor" else "critic.model"
            sets.append(f"{model}.enable_gradient_checkpointing=true")
            ck = _with(ck, which, replace(role, grad_ckpt=True))
    return Knob("gradient checkpointing", tuple(sets), ck) if sets else None


def _actor_micro_batches(s: Setup, mb: Setup, sets: list[str]) -> Setup:
    """The actor's (and reference's) micro-batches halved, or its token budget; `sets` gets the lines."""
    a = "actor_rollout_ref"
    if s.actor.dynamic_bsz:
        # each budget its own key: the log-prob budgets follow ppo_max_token_len_per_gpu only where
        # a config leaves them unset (verl's interpolation), so a halved update budget alone does
        # not halve a log-prob budget the config names
        if s.actor.max_tokens_train // 2 >= s.seq_len:
            new = s.actor.max_tokens_train // 2
            sets.append(f"{a}.actor.ppo_max_token_len_per_gpu={new}")
            mb = replace(mb, actor=replace(mb.actor, max_tokens_train=new))
        if s.actor.max_tokens_infer // 2 >= s.seq_len:
            new = s.actor.max_tokens_infer // 2
            sets += [
                f"{a}.rollout.log_prob_max_token_len_per_gpu={new}",
                f"{a}.ref.log_prob_max_token_len_per_gpu={new}",
            ]
            mb = replace(mb, actor=replace(mb.actor, max_tokens_infer=new))
            if mb.ref_role is not None:
                mb = replace(mb, ref_role=replace(mb.ref_role, max_tokens_infer=new))
        return mb
    if s.actor.micro_train > 1:
        sets.append(f"{a}.actor.ppo_micro_batch_size_per_gpu={s.actor.micro_train // 2}")
        mb = replace(mb, actor=replace(mb.actor, micro_train=s.actor.micro_train // 2))
    if s.actor.micro_infer > 1:
        sets.append(f"{a}.rollout.log_prob_micro_batch_size_per_gpu={s.actor.micro_infer // 2}")
        mb = replace(mb, actor=replace(mb.actor, micro_infer=s.actor.micro_infer // 2))
    if s.ref_role is not None and s.ref_role.micro_infer > 1:
        sets.append(f"{a}.ref.log_prob_micro_batch_size_per_gpu={s.ref_role.micro_infer // 2}")
        mb = replace(mb, ref_role=replace(s.ref_role, micro_infer=s.ref_role.micro_infer // 2))
    return mb


def _micro_batch_knob(s: Setup) -> Knob | None:
    """Smaller micro-batches: every per-GPU micro-batch above 1 halved, or the token budgets."""
    sets: list[str] = []
    mb = _actor_micro_batches(s, s, sets)
    if s.critic is not None and not s.critic.dynamic_bsz:
        cr = s.critic
        if cr.micro_train > 1 or cr.micro_infer > 1:
            mt, mi = max(1, cr.micro_train // 2), max(1, cr.micro_infer // 2)
            sets += [
                f"critic.ppo_micro_batch_size_per_gpu={mt}",
                f"critic.forward_micro_batch_size_per_gpu={mi}",
            ]
            mb = replace(mb, critic=replace(cr, micro_train=mt, micro_infer=mi))
    return Knob("smaller micro-batches", tuple(sets), mb) if sets else None


def _vllm_knobs(s: Setup, gpu: GPU, c: Constants) -> list[Knob]:
    """vLLM's budget, its tensor parallelism, the weight-sync bucket and `free_cache_engine`."""
    knobs: list[Knob] = []
    # vLLM budget: the least that still holds one max_model_len sequence (2 decimals, rounded up).
    # Lower when the budget squeezes the trainer, higher when vLLM cannot hold a sequence.
    u = min_utilization(s, gpu, c)
    u = int(u * 100 + 0.999) / 100
    if 0 < u <= 1 and abs(u - s.rollout.gpu_memory_utilization) >= 0.01:
        knobs.append(
            Knob(
                f"gpu_memory_utilization {u:g}",
                (f"{_ROLLOUT}.gpu_memory_utilization={u:g}",),
                replace(s, rollout=replace(s.rollout, gpu_memory_utilization=u)),
            )
        )
    # vLLM tensor parallel x2: half its weights and KV heads per GPU (needs the GPUs and the heads)
    tp2 = s.rollout.tp * 2
    if s.world % (tp2 * s.rollout.pp * s.rollout.dp) == 0 and s.arch.heads % tp2 == 0:
        cand = replace(s, rollout=replace(s.rollout, tp=tp2))
        try:
            check_layout(cand)
            knobs.append(Knob(f"vLLM TP{tp2}", (f"{_ROLLOUT}.tensor_model_parallel_size={tp2}",), cand))
        except RecipeError:
            pass
    # a smaller weight-sync bucket (verl's default is 2048 MB)
    bucket_mb = max(SYNC_BUCKET_MB, -(-2 * s.arch.largest_tensor_params() // 1024**2))
    if s.rollout.bucket_bytes > bucket_mb * 1024**2:
        knobs.append(
            Knob(
                f"sync bucket {bucket_mb} MB",
                (f"{_ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes={bucket_mb}",),
                replace(s, rollout=replace(s.rollout, bucket_bytes=bucket_mb * 1024**2)),
            )
        )
    if not s.rollout.free_cache_engine:
        knobs.append(
            Knob(
                "free_cache_engine",
                (f"{_ROLLOUT}.free_cache_engine=true",),
                replace(s, rollout=replace(s.rollout, free_cache_engine=True)),
            )
        )
    return knobs


def _lora_knobs(s: Setup) -> list[Knob]:
    """LoRA on the actor (its reference becomes the actor with the adapter off) and the critic."""
    knobs: list[Knob] = []
    if s.actor.lora_rank == 0 and s.actor.backend == "fsdp":
        ref = "in_actor" if s.ref != "none" else "none"
        knobs.append(
            Knob(
                f"actor LoRA rank {LORA_RANK}",
                (f"actor_rollout_ref.model.lora_rank={LORA_RANK}",),
                replace(s, actor=replace(s.actor, lora_rank=LORA_RANK), ref=ref),
                changes_training=True,
            )
        )
    if s.critic is not None and s.critic.lora_rank == 0 and s.critic.backend == "fsdp":
        knobs.append(
            Knob(
                f"critic LoRA rank {LORA_RANK}",
                (f"critic.model.lora_rank={LORA_RANK}",),
                replace(s, critic=replace(s.critic, lora_rank=LORA_RANK)),
                changes_training=True,
            )
        )
    return knobs


def _more_gpus_knob(s: Setup) -> Knob | None:
    """Twice the data-parallel world: a node filled to 8 GPUs first, then more nodes."""
    if s.gpus_per_node < 8:
        more = replace(s, gpus_per_node=min(8, s.gpus_per_node * 2))
        sets = [f"trainer.n_gpus_per_node={more.gpus_per_node}"]
    else:
        more = replace(s, nnodes=s.nnodes * 2)
        sets = [f"trainer.nnodes={more.nnodes}"]
    try:
        check_layout(more)
    except RecipeError:
        return None
    return Knob(f"{more.world} GPUs", tuple(sets), more)


def candidate_knobs(s: Setup, gpu: GPU, c: Constants) -> list[Knob]:
    """Every knob that applies to `s`, in the order a tie between two of them is broken."""
    one = [_checkpointing_knob(s), _micro_batch_knob(s)]
    knobs = [*_offload_knobs(s), *(k for k in one if k), *_vllm_knobs(s, gpu, c), *_lora_knobs(s)]
    more = _more_gpus_knob(s)
    return knobs + ([more] if more else [])


def _score(p: GPUPlan) -> tuple[int, int]:
    return (p.shortfall, p.peak.total)


def suggest(s: Setup, gpu: GPU, c: Constants | None = None) -> list[Suggestion]:
    """Every applicable knob with its re-predicted plan, best first."""
    c = c or Constants()
    base = plan_gpu(s, gpu, c)
    out = []
    for k in candidate_knobs(s, gpu, c):
        p = plan_gpu(k.setup, gpu, c)
        out.append(Suggestion(k, p, base.shortfall - p.shortfall if base.shortfall else base.peak.total - p.peak.total))
    out.sort(key=lambda sg: _score(sg.plan))
    return out


def helpful(s: Setup, gpu: GPU, c: Constants | None = None) -> list[Suggestion]:
    """The knobs that lower what is missing on this GPU, best first."""
    base = plan_gpu(s, gpu, c or Constants())
    return [sg for sg in suggest(s, gpu, c) if _score(sg.plan) < _score(base)]


def path_to_fit(
    s: Setup, gpu: GPU, c: Constants | None = None, max_steps: int = 8, more_gpus: bool = True
) -> list[Suggestion] | None:
    """Greedily apply the best knob until the plan fits; None if it never does.

    With `more_gpus=False` the GPU count stays as configured. A vLLM budget chosen on the way is
    re-derived at the end for the final layout (a later knob may have made a smaller one enough).
    """
    c = c or Constants()
    steps: list[Suggestion] = []
    cur = s
    plan = plan_gpu(cur, gpu, c)
    for _ in range(max_steps):
        if plan.fits:
            break
        cands = [sg for sg in suggest(cur, gpu, c) if _score(sg.plan) < _score(plan)]
        if not more_gpus:
            cands = [sg for sg in cands if sg.knob.setup.world == s.world]
        if not cands:
            return None
        best = cands[0]
        steps.append(best)
        cur, plan = best.knob.setup, best.plan
    if not plan.fits:
        return None
    for i, st in enumerate(steps):
        if not st.knob.name.startswith("gpu_memory_utilization"):
            continue
        u = int(min_utilization(cur, gpu, c) * 100 + 0.999) / 100
        trial = replace(cur, rollout=replace(cur.rollout, gpu_memory_utilization=u))
        final = plan_gpu(trial, gpu, c)
        if final.fits and u != cur.rollout.gpu_memory_utilization:
            sets = (f"actor_rollout_ref.rollout.gpu_memory_utilization={u:g}",)
            steps[i] = Suggestion(Knob(f"gpu_memory_utilization {u:g}", sets, trial), final, st.saves)
            steps[-1] = replace(steps[-1], plan=final)  # the last step carries the final plan
        break
    return steps
