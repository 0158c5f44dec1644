"""The GPU layout of a verl job, in one place: its rules, its ranks, its pools.

A job spreads `nodes x GPUs per node` ranks over tensor (TP), pipeline (PP) and context (CP)
parallel groups and data-parallel (DP) replicas: nodes x GPUs = TP x PP x CP x DP. Each rule
below is one reason a GPU host refuses a job, and each raises a one-line `RecipeError` that says
what to change, in the caller's words (`names`: the Slurm launcher says TP, the planner names
the verl key). The memory planner (`predict.inputs.check_layout`, which `train`'s pre-flight
runs) and the Slurm launcher's check (`cluster.settings.check`) both call these, so the two cannot
drift apart.

A rank of a job is one `RankSpec` (rank R of a world of N) from the command line to the run's
record; a rank rehearsed on one GPU runs its share of the job's CPU worker pools (`pool_share`)
and of a tensor-parallel rollout's model (`rollout_stand_in`); `MegatronLayout` places a rank in
Megatron's TP x CP x DP x PP order by the same divide rule.

Standard library only: the Slurm launcher imports this on a host's bare python3, and verl's
workers read their rank from it before CUDA is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from verl_recipes import RecipeError


def positive(name: str, value: int) -> int:
    """A size or count the layout divides by: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecipeError(f"{name}={value}: must be a whole number of at least 1")
    return value


def data_parallel(
    nodes: int,
    gpus_per_node: int,
    sizes: tuple[int, ...],
    what: str,
    fix: str,
    nodes_word: str = "nodes",
) -> int:
    """DP from nodes x GPUs = product(sizes) x DP; a split that leaves GPUs over is refused.

    `sizes` are the model-parallel sizes (TP, PP[, CP]) and `what` names them ("TP x PP").
    """
    world = nodes * gpus_per_node
    group = 1
    for s in sizes:
        group *= s
    if world % group:
        raise RecipeError(
            f"{world} GPUs ({nodes} {nodes_word} x {gpus_per_node}) do not divide by {what} = "
            f"{' x '.join(str(s) for s in sizes)} = {group}; {fix}"
        )
    return world // group


def tp_in_node(gpus_per_node: int, tp: int, name: str = "TP") -> None:
    """A tensor-parallel group exchanges activations every layer, so it stays inside one node."""
    if tp > gpus_per_node:
        raise RecipeError(
            f"{name}={tp} exceeds the {gpus_per_node} GPUs of a node; tensor parallel must stay inside "
            f"a node: lower {name} or use nodes with more GPUs"
        )
    if gpus_per_node % tp:
        raise RecipeError(
            f"{name}={tp} does not divide the {gpus_per_node} GPUs of a node, so a tensor-parallel group "
            f"would span two nodes; use a {name} that divides the GPUs per node"
        )


def heads_over_tp(tp: int, heads: int, kv_heads: int, name: str, kv_replicated: bool) -> None:
    """TP splits attention by heads. Megatron splits query and KV heads alike; vLLM replicates KV
    heads when TP exceeds them (`kv_replicated`), so there TP may also be a multiple of them."""
    if heads % tp:
        raise RecipeError(f"{name}={tp} does not divide num_attention_heads={heads}")
    if kv_heads % tp and not (kv_replicated and tp % kv_heads == 0):
        how = "neither divides nor is a multiple of" if kv_replicated else "does not divide"
        raise RecipeError(f"{name}={tp} {how} num_key_value_heads={kv_heads}")


def layers_over_pp(pp: int, layers: int, name: str) -> None:
    """Pipeline stages hold whole decoder layers."""
    if layers % pp:
        raise RecipeError(f"{name}={pp} does not divide num_hidden_layers={layers}")


def batch_over_ranks(rows: int, minimal: int, train_batch: int, mini_batch: int) -> None:
    """verl's start-up check (`verl.utils.config.validate_config`, `ActorConfig.validate`): every
    data-parallel rank gets whole rows, and a PPO mini-batch is not larger than the batch."""
    if rows % minimal:
        raise RecipeError(
            f"data.train_batch_size x rollout.n = {rows} is not a multiple of {minimal} "
            "(verl's minimal batch: the GPUs, or Megatron DP x micro-batch); change the batch or the GPUs"
        )
    if train_batch < mini_batch:
        raise RecipeError(
            f"data.train_batch_size={train_batch} is below actor_rollout_ref.actor."
            f"ppo_mini_batch_size={mini_batch} (verl rejects it); "
            f"lower ppo_mini_batch_size to at most {train_batch}"
        )


# ---- ranks and pools ---------------------------------------------------------------------------
#: set by the launcher for every process of a rehearsed run: ``R/N`` (rank R of a world of N).
ENV_RANK = "VERL_RECIPES_RANK_REHEARSAL"


#: `rank_rehearsal.pools` in a rank rehearsal's provenance (and its bounds): the rank ran its share
#: of the job's CPU worker pools (`JOB_POOLS`); a record without it ran them whole
POOLS_SHARED = "rank share"


@dataclass(frozen=True)
class RankSpec:
    """Rank `rank` of a job of `world` GPUs, rehearsed on one local GPU."""

    rank: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1:
            raise RecipeError(f"a rank rehearsal needs a world of at least 1 GPU, not {self.world}")
        if not 0 <= self.rank < self.world:
            raise RecipeError(
                f"--rank {self.rank} is not a rank of this job's {self.world} GPU(s): use 0 to {self.world - 1}"
            )

    @property
    def env_value(self) -> str:
        return f"{self.rank}/{self.world}"

    @property
    def label(self) -> str:
        """How reports, bounds files and tables name such a run."""
        return f"rank rehearsal ({self.rank} of {self.world})"

    def record(self) -> dict[str, Any]:
        """The run's provenance entry (`rank_rehearsal`), which `from_record` reads back: the rank
        ran its share of the job's CPU worker pools (`POOLS_SHARED`)."""
        return {"rank": self.rank, "world": self.world, "pools": POOLS_SHARED}

    @classmethod
    def from_record(cls, raw: Any) -> RankSpec | None:
        """The rank a provenance entry (`record`, or an older one without `pools`) names; None: a full run."""
        return cls(int(raw["rank"]), int(raw["world"])) if isinstance(raw, dict) and raw else None

    @classmethod
    def parse(cls, value: str) -> RankSpec:
        try:
            rank, world = (int(x) for x in value.split("/"))
        except ValueError as e:
            raise RecipeError(f"{ENV_RANK}={value!r}: expected R/N, e.g. 0/2") from e
        return cls(rank, world)

    @classmethod
    def from_env(cls) -> RankSpec | None:
        value = os.environ.get(ENV_RANK)
        return cls.parse(value) if value else None


#: verl's job-level pools of CPU worker processes (Ray actors without a GPU), each sized for the
#: whole job and spread over its nodes by Ray: a rehearsed rank runs its share of each, so its host
#: holds what one rank's share of the job holds (a rank of 70b-3d's 32 GPUs ran all eight of each,
#: 24 GiB of RSS, on one host). `reward_model.num_workers`, when set, overrides `reward.num_workers`
#: in verl 0.9.1 (`experimental/reward_loop/reward_loop.py`), so it is shared too.
JOB_POOLS = (
    "actor_rollout_ref.rollout.agent.num_workers",  # agent-loop workers (verl's default 8)
    "reward.num_workers",  # reward-loop workers (8)
    "reward_model.num_workers",  # its legacy name (null unless set)
    "transfer_queue.backend.SimpleStorage.num_data_storage_units",  # TransferQueue storage units (8)
)


def pool_share(n: int, world: int, ranks: int = 1) -> int:
    """The workers of a job-level pool of `n` that `ranks` of the job's `world` GPUs hold: their
    share, at least one."""
    return max(1, -(-n * ranks // max(world, 1)))


# vLLM 0.24.0's model classes that size a head as hidden_size // num_attention_heads whatever the
# config's head_dim says (vllm/model_executor/models/qwen2.py:152, qwen2_moe.py:225), by HF model_type
HEAD_SIZE_FROM_HIDDEN = frozenset({"qwen2", "qwen2_moe"})


def rollout_stand_in(arch: dict[str, Any], tp: int) -> dict[str, int]:
    """The HF config overrides that make a TP1 vLLM model hold what one rank of TP=`tp` holds.

    vLLM shards attention by heads (KV heads replicated once there are fewer than ranks), the MLP
    by its intermediate size, and keeps the hidden size and norms whole on every rank
    (``QKVParallelLinear``, ``MergedColumnParallelLinear``, ``RowParallelLinear``). A TP1 model with
    heads/tp, max(1, KV heads/tp), intermediate/tp and the same explicit head size has the same
    weights and the same KV cache per token as such a rank; its loaders take the first rank's
    slice of each full tensor the weight sync sends (a LoRA adapter's tensors are sliced before
    they are sent: `adapter_slices`). The vocabulary stays whole (the embedding and output layer
    hold vocab x hidden instead of 1/tp of it, the logits are the full-vocabulary ones every rank
    gathers), so every prompt token has a row. What the stand-in leaves out is labelled
    where its numbers are shown: vLLM's custom all-reduce buffers and NCCL communicators.

    Some of vLLM's model classes take the head size as hidden size / heads and never read
    ``head_dim`` (`HEAD_SIZE_FROM_HIDDEN`): with heads/tp their layers would hold heads of twice
    the size while the attention backend plans for the config's, and FlashAttention 3 stops at the
    profile run ("scheduler_metadata must have shape (metadata_size)", Qwen2-7B at TP2 on an H100,
    2026-12-07). Those keep their heads whole and split the MLP only: the rank's vLLM then holds
    (1 - 1/tp) of the attention weights more and as much less KV cache, within the same
    ``gpu_memory_utilization``, so its device total is the rank's.
    """
    heads = int(arch["num_attention_heads"])
    kv = int(arch.get("num_key_value_heads") or heads)
    inter = int(arch["intermediate_size"])
    head_dim = int(arch.get("head_dim") or int(arch["hidden_size"]) // heads)
    for name, size in (("attention heads", heads), ("intermediate size", inter)):
        if size % tp:
            raise RecipeError(f"the model's {name} ({size}) do not split over rollout TP={tp}: vLLM refuses it too")
    if arch.get("model_type") in HEAD_SIZE_FROM_HIDDEN:
        return {"intermediate_size": inter // tp}
    return {
        "num_attention_heads": heads // tp,
        "num_key_value_heads": max(1, kv // tp),
        "intermediate_size": inter // tp,
        "head_dim": head_dim,
    }


#: the HF config keys `rollout_stand_in` overrides: where the rollout's model differs from the trainer's
STAND_IN_KEYS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "head_dim")


def adapter_slices(arch: dict[str, Any], rollout: dict[str, int]) -> dict[tuple[str, str], int]:
    """How much of each LoRA tensor the rollout's model holds, where its sizes (`rollout`, the
    `STAND_IN_KEYS` of its HF overrides) are smaller than the trainer's (`arch`):
    {(projection, "lora_A" | "lora_B"): length of the split dimension}.

    A LoRA adapter's B matrix has the output rows of its layer and A the input columns. vLLM's
    TP>1 layers take their rank's slice of each (``slice_lora_b`` of a column-parallel layer: the
    q/k/v and gate/up rows; ``slice_lora_a`` of a row-parallel one: the o/down columns), while its
    TP1 layers take the tensor whole, so a TP1 stand-in for rank 0 (`rollout_stand_in`) must be
    sent rank 0's slice, the first rows or columns, or vLLM's ``set_lora`` refuses the copy
    (Qwen2.5-3B at TP2, "size of tensor a (5504) must match ... (11008)", H100, 2026-12-07).
    """
    out: dict[tuple[str, str], int] = {}
    inter = rollout.get("intermediate_size")
    if inter and inter != int(arch["intermediate_size"]):
        for key in (("gate_proj", "lora_B"), ("up_proj", "lora_B"), ("down_proj", "lora_A")):
            out[key] = int(inter)
    heads = rollout.get("num_attention_heads")
    full_heads = int(arch["num_attention_heads"])
    if heads and heads != full_heads:
        head_dim = int(rollout.get("head_dim") or arch.get("head_dim") or int(arch["hidden_size"]) // full_heads)
        kv = int(rollout.get("num_key_value_heads") or heads)
        out[("q_proj", "lora_B")] = out[("o_proj", "lora_A")] = int(heads) * head_dim
        out[("k_proj", "lora_B")] = out[("v_proj", "lora_B")] = kv * head_dim
    return out


# ---- Megatron's layout --------------------------------------------------------------------------
@dataclass(frozen=True)
class MegatronLayout:
    """A dense model's Megatron layout over `world` GPUs (expert parallelism 1)."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:  # the divide rule every layout obeys (`data_parallel`)
        for name, size in (("TP", self.tp), ("PP", self.pp), ("CP", self.cp)):
            positive(name, size)
        data_parallel(1, self.world, (self.tp, self.pp, self.cp), "TP x PP x CP", "Megatron refuses it too", "node")

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank `rank`'s place, in megatron-core's default order ``tp-cp-ep-dp-pp``."""
        if not 0 <= rank < self.world:
            raise RecipeError(f"--rank {rank} is not a rank of this job's {self.world} GPU(s)")
        out = {}
        for name, size in (("tp", self.tp), ("cp", self.cp), ("dp", self.dp), ("pp", self.pp)):
            out[name] = rank % size
            rank //= size
        return out

    def first_rank(self, stage: int) -> int:
        """The rank with TP, CP and DP coordinates 0 on pipeline stage `stage`."""
        return stage * self.world // self.pp

    def describe(self, rank: int) -> str:
        """One line: where `rank` sits, and which ranks hold the pipeline's two ends."""
        c = self.coordinates(rank)
        last = self.pp - 1
        ends = (
            f"one stage holds the embedding and the output layer, its first rank is --rank {self.first_rank(0)}"
            if self.pp == 1
            else f"the first rank of stage 0 (embedding) is --rank {self.first_rank(0)}, "
            f"of the last stage {last} (output layer, loss) --rank {self.first_rank(last)}"
        )
        return (
            f"rank {rank} of TP{self.tp} x PP{self.pp} x DP{self.dp}"
            + (f" x CP{self.cp}" if self.cp > 1 else "")
            + f" is TP rank {c['tp']}, DP rank {c['dp']}, pipeline stage {c['pp']}; {ends}"
        )


def layout_of(config: Any, world: int) -> MegatronLayout | None:
    """The Megatron layout of verl's composed job config (None when the actor is not Megatron).

    verl 0.9.1 initialises Megatron's parallel state once per process, from the first engine it
    builds, so a critic or reference model of another layout is refused here as Megatron's
    ``initialize_model_parallel`` would leave it wrong there."""
    actor = config.actor_rollout_ref.actor
    if actor.get("strategy") != "megatron":
        return None

    def sizes(section: Any) -> tuple[int, int, int]:
        m = section.megatron
        cp = int(m.get("context_parallel_size", 1) or 1)
        return int(m.tensor_model_parallel_size), int(m.pipeline_model_parallel_size), cp

    mine = sizes(actor)
    for name, section in (("critic", config.get("critic")), ("reference", config.actor_rollout_ref.get("ref"))):
        megatron = section is not None and section.get("strategy") == "megatron" and section.get("megatron")
        if megatron and sizes(section) != mine:
            raise RecipeError(
                f"the {name}'s Megatron layout TP/PP/CP {sizes(section)} differs from the actor's {mine}; "
                "one process holds one Megatron parallel state"
            )
    if int(actor.megatron.get("virtual_pipeline_model_parallel_size") or 1) > 1:
        raise RecipeError("a rank rehearsal runs the plain 1F1B pipeline schedule; drop the virtual pipeline size")
    tp, pp, cp = mine
    return MegatronLayout(world, tp, pp, cp)
