"""The memory-relevant settings of a composed verl 0.9.1 configuration, as plain data.

The planner reads a composed `DictConfig` once into a frozen `Setup`; the memory model and the
knob search then work on that dataclass (a knob is a `dataclasses.replace`). Every key read here
exists in verl 0.9.1's `ppo_trainer` / `ppo_megatron_trainer` Hydra configs; a key that is absent
means the file is not a verl 0.9.1 config and fails with its name.

How verl 0.9.1 uses them (verl/trainer/ppo/v1/trainer_base.py, verl/workers/engine_workers.py,
verl/workers/engine/fsdp/transformer_impl.py):
  * a critic exists when `critic.enable` is true, or it is null and `algorithm.adv_estimator` is
    `gae` (`verl.trainer.ppo.utils.need_critic`);
  * a reference policy exists only with `algorithm.use_kl_in_reward` or `actor.use_kl_loss`
    (`need_reference_policy`); with LoRA it is the actor with its adapter disabled ("ref in
    actor": no second copy of the weights);
  * micro-batches: `actor.ppo_micro_batch_size_per_gpu` (update), `rollout.log_prob_micro_batch_
    size_per_gpu` (old log-probs), `ref.log_prob_micro_batch_size_per_gpu`, `critic.ppo_micro_
    batch_size_per_gpu` / `forward_micro_batch_size_per_gpu`; with `use_dynamic_bsz` the token
    budgets `*max_token_len_per_gpu` bound a micro-batch instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from verl_recipes import RecipeError
from verl_recipes.fixes import CRITIC_BATCHING_FIX
from verl_recipes.layout import (
    MegatronLayout,
    RankSpec,
    batch_over_ranks,
    data_parallel,
    heads_over_tp,
    layers_over_pp,
    positive,
    tp_in_node,
)
from verl_recipes.predict.model import LORA_MODULES, Arch
from verl_recipes.recipe.verl_schema import wants

_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2}
# Megatron LoRA module names -> the Hugging Face projections they cover.
_MCORE_LORA = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}


@dataclass(frozen=True)
class Role:
    """One trained or forward-only model (actor, critic, separate reference) on the trainer."""

    name: str
    backend: str  # "fsdp" | "megatron"
    param_bytes: int  # bytes per stored parameter (FSDP model_dtype; Megatron bf16 = 2)
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = LORA_MODULES
    param_offload: bool = False
    optimizer_offload: bool = False
    grad_ckpt: bool = True
    micro_train: int = 1  # sequences per micro-batch in the update
    micro_infer: int = 1  # sequences per micro-batch in forward-only passes
    dynamic_bsz: bool = False
    max_tokens_train: int = 16384
    max_tokens_infer: int = 16384
    ulysses_sp: int = 1
    fsdp2: bool = False  # FSDP2 streams weights to the sync per tensor (no whole-model reload)
    # FSDP2 CPUOffloadPolicy (`offload_policy: true`): parameters, gradients and the optimizer
    # step live on the CPU for good; the GPU holds only the units being computed.
    offload_policy: bool = False
    # FSDP1 `use_orig_params` (verl's default false): the module's parameters are plain views of
    # the flat parameter between forwards (`host.gather_outlives_sync`)
    orig_params: bool = False
    # Megatron
    tp: int = 1
    pp: int = 1
    cp: int = 1
    sequence_parallel: bool = True
    distributed_optimizer: bool = True
    recompute_full: bool = False

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp if self.backend == "megatron" else self.ulysses_sp


@dataclass(frozen=True)
class Rollout:
    tp: int = 1
    dp: int = 1
    pp: int = 1
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    free_cache_engine: bool = True
    enforce_eager: bool = False
    dtype_bytes: int = 2
    bucket_bytes: int = 2048 * 1024**2
    n: int = 1
    name: str = "vllm"
    # vLLM's `distributed_executor_backend` ("mp": verl 0.9.1's own, a worker process beside the
    # engine core; "uni": the worker inside it). Only the host-RAM model reads it: device memory
    # and a run's rate are the same either way, so it takes no part in comparing configurations.
    executor: str = field(default="mp", compare=False)
    # `rollout.load_format`: "dummy" (verl's default) starts vLLM with random weights, so verl's
    # first sync of a LoRA served as an adapter sends the whole base model. Host RAM only.
    load_format: str = field(default="dummy", compare=False)
    # `rollout.layered_summon`: how verl's FSDP engine gathers a LoRA adapter for each sync (one
    # FSDP unit at a time, else the whole model); under FSDP1 it falls back to a whole-model
    # gather into host memory (predict/host.py, `adapter_full_gather`). Host RAM only.
    layered_summon: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Setup:
    """Everything the memory model needs, read from one composed verl configuration."""

    arch: Arch
    nnodes: int
    gpus_per_node: int
    train_batch_size: int
    prompt_len: int
    response_len: int
    ppo_mini_batch_size: int
    actor: Role
    rollout: Rollout
    critic: Role | None = None
    ref: str = "none"  # "none" | "in_actor" | "separate"
    ref_role: Role | None = None
    lora_merge: bool = False
    remove_padding: bool = True
    eager_attention: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Agent-loop worker processes (`rollout.agent.num_workers`): each is a Ray actor with verl
    # imported, so they move host RAM only (predict/host.py).
    agent_workers: int = 8
    # The job's other CPU worker pools, host RAM only: reward-loop workers (`reward.num_workers`)
    # and TransferQueue storage units (`transfer_queue.backend.SimpleStorage.num_data_storage_units`).
    reward_workers: int = field(default=8, compare=False)
    storage_units: int = field(default=8, compare=False)
    # `actor.use_torch_compile` (verl's default true): the FSDP engine compiles its entropy on the
    # padding-free path, which starts torch inductor's compile workers. Host RAM only.
    torch_compile: bool = field(default=True, compare=False)
    # `data.dataloader_num_workers`: the worker processes of verl's train dataloader, forked from
    # the TaskRunner for the whole run, and as many again for its validation dataloader while a
    # validation runs (`trainer.test_freq` > 0: every test_freq steps and the last). Host RAM only.
    dataloader_workers: int = field(default=8, compare=False)
    validates: bool = field(default=False, compare=False)
    # The longest sequence (prompt + response) a measured run's batches held, from verl's logged
    # `prompt_length/max` + `response_length/max`; None (every plan of a configuration) means the
    # bound, `seq_len`. verl's trainer pads a micro-batch to its longest sequence, or packs it
    # without padding (the FSDP engine's `prepare_model_inputs`), so a run whose responses stop
    # early or whose prompts are short trained on fewer tokens than the bound, and the planner is
    # judged against it at the tokens it held (`runs.judged_setup`: `plan --errors`, `compare-ranks`).
    logged_seq_len: int | None = field(default=None, compare=False)
    # The plan is of a run's first step alone (a measured run of one step, `runs.judged_setup`):
    # torch's AdamW makes its moments at the first `optimizer.step()`, after the last
    # micro-batch's backward, so an FSDP role holds none in the phases before its first update
    # and runs that update's forward and backward without them. False for every plan of a
    # configuration: a job's steps 2+, where the moments stay.
    first_step: bool = field(default=False, compare=False)
    # The trainer ran under PyTorch's fake process group (a rank rehearsal, `train --rank`): no
    # NCCL communicator and nothing of a real group's set-up on the device. False for every plan
    # of a configuration; a measured rehearsal sets it (`runs.run_setup`).
    fake_group: bool = field(default=False, compare=False)
    # The Megatron pipeline stage whose ranks the plan is of: a rank rehearsal's (`runs.run_setup`,
    # the pre-flight of `train --rank`); None, every plan of a configuration, means the stage that
    # holds the most (the host planner weighs the first and the last: embedding against output
    # layer, and the power-of-two blocks they fall into).
    pp_stage: int | None = field(default=None, compare=False)
    # The rank of its job the plan is of (`with_rank`: a rank rehearsal's, the pre-flight of
    # `train --rank`); None, every plan of a configuration, means node 0's ranks.
    rank: RankSpec | None = field(default=None, compare=False)

    def with_rank(self, rank: RankSpec) -> Setup:
        """This Setup as `rank` of its job runs it: the rank, and its pipeline stage (megatron-core's
        rank order, `MegatronLayout.coordinates`) where the actor is pipelined."""

        a = self.actor
        if a.backend != "megatron" or a.pp <= 1:
            return replace(self, rank=rank)
        stage = MegatronLayout(self.world, a.tp, a.pp, a.cp).coordinates(rank.rank)["pp"]
        return replace(self, rank=rank, pp_stage=stage)

    @property
    def world(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def seq_len(self) -> int:
        """The bound: every sequence at max_prompt_length + max_response_length."""
        return self.prompt_len + self.response_len

    @property
    def train_seq_len(self) -> int:
        """The sequence length the trainer's micro-batches are sized at: the bound, or a measured
        run's longest logged sequence where it is shorter."""
        return min(self.logged_seq_len or self.seq_len, self.seq_len)

    @property
    def backend(self) -> str:
        return self.actor.backend

    def dp(self, role: Role) -> int:
        return self.world // role.model_parallel

    @property
    def max_model_len(self) -> int:
        return self.rollout.max_model_len or self.arch.max_position_embeddings


def _sel(cfg: Any, key: str, default: Any = None, required: bool = True) -> Any:
    """A value from the composed config, interpolations resolved; absent keys fail by name.

    A key that exists but is unset (null, or `???` like verl's `rollout.name`) gives `default`.
    """
    from omegaconf import DictConfig, OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, throw_on_missing=False) if parent_key else cfg
    # `in` on a DictConfig is False for `???` values, so look the key up among the keys.
    if not isinstance(parent, DictConfig) or leaf not in list(parent.keys()):
        if required:
            raise RecipeError(f"the configuration has no {key}: compose it from verl 0.9.1's Hydra config")
        return default
    if OmegaConf.is_missing(parent, leaf):
        return default
    val = OmegaConf.select(cfg, key)
    if val is None:
        return default
    if OmegaConf.is_config(val):
        val = OmegaConf.to_container(val, resolve=True)
    # a value the planner reads as a number or a flag is one (composition checks this too; a
    # config handed to the planner directly has not been through it)
    want = wants(val, type(default)) if isinstance(default, bool | int | float) else None
    if want:
        raise RecipeError(f"{key}={val!r}: must be {want}, like verl's default {default!r}")
    return val


def _dtype_bytes(name: Any, key: str) -> int:
    s = str(name).lower()
    if s not in _DTYPE_BYTES:
        raise RecipeError(f"{key}={name}: not a dtype the planner knows ({', '.join(sorted(_DTYPE_BYTES))})")
    return _DTYPE_BYTES[s]


def _targets(raw: Any, key: str) -> tuple[str, ...]:
    if raw in (None, "all-linear", "all_linear"):
        return LORA_MODULES
    items = list(raw) if isinstance(raw, list | tuple) else [raw]
    out: list[str] = []
    for t in items:
        t = str(t)
        if t in _MCORE_LORA:
            out.extend(_MCORE_LORA[t])
        elif t in LORA_MODULES:
            out.append(t)
        else:
            raise RecipeError(f"{key}: LoRA target {t!r} is not modelled; use all-linear or {', '.join(LORA_MODULES)}")
    return tuple(dict.fromkeys(out))


def _pos_int(cfg: Any, key: str, default: int | None = None, required: bool = True) -> int | None:
    v = _sel(cfg, key, default, required=required)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise RecipeError(f"{key}={v}: must be a positive integer")
    return v


def _micro(cfg: Any, key: str, dynamic: bool, fallback: int | None = None, required: bool = True) -> int:
    v = _pos_int(cfg, key, required=required)
    if v is None:
        v = fallback
    if v is None:
        if dynamic:
            return 1
        raise RecipeError(f"{key} is not set: verl 0.9.1 needs it without use_dynamic_bsz; set it, e.g. {key}=2")
    return v


def _is_megatron(strategy: Any) -> bool:
    return str(strategy) == "megatron"


def _fsdp_role(
    cfg: Any,
    name: str,
    base: str,
    engine: str,
    model: str,
    micro_train: int,
    micro_infer: int,
    dynamic: bool,
    max_train: int,
    max_infer: int,
) -> Role:
    sp = max(
        int(_sel(cfg, f"{engine}.ulysses_sequence_parallel_size", 1)),
        int(_sel(cfg, f"{base}.ulysses_sequence_parallel_size", 1, required=False)),
    )
    return Role(
        name=name,
        backend="fsdp",
        param_bytes=_dtype_bytes(_sel(cfg, f"{engine}.model_dtype", "fp32"), f"{engine}.model_dtype"),
        lora_rank=int(_sel(cfg, f"{model}.lora_rank", 0)),
        lora_targets=_targets(_sel(cfg, f"{model}.target_modules", "all-linear"), f"{model}.target_modules"),
        param_offload=bool(_sel(cfg, f"{engine}.param_offload", False)),
        optimizer_offload=bool(_sel(cfg, f"{engine}.optimizer_offload", False)),
        grad_ckpt=bool(_sel(cfg, f"{model}.enable_gradient_checkpointing", True)),
        micro_train=micro_train,
        micro_infer=micro_infer,
        dynamic_bsz=dynamic,
        max_tokens_train=max_train,
        max_tokens_infer=max_infer,
        ulysses_sp=sp,
        fsdp2=str(_sel(cfg, f"{base}.strategy", "fsdp")) == "fsdp2",
        offload_policy=bool(_sel(cfg, f"{engine}.offload_policy", False, required=False)),
        orig_params=bool(_sel(cfg, f"{engine}.use_orig_params", False, required=False)),
    )


def _mcore_role(
    cfg: Any,
    name: str,
    engine: str,
    model: str,
    lora_key: str,
    micro_train: int,
    micro_infer: int,
    dynamic: bool,
    max_train: int,
    max_infer: int,
) -> Role:
    gran = _sel(cfg, f"{engine}.override_transformer_config.recompute_granularity", None, required=False)
    rank = int(_sel(cfg, f"{lora_key}.rank", 0, required=False) or _sel(cfg, f"{model}.lora_rank", 0))
    targets = _sel(cfg, f"{lora_key}.target_modules", None, required=False)
    return Role(
        name=name,
        backend="megatron",
        param_bytes=_dtype_bytes(_sel(cfg, f"{engine}.dtype", "bfloat16", required=False), f"{engine}.dtype"),
        lora_rank=rank,
        lora_targets=_targets(targets, f"{lora_key}.target_modules"),
        param_offload=bool(_sel(cfg, f"{engine}.param_offload", False)),
        optimizer_offload=bool(_sel(cfg, f"{engine}.optimizer_offload", False, required=False)),
        grad_ckpt=gran == "full",
        micro_train=micro_train,
        micro_infer=micro_infer,
        dynamic_bsz=dynamic,
        max_tokens_train=max_train,
        max_tokens_infer=max_infer,
        tp=int(_sel(cfg, f"{engine}.tensor_model_parallel_size", 1)),
        pp=int(_sel(cfg, f"{engine}.pipeline_model_parallel_size", 1)),
        cp=int(_sel(cfg, f"{engine}.context_parallel_size", 1, required=False)),
        sequence_parallel=bool(_sel(cfg, f"{engine}.sequence_parallel", True, required=False)),
        distributed_optimizer=bool(_sel(cfg, f"{engine}.use_distributed_optimizer", True, required=False)),
        recompute_full=gran == "full",
    )


# CRITIC_BATCHING_FIX hands the critic's batching keys to its engine; a run without it
# (`--verl-fix-off`, or recorded before it existed) batches the critic as verl does.


#: TransferQueue's storage units, a job-level pool like the agent-loop and reward-loop workers
STORAGE_UNITS = "transfer_queue.backend.SimpleStorage.num_data_storage_units"

#: attention implementations that keep packed sequences apart: flash-attn's (where it is built)
#: and torch's own variable-length kernel (verl_recipes.worker.packed_attention).
PACKED_ATTENTION = ("flash_attention_2", "flash_attention_3", "torch_varlen")


def _check_packed_attention(cfg: Any, model: str) -> None:
    """Refuse padding removal with an attention that attends across the packed sequences.

    verl's FSDP engine with `use_remove_padding` hands the model one row of every real token, the
    sequences told apart only by `position_ids`; sdpa and eager in transformers 5 ignore those and
    attend across the boundaries, so the log-probs are wrong and nothing says so.
    """
    if not bool(_sel(cfg, f"{model}.use_remove_padding", True, required=False)):
        return
    attn = _sel(cfg, f"{model}.override_config.attn_implementation", None, required=False)
    if attn is not None and str(attn) not in PACKED_ATTENTION:
        raise RecipeError(
            f"{model}.use_remove_padding=true with {model}.override_config.attn_implementation={attn}: "
            f"{attn} attends across the packed sequences; set {model}.override_config.attn_implementation="
            "torch_varlen (or use_remove_padding=false)"
        )


def _pool(key: str, value: Any, what: str = "workers") -> int:
    """A job's CPU worker pool size, at least one: verl splits every batch over the agent-loop and
    reward-loop workers (`DataProto.chunk(len(workers))`, `pad_dataproto_to_divisor`), so a pool
    of none starts and then fails at the first step; TransferQueue spreads its storage over its
    units (`SimpleStorage`: the size divided by their count) likewise."""
    if int(value) < 1:
        raise RecipeError(f"{key}={value!r}: each batch is split over these {what}; give 1 or more")
    return int(value)


def _dataloader_workers(cfg: Any) -> int:
    """`data.dataloader_num_workers` (verl's default 8; 0 loads in the TaskRunner itself)."""
    key = "data.dataloader_num_workers"
    value = int(_sel(cfg, key, 8, required=False))
    if value < 0:
        raise RecipeError(f"{key}={value}: give 0 (load in the trainer) or more worker processes")
    return value


def _reward_workers(cfg: Any) -> int:
    """`reward.num_workers`, or the legacy `reward_model.num_workers`, which verl 0.9.1 copies over
    it when set (its default is null)."""
    legacy = _sel(cfg, "reward_model.num_workers", None, required=False)
    if legacy is not None:
        if isinstance(legacy, bool) or not isinstance(legacy, int):
            raise RecipeError(f"reward_model.num_workers={legacy!r}: must be a whole number, or null (verl's default)")
        return _pool("reward_model.num_workers", legacy)
    return _pool("reward.num_workers", _sel(cfg, "reward.num_workers", 8, required=False))


_A, _R, _M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"


@dataclass(frozen=True)
class _ActorBatching:
    """The actor's batching keys, the defaults of the reference's and the critic's."""

    dynamic: bool  # use_dynamic_bsz
    max_train: int  # ppo_max_token_len_per_gpu


def _actor(cfg: Any, mega: bool) -> tuple[Role, _ActorBatching]:
    a, r, m = _A, _R, _M
    dyn = bool(_sel(cfg, f"{a}.use_dynamic_bsz", False))
    max_train = int(_sel(cfg, f"{a}.ppo_max_token_len_per_gpu", 16384))
    max_infer = int(_sel(cfg, f"{r}.log_prob_max_token_len_per_gpu", max_train))
    micro_train = _micro(cfg, f"{a}.ppo_micro_batch_size_per_gpu", dyn)
    micro_lp = _micro(cfg, f"{r}.log_prob_micro_batch_size_per_gpu", dyn)
    if mega:
        actor = _mcore_role(
            cfg, "actor", f"{a}.megatron", m, f"{m}.lora", micro_train, micro_lp, dyn, max_train, max_infer
        )
    else:
        actor = _fsdp_role(cfg, "actor", a, f"{a}.fsdp_config", m, micro_train, micro_lp, dyn, max_train, max_infer)
    return actor, _ActorBatching(dyn, max_train)


def _reference(cfg: Any, mega: bool, actor: Role, batching: _ActorBatching) -> tuple[str, Role | None]:
    """The reference policy's mode and role (verl.trainer.ppo.utils.need_reference_policy;
    ref_in_actor with LoRA)."""
    m = _M
    needs_ref = bool(_sel(cfg, "algorithm.use_kl_in_reward", False)) or bool(_sel(cfg, f"{_A}.use_kl_loss", False))
    lora_any = actor.lora_rank > 0 or _sel(cfg, f"{m}.lora_adapter_path", None, required=False) is not None
    ref_mode = "none" if not needs_ref else ("in_actor" if lora_any else "separate")
    if ref_mode == "none":
        return ref_mode, None
    rf = "actor_rollout_ref.ref"
    ref_dyn = bool(_sel(cfg, f"{rf}.log_prob_use_dynamic_bsz", batching.dynamic))
    ref_micro = _micro(cfg, f"{rf}.log_prob_micro_batch_size_per_gpu", ref_dyn)
    ref_max = int(_sel(cfg, f"{rf}.log_prob_max_token_len_per_gpu", batching.max_train))
    if mega:
        ref_role = _mcore_role(
            cfg, "ref", f"{rf}.megatron", m, f"{m}.lora", ref_micro, ref_micro, ref_dyn, ref_max, ref_max
        )
        return ref_mode, _replace(ref_role, lora_rank=0)
    base = _fsdp_role(cfg, "ref", rf, f"{rf}.fsdp_config", m, ref_micro, ref_micro, ref_dyn, ref_max, ref_max)
    return ref_mode, _replace(base, lora_rank=0)


def _critic(cfg: Any, batching: _ActorBatching, fixes_off: Sequence[str], notes: list[str]) -> Role | None:
    """The critic's role, where the job has one (verl.trainer.ppo.utils.need_critic)."""
    enable = _sel(cfg, "critic.enable", None)
    has_critic = bool(enable) if enable is not None else str(_sel(cfg, "algorithm.adv_estimator")) == "gae"
    if not has_critic:
        return None
    c = "critic"
    cdyn = bool(_sel(cfg, f"{c}.use_dynamic_bsz", batching.dynamic))
    cmicro = _micro(cfg, f"{c}.ppo_micro_batch_size_per_gpu", cdyn)
    cfwd = _micro(cfg, f"{c}.forward_micro_batch_size_per_gpu", cdyn, fallback=cmicro, required=False)
    cmax = int(_sel(cfg, f"{c}.ppo_max_token_len_per_gpu", 32768))
    cfmax = int(_sel(cfg, f"{c}.forward_max_token_len_per_gpu", cmax, required=False))
    if CRITIC_BATCHING_FIX in fixes_off:
        # verl 0.9.1's own engine path (trainer/ppo/v1/trainer_base.py) hands the critic's engine
        # one token budget, critic.ppo_infer_max_token_len_per_gpu (32768; not a key of verl's
        # YAML), and the engine's use_dynamic_bsz defaults to true: the critic's own batching
        # keys never reach it, and it takes its whole mini-batch at once, up to that budget
        # (results/h200x1-ppo-profile: one micro-batch of 8 sequences where the config says 2).
        cdyn, cmicro, cfwd = True, 1, 1
        cmax = cfmax = int(_sel(cfg, f"{c}.ppo_infer_max_token_len_per_gpu", 32768, required=False))
        notes.append(
            f"critic: without the fix {CRITIC_BATCHING_FIX}, verl 0.9.1 gives the critic's engine a budget of "
            f"{cmax} tokens per micro-batch; its micro-batch sizes, use_dynamic_bsz and "
            "ppo_max_token_len_per_gpu have no effect"
        )
    if _is_megatron(_sel(cfg, f"{c}.strategy")):
        return _mcore_role(
            cfg, "critic", f"{c}.megatron", f"{c}.model", f"{c}.model.lora", cmicro, cfwd, cdyn, cmax, cfmax
        )
    return _fsdp_role(cfg, "critic", c, f"{c}.fsdp", f"{c}.model", cmicro, cfwd, cdyn, cmax, cfmax)


def _rollout(cfg: Any, notes: list[str]) -> Rollout:
    """vLLM's settings (any other rollout is modelled as vLLM, with a note)."""
    r = _R
    name = _sel(cfg, f"{r}.name", "vllm")
    if str(name) not in ("vllm", "None"):
        notes.append(f"rollout.name={name}: the rollout is modelled as vLLM")
    max_model_len = _pos_int(cfg, f"{r}.max_model_len")
    rollout = Rollout(
        tp=int(_sel(cfg, f"{r}.tensor_model_parallel_size", 1)),
        dp=int(_sel(cfg, f"{r}.data_parallel_size", 1)),
        pp=int(_sel(cfg, f"{r}.pipeline_model_parallel_size", 1)),
        gpu_memory_utilization=float(_sel(cfg, f"{r}.gpu_memory_utilization", 0.5)),
        max_num_seqs=int(_sel(cfg, f"{r}.max_num_seqs", 256)),
        max_num_batched_tokens=int(_sel(cfg, f"{r}.max_num_batched_tokens", 8192)),
        max_model_len=int(max_model_len) if max_model_len else None,
        free_cache_engine=bool(_sel(cfg, f"{r}.free_cache_engine", True)),
        enforce_eager=bool(_sel(cfg, f"{r}.enforce_eager", False)),
        dtype_bytes=_dtype_bytes(_sel(cfg, f"{r}.dtype", "bfloat16"), f"{r}.dtype"),
        bucket_bytes=int(_sel(cfg, f"{r}.checkpoint_engine.update_weights_bucket_megabytes", 2048, required=False))
        * 1024**2,
        n=int(_sel(cfg, f"{r}.n", 1)),
        name=str(name),
        executor=str(_sel(cfg, f"{r}.engine_kwargs.vllm.distributed_executor_backend", None, required=False) or "mp"),
        load_format=str(_sel(cfg, f"{r}.load_format", "dummy", required=False) or "dummy"),
        layered_summon=bool(_sel(cfg, f"{r}.layered_summon", False, required=False)),
    )
    if not 0.0 < rollout.gpu_memory_utilization <= 1.0:
        raise RecipeError(f"{r}.gpu_memory_utilization={rollout.gpu_memory_utilization}: must be in (0, 1]")
    return rollout


def setup_from_config(cfg: Any, arch: Arch, fixes_off: Sequence[str] = ()) -> Setup:
    """Read a composed verl 0.9.1 config into a `Setup`; bad layouts fail in `check_layout`.

    `fixes_off`: the verl_fixes the run goes without (`train --verl-fix-off`); they change what
    verl does with some keys.
    """
    a, r, m = _A, _R, _M
    mega = _is_megatron(_sel(cfg, f"{a}.strategy"))
    notes: list[str] = []
    actor, batching = _actor(cfg, mega)
    ref_mode, ref_role = _reference(cfg, mega, actor, batching)
    critic = _critic(cfg, batching, fixes_off, notes)
    rollout = _rollout(cfg, notes)
    attn = _sel(cfg, f"{m}.override_config.attn_implementation", None, required=False)
    if not mega:
        _check_packed_attention(cfg, m)
        if critic is not None:
            _check_packed_attention(cfg, "critic.model")
    setup = Setup(
        arch=arch,
        nnodes=int(_sel(cfg, "trainer.nnodes", 1)),
        gpus_per_node=int(_sel(cfg, "trainer.n_gpus_per_node", 8)),
        train_batch_size=int(_sel(cfg, "data.train_batch_size", 0)),
        prompt_len=int(_sel(cfg, "data.max_prompt_length", 0)),
        response_len=int(_sel(cfg, "data.max_response_length", 0)),
        ppo_mini_batch_size=int(_sel(cfg, f"{a}.ppo_mini_batch_size", 0)),
        actor=actor,
        rollout=rollout,
        critic=critic,
        ref=ref_mode,
        ref_role=ref_role,
        lora_merge=bool(_sel(cfg, f"{m}.lora.merge", False, required=False)),
        remove_padding=bool(_sel(cfg, f"{m}.use_remove_padding", True)),
        eager_attention=str(attn) == "eager",
        notes=tuple(notes),
        agent_workers=_pool(f"{r}.agent.num_workers", _sel(cfg, f"{r}.agent.num_workers", 8, required=False)),
        reward_workers=_reward_workers(cfg),
        storage_units=_pool(STORAGE_UNITS, _sel(cfg, STORAGE_UNITS, 8, required=False), "storage units"),
        torch_compile=bool(_sel(cfg, f"{a}.use_torch_compile", True, required=False)),
        dataloader_workers=_dataloader_workers(cfg),
        validates=int(_sel(cfg, "trainer.test_freq", -1, required=False)) > 0,
    )
    check_layout(setup)
    return setup


def _replace(role: Role, **kw: Any) -> Role:

    return replace(role, **kw)


def check_layout(s: Setup) -> None:
    """Fail on a parallel layout that does not divide, with the setting to change (the rules live
    in `verl_recipes.layout`, which the Slurm launcher's check uses too)."""
    arch = s.arch
    gpus, nodes = "trainer.n_gpus_per_node", "trainer.nnodes"
    positive(nodes, s.nnodes)
    positive(gpus, s.gpus_per_node)
    ro = s.rollout
    r = "actor_rollout_ref.rollout"
    for key, v in (("tensor", ro.tp), ("data", ro.dp), ("pipeline", ro.pp)):
        positive(f"{r}.{key}_model_parallel_size" if key != "data" else f"{r}.data_parallel_size", v)
    positive(f"{r}.n", ro.n)
    heads_over_tp(ro.tp, arch.heads, arch.kv_heads, f"{r}.tensor_model_parallel_size", kv_replicated=True)
    fix = f"change them, {nodes} or {gpus}"
    data_parallel(s.nnodes, s.gpus_per_node, (ro.tp, ro.dp, ro.pp), "the rollout's TP x DP x PP", fix)
    tp_in_node(s.gpus_per_node, ro.tp, f"{r}.tensor_model_parallel_size")
    for role in (s.actor, s.critic, s.ref_role):
        if role is None:
            continue
        key = {"actor": "actor_rollout_ref.actor", "ref": "actor_rollout_ref.ref"}.get(role.name, "critic")
        if role.backend == "megatron":
            eng = f"{key}.megatron"
            tp, pp, cp = (f"{eng}.{k}_parallel_size" for k in ("tensor_model", "pipeline_model", "context"))
            for name, v in ((tp, role.tp), (pp, role.pp), (cp, role.cp)):
                positive(name, v)
            heads_over_tp(role.tp, arch.heads, arch.kv_heads, tp, kv_replicated=False)
            layers_over_pp(role.pp, arch.layers, pp)
            data_parallel(s.nnodes, s.gpus_per_node, (role.tp, role.pp, role.cp), f"{role.name} TP x PP x CP", fix)
            tp_in_node(s.gpus_per_node, role.tp, tp)
        else:
            sp = role.ulysses_sp
            name = f"{key}.ulysses_sequence_parallel_size"
            positive(name, sp)
            data_parallel(s.nnodes, s.gpus_per_node, (sp,), name, fix)
            if arch.heads % sp:
                raise RecipeError(f"{name}={sp} does not divide num_attention_heads={arch.heads}")
    for name, v in (
        ("data.train_batch_size", s.train_batch_size),
        ("data.max_prompt_length", s.prompt_len),
        ("data.max_response_length", s.response_len),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", s.ppo_mini_batch_size),
    ):
        positive(name, v)
    # verl.utils.config.validate_config and ActorConfig.validate, which verl runs at start.
    if not s.actor.dynamic_bsz:
        rows = s.train_batch_size * ro.n
        minimal = s.dp(s.actor) * s.actor.micro_train if s.actor.backend == "megatron" else s.world
        batch_over_ranks(rows, minimal, s.train_batch_size, s.ppo_mini_batch_size)
