"""Per-phase, per-GPU peak memory of one verl 0.9.1 PPO/GRPO step.

In verl 0.9.1's hybrid engine every GPU holds two processes: the trainer worker (actor, critic
and reference are colocated in one Ray actor, `create_colocated_worker_cls`) and a vLLM worker.
The device total is the sum of both. A step runs these phases, named as verl's `marked_timer`
names them (verl/trainer/ppo/v1), plus `outside`:

  outside       before step 1, the report's name for all time outside a step: trainer weights on
                the GPU (no optimizer state yet: torch's AdamW creates its moments at the first
                step) while vLLM starts and takes its whole budget
  update_weights  weight sync: vLLM's weights woken, the trainer's weights gathered per tensor
                into a CUDA-IPC bucket (`update_weights_bucket_megabytes`); FSDP1 and LoRA reload the
                whole actor onto the GPU for it, FSDP2 without LoRA streams shard by shard
  gen           vLLM generates with its KV cache; the trainer keeps what is not offloaded
  old_log_prob  actor forward over the batch (`rollout.log_prob_micro_batch_size_per_gpu`)
  ref           reference forward (LoRA: the actor with its adapter off; FSDP: a CPU-offloaded copy)
  values        critic forward
  update_critic critic forward + backward + AdamW step
  update_actor  actor forward + backward + AdamW step

Terms and where each comes from:

  * weights: FSDP keeps parameters in `fsdp_config.model_dtype` (fp32 by default, 4 B/param),
    sharded over all ranks; Megatron keeps bf16 (2 B) split by TP and PP (the heaviest stage).
  * gradients: FSDP, trainable params in the param dtype, sharded, only during the update
    (`zero_grad` on leaving train mode frees them). FSDP2 allocates them on the role's own
    reduce-scatter stream (torch's `foreach_reduce`: the sharded gradients are views of the
    reduce-scatter output, a copy of its input at a world of 1), so they come on top of the
    compute stream's cache and stay cached on that stream until `empty_cache`
    (`_carry_cache_floor`). Megatron keeps an fp32 main-grad buffer
    (4 B per trainable param of the stage / TP) allocated throughout, unless `param_offload`
    frees it outside the update. Megatron recomputes activations only when
    `override_transformer_config.recompute_granularity` is `full`; `model.enable_gradient_
    checkpointing` is an FSDP setting that verl's Megatron engine does not read.
  * optimizer: torch AdamW keeps exp_avg and exp_avg_sq in the param dtype (2 x param bytes),
    sharded by FSDP; Megatron's distributed optimizer keeps fp32 master + two moments (12 B),
    further divided by DP. `optimizer_offload` moves them to the CPU between updates, but verl
    loads them back for the update (`BaseEngineCtx._context_switch`), so offload helps every
    phase except the update itself. `param_offload` likewise only helps outside the role's own
    phases. The FSDP step itself (torch's foreach AdamW) holds one more copy of the trainable
    shard, sqrt(exp_avg_sq) of every parameter at once (`_adamw_temp`), unless FSDP2's offload
    policy keeps the step on the CPU.
  * FSDP working set: the bf16 unsharded copy of the units being computed (largest of embedding
    and output layer, plus two decoder layers: current and prefetched), and during backward the
    unsharded fp32 gradient of the largest trainable unit before its reduce-scatter.
  * activations: `Arch.activation_bytes_per_token_layer` (Korthikanti et al. 2022, adapted; see
    model.py) x tokens per micro-batch x layers, or with checkpointing layer inputs (2h) for all
    layers plus one recomputed layer. Megatron divides by TP with sequence parallelism, and the
    first pipeline stage keeps min(PP, micro-batches) micro-batches in flight (1F1B).
  * logits: tokens x vocab x `logits_*_bytes` (the bf16 lm_head output and the fp32 copies
    autocast makes for softmax, logsumexp and log_softmax; the update adds its fp32 gradient;
    a soft-capped output layer, Gemma 2's, one more bf16 copy: `Arch.logits_softcap_bytes`);
    vocab-split by Megatron TP. Tokens are a micro-batch's rows at the configuration's full
    length, or at a measured run's longest logged sequence (`Setup.train_seq_len`).
  * vLLM (vllm/v1/worker/gpu_worker.py, `Worker.init_device` and `determine_available_memory`):
    at start it requires free memory >= `gpu_memory_utilization x total`, and its KV cache is that
    budget minus its own weights, profiled activation peak and non-torch memory. So while it
    generates its footprint is the whole budget, whatever the trainer holds. Sleep mode
    (`free_cache_engine`) frees weights and KV cache outside generation; CUDA graphs (captured
    after KV sizing) and the context stay.
  * FSDP2 `offload_policy` (CPUOffloadPolicy) keeps parameters, gradients and the AdamW step on
    the CPU in every phase; only the working set above reaches the GPU.
  * cache carried between phases: the trainer's allocator keeps what a phase freed reserved
    until verl calls `empty_cache`, which it does at the weight sync but between the training
    phases only where an offload moves weights or optimizer (`_carry_cache_floor`); so each
    training phase holds at least what the previous one reserved, plus the gradients an earlier
    update left on its own reduce-scatter stream.
  * FSDP2's all-gather buffers at a world above 1 (`_all_gather_cache`): the previous unit's
    output, the next one's and its shard, on FSDP2's own CUDA streams, whose cached blocks the
    compute stream cannot reuse; each role that has run a forward since the last `empty_cache`
    adds its own on top of the carried floor. At a world of 1 FSDP2 gathers nothing: 0.
  * per process: a CUDA context, and the trainer's real process group (`_group_terms`: on FSDP
    NCCL's buffers per communicator and its own state, `predict.fsdp_comm`; on Megatron one
    communicator's buffers per group with peers and its groups' measured base); a rank
    rehearsal's fake group holds none (`Setup.fake_group`). Named constants below: priors
    until fitted from measured runs by `verl_recipes.plan.errors`, unless they say what measured them.

Upper bounds: every sequence is taken at max_prompt_length + max_response_length; remove-padding
only lowers real usage. The torch caching allocator's fragmentation is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import pairwise

from verl_recipes import GIB
from verl_recipes.predict import fsdp_comm
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.inputs import Role, Setup
from verl_recipes.predict.megatron_groups import communicators

MIB = 1024**2
PHASES = ("outside", "update_weights", "gen", "old_log_prob", "ref", "values", "update_critic", "update_actor")


@dataclass(frozen=True)
class Constants:
    """Overheads that are not shapes: priors until fitted to the residuals `plan --errors` prints."""

    # CUDA context, cuBLAS/cuDNN workspaces and loaded kernels per process (brief's prior: 0.5 GiB).
    cuda_context_bytes: int = GIB // 2
    # vLLM memory outside its gpu_memory_utilization budget: the CUDA-graph pool captured after
    # the KV cache is sized (0 with enforce_eager). Prior: 0.5 GiB.
    vllm_graph_bytes: int = GIB // 2
    # Buffers of one NCCL communicator: NCCL_BUFFSIZE (4 MiB default, NCCL docs) x 2 directions x
    # 16 channels. Prior.
    nccl_bytes_per_communicator: int = 128 * MIB
    # What a real process group adds to a Megatron trainer beyond its allocator, whatever its
    # peers: megatron-core makes a group of every kind (TP, PP, DP, CP, model-parallel, embedding,
    # ...), each its own NCCL communicator. Measured as the training process's memory beyond verl's
    # max reserved (`compare-ranks`, peaks of steps 2+): 2.43 GiB in each of 70b-3d's plain runs on
    # one GPU (TP1, 1-3 layers: a real group of one), 0.81 in each of its rank rehearsals (TP2 and
    # TP4 under the fake group, which has no communicator). FSDP's real group is
    # `predict.fsdp_comm`'s, per communicator.
    group_base_bytes_megatron: int = 1660 * MIB
    # Bytes per (token x vocab) element of a micro-batch's padded logits. A forward that computes
    # log-probs and entropy (old_log_prob): 14 = the bf16 lm_head output (2) + softmax's fp32
    # output (4) + logsumexp's fp32 copy of its input (4) + its fp32 (x - max) (4). verl 0.9.1 runs
    # `prepare_model_outputs` inside the forward's `torch.autocast(bfloat16)` (FSDP engine
    # `forward_step`), where softmax, logsumexp and log_softmax run in fp32 on an fp32 copy of the
    # bf16 logits, and `entropy_from_logits` holds the softmax while logsumexp runs. Judged at the
    # tokens the runs held (`Setup.logged_seq_len`), old_log_prob reads 12-15 B in every committed
    # run of both vocabularies (Llama 32,000; Qwen2 152,064): 13.3 B in verl-vs-deepspeed's
    # h200x1-ppo-l8 (18.45 GiB over 8 x 1024 tokens, less units and transient), where 6 left it
    # 12.9% short. gpu/probes/logits_autocast.py replays the operations on an H200 (2026-12-05,
    # gpu/hosts/2026-12-05-h200x1-70b-rank/probes): 14.00-14.24 B allocated under autocast, 6.0
    # without, at both vocabularies. The reference's forward computes no entropy (12 B in the
    # probe); it follows old_log_prob, whose cache it inherits, so the larger figure stands for
    # it too. The update: bf16 logits (2) + fp32 log_softmax output kept for backward (4) + the
    # fp32 gradient of the logits (4). The probe's update allocates 12 B and reserves 16 in
    # isolation; in the runs the update's logits share the allocator's blocks with the step's
    # other tensors, and 10 meets them (raising it would widen the FSDP updates' over-count).
    logits_fwd_bytes: int = 14
    logits_train_bytes: int = 10
    # The padding-free path (`use_remove_padding`; verl/workers/engine/fsdp/transformer_impl.py
    # `FSDPEngine.prepare_model_outputs`) with `use_torch_compile` (verl's default) calls the
    # entropy compiled (`compute_entropy_from_logits` = torch.compile(`entropy_from_logits`), set
    # in `FSDPEngine.__init__`), whose fused reductions hold no vocab-wide fp32 tensor; the padded
    # path calls `verl_F.entropy_from_logits` uncompiled, the 14 above. Both take
    # `logprobs_from_logits`' `logprobs_from_logits_v2` here (flash-attn's cross_entropy is not
    # installed), whose bf16 branch runs log_softmax one token's row at a time
    # (verl/utils/torch_functional.py), and `_scale_logits_by_temperature` returns the logits
    # themselves at temperature 1 (the trainer hands it the rollout's scalar). So a no-grad
    # forward holds the bf16 logits (2 B) and no fp32 copy. The runs read 4: the GSM8K
    # quickstart's old_log_prob (h100x1-ppo) 2.64 GiB over its tokens x 151,936, 4.0 B; 7b-lora's
    # packed runs 3.7. The other 2 are not tied to an operation (likely the caching allocator's
    # block of the previous micro-batch's logits, packed micro-batches differing in tokens).
    # The update saves each row's fp32 log_softmax for backward and takes the logits' gradient:
    # `logits_train_bytes` on both paths (the quickstart's update_actor reads within 4% of it).
    logits_fwd_bytes_packed: int = 4
    # Memory vLLM's profile run counts inside its budget beyond weights, the profiled activations
    # and the sampler (its process's CUDA context, cuBLAS workspace, allocator slack). Measured,
    # not a prior: vLLM 0.24 on an H200, Llama-2-7B at 0.63 x 24 GiB, max_num_batched_tokens 4096,
    # reported 1.86 GiB of KV cache where the terms above left 2.18 GiB
    # (recipes/7b-lora/results/failed/h200x1-ppo-24gib-cap24-max-model-len/train.log).
    vllm_nontorch_bytes: int = 330 * MIB
    # Device memory NVML counts as used that belongs to no process (the driver's own reservation).
    # Measured: device used minus the sum of every process's used memory was 0.62-0.68 GiB in every
    # steady phase of the six 7B runs on H200s (driver 580.159.04) in recipes/7b-lora/results/.
    device_reserved_bytes: int = 635 * MIB
    # Where the values come from: () = the priors above.
    fitted_from: tuple[str, ...] = ()


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    process: str  # "trainer" | "vllm" | "device" (memory of no process)


@dataclass
class PhasePlan:
    phase: str
    terms: list[Term]

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    def dominant(self, k: int = 3) -> list[Term]:
        return sorted((t for t in self.terms if t.bytes > 0), key=lambda t: -t.bytes)[:k]

    def by_process(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.terms:
            out[t.process] = out.get(t.process, 0) + t.bytes
        return out


@dataclass
class GPUPlan:
    """The prediction for one GPU kind: every phase, vLLM's budget and what fails."""

    gpu: GPU
    phases: list[PhasePlan]
    vllm_budget: int
    vllm_start_free: int
    kv_bytes: int
    kv_tokens: int
    kv_needed_bytes: int  # one max_model_len sequence: vLLM refuses to start with less
    max_model_len: int
    batch_seqs_per_replica: int
    problems: list[str] = field(default_factory=list)

    @property
    def peak(self) -> PhasePlan:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        return not self.problems

    def phase(self, name: str) -> PhasePlan | None:
        return next((p for p in self.phases if p.phase == name), None)

    @property
    def shortfall(self) -> int:
        """Bytes missing to fit (0 when it fits): the largest overrun of any constraint."""
        over = [p.total - self.gpu.visible_bytes for p in self.phases]
        over.append(self.vllm_budget - self.vllm_start_free)
        over.append(self.kv_needed_bytes - self.kv_bytes)
        return max(0, *over)


# ---- parameter counts per role ---------------------------------------------------------------
@dataclass(frozen=True)
class _Params:
    total: int  # stored parameters (base + adapters)
    trainable: int
    layer: int  # one decoder layer incl. its adapters
    edge: int  # the largest non-layer unit (embedding / output layer)
    trainable_unit: int  # the largest trainable FSDP unit (for the unsharded gradient)


def _params(s: Setup, role: Role, critic: bool = False) -> _Params:
    a = s.arch
    lora = a.lora_params(role.lora_rank, role.lora_targets)
    lora_layer = a.lora_layer_params(role.lora_rank, role.lora_targets)
    base = a.critic_params() if critic else a.params()
    head = a.hidden + 1 if critic else a.lm_head_params
    edge = max(a.embed_params, head)
    if lora:
        trainable = lora + (a.hidden + 1 if critic else 0)
        unit = lora_layer
    else:
        trainable = base
        unit = max(a.layer_params(), edge)
    return _Params(base + lora, trainable, a.layer_params() + lora_layer, edge, unit)


def _mcore_stage(s: Setup, role: Role, critic: bool) -> tuple[int, int]:
    """(stored, trainable) parameters of the heaviest pipeline stage, before TP."""
    a = s.arch
    p = _params(s, role, critic)
    per_layer = p.layer
    layers = a.layers // role.pp
    head = a.hidden + 1 if critic else a.vocab * a.hidden  # a tied output layer is copied to the last stage
    if role.pp == 1:
        stored = p.total
    else:
        first = layers * per_layer + a.embed_params
        last = layers * per_layer + head + a.hidden
        stored = max(first, last)
    frac = stored / max(p.total, 1)
    return stored, int(p.trainable * frac) if role.lora_rank else stored


# ---- state that can stay on the GPU between phases -------------------------------------------
def _state(s: Setup, role: Role, critic: bool, weights: bool, grads: bool, optim: float) -> list[Term]:
    """Weights / gradients / optimizer terms of one role; `optim` is the share of AdamW state held."""
    who = role.name
    if role.backend == "megatron":
        stored, trainable = _mcore_stage(s, role, critic)
        dp = s.world // (role.tp * role.pp * role.cp)
        shard = role.tp
        w = stored * role.param_bytes // shard
        g = trainable * 4 // shard
        o = int(trainable * 12 // shard // (dp if role.distributed_optimizer else 1) * optim)
        return [
            Term(f"{who} weights (bf16, 1/{shard} TP of the heaviest PP stage)", w if weights else 0, "trainer"),
            Term(f"{who} fp32 main-grad buffer", g if grads else 0, "trainer"),
            Term(f"{who} optimizer (fp32 master + Adam moments)", o, "trainer"),
        ]
    p = _params(s, role, critic)
    n = s.world
    pb = role.param_bytes
    dt = "fp32" if pb == 4 else "bf16"
    if role.fsdp2 and role.offload_policy:  # all of it stays on the CPU (CPUOffloadPolicy)
        weights, grads, optim = False, False, 0.0
    grad_name = f"{who} gradients ({dt}, on {REDUCE_SCATTER_STREAM})" if role.fsdp2 else f"{who} gradients ({dt})"
    return [
        Term(f"{who} weights ({dt}, 1/{n} FSDP shard)", p.total * pb // n if weights else 0, "trainer"),
        Term(grad_name, p.trainable * pb // n if grads else 0, "trainer"),
        Term(f"{who} optimizer (Adam moments, {dt})", int(p.trainable * 2 * pb // n * optim), "trainer"),
    ]


def _tokens(s: Setup, role: Role, train: bool) -> int:
    """Tokens in one micro-batch on one GPU (upper bound: every sequence at `Setup.train_seq_len`,
    the configuration's full length, or a measured run's longest logged sequence).

    Dynamic micro-batches: verl cuts the GPU's share of the (mini-)batch into as many micro-batches
    as its tokens need at the budget (`rearrange_micro_batches`: ceil(tokens / budget), balanced by
    tokens) and pads each to its longest sequence, so one holds its share of the rows at the
    longest length: 8 rows of 1075 tokens at a budget of 8192 are 2 micro-batches of 4 x 1075.
    """
    if role.dynamic_bsz:
        budget = max(role.max_tokens_train if train else role.max_tokens_infer, 1)
        rows = max(1, (s.ppo_mini_batch_size if train else s.train_batch_size) * s.rollout.n // max(s.dp(role), 1))
        n_micro = -(-rows * s.train_seq_len // budget)
        t = -(-rows // n_micro) * s.train_seq_len
        if s.remove_padding:
            # padding-free: a micro-batch packs real tokens up to the budget, whatever the rows'
            # lengths (sequences shorter than the bound put more of them in one micro-batch)
            t = min(budget, rows * s.train_seq_len)
    else:
        t = (role.micro_train if train else role.micro_infer) * s.train_seq_len
    div = role.cp if role.backend == "megatron" else role.ulysses_sp
    return max(1, t // div)


def _adamw_temp(s: Setup, role: Role, p: _Params) -> int:
    """The one full-size temporary of torch's foreach AdamW step, on the GPU.

    verl builds `torch.optim.AdamW` with neither `foreach` nor `fused` (verl/workers/config/
    optimizer.py `build_optimizer`), so torch picks the foreach path for CUDA tensors (DTensor is a
    foreach type, torch/distributed/tensor/__init__.py). `_multi_tensor_adam` (torch/optim/adam.py)
    updates the moments in place but takes `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`
    for every parameter of the group at once: a copy of the role's trainable shard in the param
    dtype, live next to weights, gradients and both moments. Under FSDP2's offload policy the
    parameters, and so the step, are on the CPU (foreach is off there): nothing on the GPU.

    Measured (verl's own `perf/max_memory_allocated_gb`, step 1, Qwen2-7B widths, fp32 params):
    the allocated peak of each update is weights + gradients + both moments + this copy, to
    0.15 GiB: h200x1-ppo-rank0of2 critic 80.18 (27.36 + 13.17 + 26.34 + 13.17 = 80.04), actor
    110.58 (110.45); h200x1-ppo-l8 critic 56.01 (55.90), actor 82.08 (81.97)
    (recipes/verl-vs-deepspeed/results/). Without it each would be one shard short.
    """
    if role.fsdp2 and role.offload_policy:
        return 0
    return p.trainable * role.param_bytes // s.world


def _fsdp_work(s: Setup, role: Role, critic: bool, train: bool, c: Constants) -> list[Term]:
    a = s.arch
    p = _params(s, role, critic)
    t = _tokens(s, role, train)
    who = role.name
    terms = [Term(f"{who} FSDP unsharded bf16 units", 2 * (p.edge + 2 * p.layer), "trainer")]
    if train:
        per_layer = a.activation_bytes_per_token_layer()
        eager = a.eager_attention_bytes(s.train_seq_len) if s.eager_attention else 0
        if role.grad_ckpt:
            act = t * (a.layers * a.checkpoint_bytes_per_token_layer() + per_layer + eager)
            how = "checkpointed"
        else:
            act = t * a.layers * (per_layer + eager)
            how = "no checkpointing"
        terms.append(Term(f"{who} activations ({t} tokens, {how})", act, "trainer"))
        terms.append(Term(f"{who} unsharded fp32 gradient of one unit", 4 * p.trainable_unit, "trainer"))
        terms.append(
            Term(f"{who} AdamW step temporary (sqrt of exp_avg_sq, all at once)", _adamw_temp(s, role, p), "trainer")
        )
    else:
        terms.append(
            Term(f"{who} forward transient ({t} tokens)", t * a.forward_transient_bytes_per_token(), "trainer")
        )
    if not critic:
        if train:
            per = c.logits_train_bytes
        elif s.remove_padding and s.torch_compile:  # the entropy compiled: see logits_fwd_bytes_packed
            per = c.logits_fwd_bytes_packed
        else:
            per = c.logits_fwd_bytes
        per += a.logits_softcap_bytes
        terms.append(Term(f"{who} logits ({t} x {a.vocab} x {per} B)", t * a.vocab * per, "trainer"))
    return terms


def _mcore_work(s: Setup, role: Role, critic: bool, train: bool, c: Constants) -> list[Term]:
    a = s.arch
    t = _tokens(s, role, train)
    tp = role.tp
    who = role.name
    terms: list[Term] = []
    if train:
        per_layer = a.activation_bytes_per_token_layer()
        if role.sequence_parallel:
            per_layer_gpu = per_layer // tp
        else:  # norms and projection inputs are replicated across TP ranks without SP
            repl = 16 * a.hidden
            per_layer_gpu = repl + (per_layer - repl) // tp
        if s.eager_attention:
            per_layer_gpu += a.eager_attention_bytes(s.train_seq_len) // tp
        layers = a.layers // role.pp
        dp = s.world // (role.tp * role.pp * role.cp)
        rows = s.ppo_mini_batch_size * s.rollout.n // max(dp, 1)
        if role.dynamic_bsz:  # micro-batches of up to max_tokens_train tokens each
            n_micro = max(1, -(-rows * s.train_seq_len // max(role.max_tokens_train, 1)))
        else:
            n_micro = max(1, rows // max(role.micro_train, 1))
        in_flight = min(role.pp, n_micro)
        if role.recompute_full:
            stored = layers * (2 * a.hidden // (tp if role.sequence_parallel else 1))
            act = t * (in_flight * stored + per_layer_gpu)
            how = "full recompute"
        else:
            act = t * in_flight * layers * per_layer_gpu
            how = "no recompute"
        terms.append(Term(f"{who} activations ({t} tokens x {in_flight} in flight, {how})", act, "trainer"))
    else:
        terms.append(
            Term(
                f"{who} forward transient ({t} tokens)",
                t * a.forward_transient_bytes_per_token() // tp,
                "trainer",
            )
        )
    if not critic:
        per = (c.logits_train_bytes if train else c.logits_fwd_bytes) + a.logits_softcap_bytes
        terms.append(Term(f"{who} logits ({t} x {a.vocab}/{tp} x {per} B)", t * a.vocab // tp * per, "trainer"))
    return terms


def _work(s: Setup, role: Role, critic: bool, train: bool, c: Constants) -> list[Term]:
    return (_mcore_work if role.backend == "megatron" else _fsdp_work)(s, role, critic, train, c)


# ---- vLLM ------------------------------------------------------------------------------------
def vllm_weights(s: Setup) -> int:
    return s.arch.params() * s.rollout.dtype_bytes // s.rollout.tp


def vllm_activation_peak(s: Setup) -> int:
    """vLLM's profile run: `max_num_batched_tokens` through one layer, plus the sampler's fp32
    logits and probabilities for `max_num_seqs` sequences."""
    a, r = s.arch, s.rollout
    layer = r.max_num_batched_tokens * a.forward_transient_bytes_per_token() // r.tp
    sampler = r.max_num_seqs * a.vocab * 4 * 2
    return layer + sampler


def _group_terms(s: Setup, c: Constants) -> list[Term]:
    """The trainer's real process group beyond its allocator, none under a rank rehearsal's fake
    group (`Setup.fake_group`), which has no communicator. On FSDP one term per NCCL communicator
    and NCCL's own (`predict.fsdp_comm`), so what a rank rehearsal cannot allocate is named; on
    Megatron one: its groups' base (`Constants.group_base_bytes_megatron`) and one communicator's
    buffers for each group megatron-core's step touches (`predict.megatron_groups`)."""
    name = "trainer process group (NCCL)"
    if s.actor.backend == "megatron":
        r = s.actor
        comms = communicators(r.tp, r.pp, r.cp, s.world // (r.tp * r.pp * r.cp))
        nbytes = c.group_base_bytes_megatron + len(comms) * c.nccl_bytes_per_communicator
        return [Term(name, 0 if s.fake_group else nbytes, "trainer")]
    terms = fsdp_comm.fsdp_group_terms(s)
    return [Term(f"trainer {n}", b, "trainer") for n, b in terms] or [Term(name, 0, "trainer")]


def _nccl_vllm(s: Setup, c: Constants) -> int:
    return c.nccl_bytes_per_communicator if s.rollout.tp * s.rollout.pp > 1 else 0


# ---- the allocator's cache between phases ----------------------------------------------------


def _empties_cache(role: Role, train: bool, forward_only: bool = False) -> bool:
    """Whether verl 0.9.1 calls `empty_cache` when this role enters or leaves one of its phases.

    `BaseEngineCtx._context_switch` (verl/workers/engine/base.py) moves a role to the GPU on
    entering a phase and back on leaving it only through `engine.to(...)`, with `model=` the
    engine's `is_param_offload_enabled` and, in train mode, `optimizer=` its
    `is_optimizer_offload_enabled`. Which of those moves empty the cache:

      * FSDP (verl/workers/engine/fsdp/transformer_impl.py `FSDPEngine.to`): leaving calls
        `offload_fsdp_model_to_cpu`, whose default `empty_cache=True` empties it
        (verl/utils/fsdp_utils.py); `offload_fsdp_optimizer` does not. FSDP2's `offload_policy`
        and the forward-only reference set `_is_offload_param = False` (CPUOffloadPolicy moves
        the parameters itself), and `to` returns at once for a forward-only engine, so neither
        ever empties it.
      * Megatron (verl/utils/megatron_utils.py): `offload_megatron_model_to_cpu`,
        `load_megatron_model_to_gpu`, `offload_megatron_optimizer` and `load_megatron_optimizer`
        all end with `empty_cache`.
    """
    if forward_only and role.backend != "megatron":
        return False
    if role.backend == "megatron":
        return role.param_offload or (train and role.optimizer_offload)
    return role.param_offload and not (role.fsdp2 and role.offload_policy)


def _chain(s: Setup) -> dict[str, tuple[Role, bool, bool, bool]]:
    """The training phases a setup runs: phase -> (role, is the critic, trains, forward-only)."""
    chain: dict[str, tuple[Role, bool, bool, bool]] = {"old_log_prob": (s.actor, False, False, False)}
    if s.ref == "in_actor":
        chain["ref"] = (s.actor, False, False, False)
    elif s.ref == "separate" and s.ref_role is not None:
        chain["ref"] = (s.ref_role, False, False, True)
    if s.critic is not None:
        chain["values"] = (s.critic, True, False, False)
        chain["update_critic"] = (s.critic, True, True, False)
    chain["update_actor"] = (s.actor, False, True, False)
    return chain


def _carry_cache_floor(s: Setup, phases: list[PhasePlan]) -> None:
    """Add to each training phase what the earlier phases of the trainer process leave cached.

    Actor, critic and reference share one trainer process (`create_colocated_worker_cls`), and
    torch's caching allocator keeps the blocks a phase frees reserved, which NVML counts as used,
    until `empty_cache`. verl empties it at the end of the weight sync
    (verl/workers/engine_workers.py `update_weights`: `empty_cache()` after the actor's offload,
    before the KV cache resumes), so the chain starts clean at old_log_prob; between
    old_log_prob, ref, values, update_critic and update_actor it empties it only where a role
    moves its weights or optimizer with an offload that calls it (`_empties_cache`). Elsewhere,
    FSDP2's `offload_policy` and no offload at all alike, the trainer's reserved memory only
    grows through the step: each phase's trainer share is at least the previous phase's
    (measured on the 13b-fsdp ranks offloaded by the policy: 7.01, 8.89, 10.25, 10.27 GiB from
    old_log_prob to update_actor, dropping only at the sync). The floor assumes the cached
    blocks are reused (no fragmentation), so it is a lower bound on what carries over.

    The floor is the compute stream's. A role's FSDP2 gradients are allocated on that role's
    reduce-scatter stream, whose blocks the compute stream's cache cannot serve (the caching
    allocator returns a block to its own stream only): an update holds the larger of its other
    terms and the floor, plus its gradients, and once it ends they stay cached on that stream
    into the later phases. Measured on verl-vs-deepspeed's Qwen2-7B full fine-tuning: the
    critic's and actor's updates add 7.11 and 7.61 GiB to the phase before at rank 0 of 4, at 8 x
    564 tokens and at 8 x 1024 alike (the fp32 gradient shards are 6.58 and 7.08 GiB), while the
    forward phases before them differ by 8.4 GiB with the logits.
    """
    chain = _chain(s)
    floor, since = 0, ""
    kept: dict[str, tuple[int, str]] = {}  # role -> (its gradients cached on its reduce-scatter stream, since)
    for p in phases:
        if p.phase not in chain:
            continue
        role, _, train, forward_only = chain[p.phase]
        if _empties_cache(role, train, forward_only):  # entering empties it (Megatron's load)
            floor, since = 0, ""
            kept.clear()
        for name, (size, when) in kept.items():
            p.terms.append(Term(f"{name} {RS_CACHED} since {when}", size, "trainer"))
        on_rs = [t for t in p.terms if REDUCE_SCATTER_STREAM in t.name]
        own = p.by_process().get("trainer", 0) - sum(t.bytes for t in on_rs)
        if floor > own:
            p.terms.append(Term(f"trainer cache left by {since} (no empty_cache since)", floor - own, "trainer"))
        floor, since = max(floor, own), (since if floor > own else p.phase)
        grads = sum(t.bytes for t in on_rs if t.name.startswith(f"{role.name} gradients ("))
        if grads:
            kept[role.name] = (grads, p.phase)
        if _empties_cache(role, train, forward_only):  # leaving empties it (FSDP's and Megatron's offload)
            floor, since = 0, ""
            kept.clear()


def _fsdp_units(s: Setup, role: Role, critic: bool) -> list[int]:
    """Parameters of each FSDP2 unit of a role, in the order its forward gathers them.

    verl 0.9.1's `apply_fsdp2` (verl/utils/fsdp_utils.py, `_select_fsdp2_wrap_targets`) calls
    `fully_shard` on every decoder layer and, unless the embeddings are tied, on `embed_tokens`
    and `lm_head`, then on the whole model, whose own unit (the root) keeps the rest: the final
    norm, the critic's score head, a tied embedding. A forward gathers the root first (its
    pre-forward runs before any child's), then the embedding, the layers in order, the output
    layer last. A LoRA adapter is in its layer's unit.
    """
    a = s.arch
    layer = a.layer_params() + a.lora_layer_params(role.lora_rank, role.lora_targets)
    tied = a.tie_embeddings
    root = a.hidden + (a.hidden + 1 if critic else 0) + (a.embed_params if tied else 0)
    units = [root, *([] if tied else [a.embed_params]), *[layer] * a.layers]
    if not critic and not tied:
        units.append(a.lm_head_params)
    return units


def _all_gather_cache(s: Setup, role: Role, critic: bool) -> int:
    """Bytes FSDP2's all-gathers keep reserved on their own CUDA streams, at a world above 1.

    torch 2.11's FSDP2 (torch/distributed/fsdp/_fully_shard/): each root's `FSDPCommContext.
    lazy_init` (_fsdp_param_group.py) takes its own all-gather copy-in, all-gather and
    reduce-scatter streams, and in forward and pre-backward `get_all_gather_streams` hands the
    all-gather those streams. `foreach_all_gather` (_fsdp_collectives.py) allocates on the
    copy-in stream the unit's shard in the mixed-precision `param_dtype` (bf16, verl's default in
    verl/workers/engine/fsdp/transformer_impl.py; `_get_param_all_gather_inputs`) and the whole
    unit's output; in forward `wait_for_unshard` keeps that output (`comm_ctx.all_gather_state`)
    until the next unit's copy-out, by which time the next unit's shard and output are allocated
    too. The caching allocator gives a freed block back only to the stream it was allocated on,
    so these blocks stay reserved beside the compute stream's until `empty_cache`: per role, the
    largest pair of units gathered one after the other, plus the second one's shard,

        2 B x max over consecutive units (a, b) of (a + b + b / world).

    Actor and critic are separate roots with separate streams, so each has its own. At a world of
    1 `unshard` returns before `foreach_all_gather` and `wait_for_unshard` copies the shard into
    the unsharded parameter on the compute stream: nothing is cached, the term is 0.

    Checked against the committed 13b-fsdp runs (`verl-recipes compare-ranks`): rank 0 of 2 and the
    two-GPU job differ from the world of 1 by the sharded terms less this term, to 3% in every
    phase (recipes/13b-fsdp/comparisons/).
    """
    if role.backend != "fsdp" or not role.fsdp2 or s.world <= 1:
        return 0
    units = _fsdp_units(s, role, critic)
    return 2 * max(a + b + -(-b // s.world) for a, b in pairwise(units))


#: where FSDP2 puts a role's sharded gradients (`REDUCE_SCATTER_STREAM` in a term's name: not the
#: compute stream's cache, `_carry_cache_floor`)
REDUCE_SCATTER_STREAM = "FSDP2's reduce-scatter stream"
#: the name of a role's gradients freed after its update and still cached on that stream
RS_CACHED = f"gradients cached on {REDUCE_SCATTER_STREAM}"
#: the name every FSDP2 all-gather term carries (`verl_recipes.plan.rank_check` sums them)
ALL_GATHER = "FSDP2 all-gather buffers"


def _add_all_gather_caches(s: Setup, phases: list[PhasePlan]) -> None:
    """Add each role's FSDP2 all-gather cache to the training phases that hold it.

    A role's buffers are reserved from its first forward after an `empty_cache` (the weight
    sync's, or an offload's: `_empties_cache`) until the next one, and the compute stream cannot
    reuse them, so they add to the phase's own terms and the carried floor instead of counting
    in either (`_carry_cache_floor` runs first and never sees them).

    The term is what a world above 1 adds to the world of 1's terms, which are kept as they are
    measured: the compute stream holds the same at both worlds (one unsharded layer at a time;
    the working set's second layer stands for its cache either way). Measured on the committed
    runs (recipes/13b-fsdp/results/, Llama-2-13B with LoRA, 1.51 GiB per role at a world of 2):
    with both roles' buffers held, PyTorch's reserved peak at rank 0 of 2 (33.44 GiB) is the
    world of 1's (56.29) less the sharded tensors (25.96) plus 3.11 GiB, the two roles' 3.01 and
    0.10 of compute-stream cache (1.28 GiB against 1.17 at the world of 1); and the rank holds
    1.53 GiB more in values than in old_log_prob, where a world of 1 holds the same in both (the
    critic's forward first gathers there).
    """
    chain = _chain(s)
    held: dict[str, tuple[int, str]] = {}  # role -> (bytes, the phase that first gathered)
    for p in phases:
        if p.phase not in chain:
            continue
        role, critic, train, forward_only = chain[p.phase]
        if _empties_cache(role, train, forward_only):
            held.clear()
        held.setdefault(role.name, (_all_gather_cache(s, role, critic), p.phase))
        for name, (size, since) in held.items():
            if not size:
                continue
            kept = "" if name == role.name else f", cached since {since}"
            p.terms.append(Term(f"{name} {ALL_GATHER}{kept} (own streams, world {s.world})", size, "trainer"))
        if _empties_cache(role, train, forward_only):
            held.clear()


# ---- the phases ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Fixed:
    """The terms of a GPU that every phase holds whatever computes (the driver's reserve, the two
    processes' CUDA contexts and NCCL buffers), and vLLM's own, awake or asleep."""

    base: list[Term]
    vllm_full: list[Term]  # vLLM awake: its whole budget and its CUDA graphs
    vllm_asleep: list[Term]  # vLLM asleep (`free_cache_engine`): its CUDA graphs only
    free_cache_engine: bool

    @property
    def vllm_idle(self) -> list[Term]:
        """vLLM while the trainer computes: asleep where it sleeps, else awake."""
        return self.vllm_asleep if self.free_cache_engine else self.vllm_full


def _fixed_terms(s: Setup, total: int, budget: int, c: Constants) -> _Fixed:
    r = s.rollout
    graphs = 0 if r.enforce_eager else c.vllm_graph_bytes
    base = [
        Term("driver reserve (NVML used, no process)", c.device_reserved_bytes, "device"),
        Term("trainer CUDA context", c.cuda_context_bytes, "trainer"),
        *_group_terms(s, c),
        Term("vLLM CUDA context", c.cuda_context_bytes, "vllm"),
        Term("vLLM NCCL buffers", _nccl_vllm(s, c), "vllm"),
    ]
    vllm_full = [
        Term(
            f"vLLM budget ({r.gpu_memory_utilization:g} x {total / GIB:.1f} GiB: weights, activations, KV cache)",
            budget,
            "vllm",
        ),
        Term("vLLM CUDA graphs", graphs, "vllm"),
    ]
    return _Fixed(base, vllm_full, [Term("vLLM CUDA graphs (asleep)", graphs, "vllm")], r.free_cache_engine)


def _optimizer_share(role: Role, phase: str, updating: bool) -> float:
    """How much of a role's optimizer state is on the GPU in `phase`: all of it while it updates;
    at `outside` none (torch's AdamW makes its moments at the first step), but a third for Megatron,
    which builds its fp32 master weights at init; else all unless `optimizer_offload`."""
    if updating:
        return 1.0
    if phase == "outside":
        return 1 / 3 if role.backend == "megatron" and not role.optimizer_offload else 0.0
    return 0.0 if role.optimizer_offload else 1.0


#: a step's phases in verl's order: the step's own sync (`update_weights`) follows the actor's update
STEP_ORDER = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "update_weights")


def _before_first_update(s: Setup, role: Role, is_critic: bool, phase: str) -> bool:
    """Whether `phase` of a first-step plan (`Setup.first_step`) runs before the role's AdamW has
    made its moments: an FSDP role's phases up to its own update, that update's forward and
    backward included. Megatron's optimizer is not judged here (its share is `_optimizer_share`'s)."""
    if not s.first_step or role.backend != "fsdp" or phase not in STEP_ORDER:
        return False
    return STEP_ORDER.index(phase) <= STEP_ORDER.index("update_critic" if is_critic else "update_actor")


def _role_resident(s: Setup, role: Role, is_critic: bool, active: bool, phase: str) -> list[Term]:
    """One role's state held on the GPU in `phase`; `active`: the role computes in it."""
    updating = phase == ("update_critic" if is_critic else "update_actor")
    optim = 0.0 if _before_first_update(s, role, is_critic, phase) else _optimizer_share(role, phase, updating)
    on_gpu = active or not role.param_offload
    if phase == "update_weights" and not is_critic and role.backend == "fsdp" and role.fsdp2 and not role.lora_rank:
        # FSDP2 without LoRA streams each shard to the GPU on its own (`_skip_staging`).
        on_gpu = not role.param_offload
    # Megatron's main-grad buffer stays allocated unless param_offload frees it between
    # updates (verl loads it back only for training, `load_megatron_model_to_gpu(load_grad=)`).
    grads = updating or (role.backend == "megatron" and not role.param_offload)
    return _state(s, role, is_critic, weights=on_gpu, grads=grads, optim=optim)


def _resident(s: Setup, phase: str) -> list[Term]:
    """Trainer state held in `phase` by the roles that are not computing."""
    actor_active = phase in ("old_log_prob", "update_actor", "update_weights") or (
        phase == "ref" and s.ref == "in_actor"
    )
    terms: list[Term] = []
    for role, is_critic, active in (
        (s.actor, False, actor_active),
        (s.critic, True, phase in ("values", "update_critic")),
    ):
        if role is not None:
            terms += _role_resident(s, role, is_critic, active, phase)
    if s.ref == "separate" and s.ref_role is not None and s.ref_role.backend == "megatron":
        on = phase == "ref" or not s.ref_role.param_offload
        terms += _state(s, s.ref_role, False, weights=on, grads=False, optim=0.0)[:1]
    return terms


def _built(s: Setup, role: Role, is_critic: bool) -> list[Term]:
    """What a role holds while it builds, before verl offloads it."""
    if role.backend == "megatron":  # less the optimizer share `_resident` holds already
        held = 0.0 if role.optimizer_offload else 1 / 3
        return _state(s, role, is_critic, weights=True, grads=True, optim=1.0 - held)
    return _state(s, role, is_critic, weights=True, grads=False, optim=0.0)[:1]


def _outside_phase(s: Setup, fx: _Fixed, loaded_trainer: list[Term]) -> PhasePlan:
    """outside: each role builds its weights on the GPU and offloads them if asked (init), then
    vLLM starts after the trainer and takes its budget before it first sleeps. Megatron builds
    a role whole before verl offloads it: weights, main-grad buffer and optimizer states (the
    trainer process at 69.3-69.5 GiB in each full-depth rank of 70b-3d, before vLLM starts:
    recipes/70b-3d/results/h100x1-ppo-rank0of32-partial, 16.1 + 32.1 + 24.1 GiB planned)."""
    init_extra = [
        _built(s, role, is_critic)
        for role, is_critic in ((s.actor, False), (s.critic, True))
        if role is not None and role.param_offload and not (role.fsdp2 and role.offload_policy)
    ]
    init = fx.base[:2] + loaded_trainer + max(init_extra, key=lambda ts: sum(t.bytes for t in ts), default=[])
    start = fx.base + loaded_trainer + fx.vllm_full
    init_total, start_total = sum(t.bytes for t in init), sum(t.bytes for t in start)
    return PhasePlan("outside", start if start_total >= init_total else init)


def _sync_and_gen_phases(s: Setup, fx: _Fixed) -> list[PhasePlan]:
    """update_weights: the actor's weights gathered per tensor into the IPC bucket, vLLM's weights
    awake; and gen, vLLM awake with the trainer at rest."""
    a, r, actor = s.arch, s.rollout, s.actor
    sync_terms = [
        Term("weight-sync bucket (CUDA IPC)", r.bucket_bytes, "trainer"),
        Term("weight-sync staging (largest tensor, bf16, gathered)", 2 * a.largest_tensor_params(), "trainer"),
    ]
    if actor.lora_rank and s.lora_merge:
        lora = a.lora_params(actor.lora_rank, actor.lora_targets)
        sync_terms.append(Term("LoRA merge: adapter backup", lora * actor.param_bytes // s.world, "trainer"))
    vllm_weights_only = [Term("vLLM weights (awake, bf16)", vllm_weights(s), "vllm"), *fx.vllm_asleep]
    awake = vllm_weights_only if r.free_cache_engine else fx.vllm_full
    sync = fx.base + _resident(s, "update_weights") + sync_terms + awake
    # verl's update_weights ends by resuming vLLM's KV cache (engine_workers.update_weights, step 4)
    # once the trainer has offloaded: the phase's peak is the larger of the sync and that end
    # state, which is generation's (measured: 7b-lora h200x1-ppo, update_weights peak = gen peak).
    # (a step's sync follows its update: a first step's end state holds the moments gen lacked)
    gen_terms = fx.base + _resident(s, "gen") + fx.vllm_full
    end = fx.base + _resident(replace(s, first_step=False), "gen") + fx.vllm_full if s.first_step else gen_terms
    if sum(t.bytes for t in end) > sum(t.bytes for t in sync):
        sync = end
    return [PhasePlan("update_weights", sync), PhasePlan("gen", gen_terms)]


def _compute_phases(s: Setup, fx: _Fixed, c: Constants) -> list[PhasePlan]:
    """The trainer's phases, each role's resident state plus the working set of the one computing,
    in verl's order: log-probs, the reference, the critic's values and update, the actor's update."""
    actor, critic = s.actor, s.critic

    def phase(name: str, role: Role, is_critic: bool, train: bool) -> PhasePlan:
        terms = fx.base + _resident(s, name) + _work(s, role, is_critic, train, c) + fx.vllm_idle
        if train and _before_first_update(s, role, is_critic, name):
            # the first update: its forward and backward without the moments, then the step, where
            # the moments are made beside the gradients while the micro-batches' tensors are gone
            moments = _state(s, role, is_critic, weights=False, grads=False, optim=1.0)[2]
            temp = _adamw_temp(s, role, _params(s, role, is_critic))
            step = [
                *fx.base,
                *_resident(s, name),
                moments,
                Term(f"{role.name} AdamW step temporary (sqrt of exp_avg_sq, all at once)", temp, "trainer"),
                *fx.vllm_idle,
            ]
            if sum(t.bytes for t in step) > sum(t.bytes for t in terms):
                terms = step
        return PhasePlan(name, terms)

    phases = [phase("old_log_prob", actor, False, False)]
    if s.ref == "in_actor":
        ref_role = replace(actor, micro_infer=s.ref_role.micro_infer if s.ref_role else actor.micro_infer)
        phases.append(phase("ref", ref_role, False, False))
    elif s.ref == "separate" and s.ref_role is not None:
        # FSDP: verl forces CPUOffload on the forward-only reference; only the working set is on GPU.
        phases.append(phase("ref", s.ref_role, False, False))
    if critic is not None:
        phases += [phase("values", critic, True, False), phase("update_critic", critic, True, True)]
    phases.append(phase("update_actor", actor, False, True))
    return phases


@dataclass(frozen=True)
class _VllmStart:
    """vLLM's start after the trainer loaded: what is free for its budget, and its KV cache."""

    free: int
    kv: int  # the budget less weights, activations, NCCL and non-torch memory (may be negative)
    kv_tokens: int
    per_token: int
    needed: int  # one max_model_len sequence's KV bytes (sliding-window layers hold only the window)


def _vllm_start(s: Setup, total: int, budget: int, used: int, c: Constants) -> _VllmStart:
    r = s.rollout
    kv = budget - vllm_weights(s) - vllm_activation_peak(s) - _nccl_vllm(s, c) - c.vllm_nontorch_bytes
    per_tok = s.arch.kv_bytes_per_token(r.tp, r.dtype_bytes)
    return _VllmStart(total - used, kv, max(0, kv) // per_tok, per_tok, kv_bytes_needed(s, s.max_model_len))


def _problems(s: Setup, phases: list[PhasePlan], total: int, budget: int, v: _VllmStart) -> list[str]:
    """Why the plan does not fit, each in one line; empty when it does."""
    a, r = s.arch, s.rollout
    problems: list[str] = []
    if r.bucket_bytes < 2 * a.largest_tensor_params():
        problems.append(
            f"update_weights_bucket_megabytes={r.bucket_bytes // MIB} is below the largest bf16 weight "
            f"({2 * a.largest_tensor_params() / MIB:.0f} MiB): verl's weight sync refuses it"
        )
    for p in phases:
        if p.total > total:
            problems.append(f"{p.phase} needs {p.total / GIB:.1f} GiB of {total / GIB:.1f} GiB")
    if v.free < budget:
        problems.append(
            f"vLLM cannot start: {v.free / GIB:.1f} GiB free after the trainer loads, "
            f"gpu_memory_utilization asks {budget / GIB:.1f} GiB"
        )
    if v.kv <= 0:
        problems.append(f"vLLM has no KV cache: its weights and activations exceed its {budget / GIB:.1f} GiB budget")
    elif v.kv < v.needed:
        problems.append(
            f"vLLM KV cache holds {v.kv_tokens} tokens, less than one max_model_len={s.max_model_len} sequence"
        )
    return problems


def plan_gpu(s: Setup, gpu: GPU, c: Constants | None = None) -> GPUPlan:
    """Predict every phase of a step on one GPU kind."""
    c = c or Constants()
    r = s.rollout
    total = gpu.visible_bytes
    budget = int(r.gpu_memory_utilization * total)
    fx = _fixed_terms(s, total, budget, c)
    loaded_trainer = _resident(s, "outside")
    phases = [_outside_phase(s, fx, loaded_trainer), *_sync_and_gen_phases(s, fx), *_compute_phases(s, fx, c)]
    _carry_cache_floor(s, phases)
    _add_all_gather_caches(s, phases)
    v = _vllm_start(s, total, budget, sum(t.bytes for t in fx.base + loaded_trainer), c)
    replicas = max(1, s.world // (r.tp * r.pp))
    return GPUPlan(
        gpu=gpu,
        phases=phases,
        vllm_budget=budget,
        vllm_start_free=v.free,
        kv_bytes=max(0, v.kv),
        kv_tokens=v.kv_tokens,
        kv_needed_bytes=v.needed,
        max_model_len=s.max_model_len,
        batch_seqs_per_replica=-(-s.train_batch_size * r.n // replicas),
        problems=_problems(s, phases, total, budget, v),
    )


def kv_bytes_needed(s: Setup, tokens: int) -> int:
    """vLLM's KV bytes for one sequence of `tokens` (sliding-window layers hold only the window)."""
    r = s.rollout
    return s.arch.kv_bytes_for_sequence(tokens, r.tp, r.dtype_bytes, r.max_num_batched_tokens)


def min_utilization(s: Setup, gpu: GPU, c: Constants | None = None) -> float:
    """The smallest gpu_memory_utilization whose KV cache holds one max_model_len sequence."""
    c = c or Constants()
    need = (
        vllm_weights(s)
        + vllm_activation_peak(s)
        + _nccl_vllm(s, c)
        + c.vllm_nontorch_bytes
        + kv_bytes_needed(s, s.max_model_len)
    )
    return need / gpu.visible_bytes
