"""The NCCL communicators one rank of a Megatron job holds, from the code that makes them.

verl 0.9.1 (`workers/engine/megatron/transformer_impl.py`) calls megatron-core's
`parallel_state.initialize_model_parallel` with TP, PP, CP and EP sizes only, after
`torch.distributed.init_process_group(backend="cpu:gloo,cuda:nccl")` without a `device_id`
(`verl/utils/distributed.py`). megatron-core then makes, for every rank, a group of each kind:
DP-with-CP, DP, CP, model-parallel (TP x PP), TP, PP, embedding, position embedding, TP x DP
(with and without CP), TP x CP and the expert groups, each through `torch.distributed.new_group`;
with `create_gloo_process_groups` left at its default it adds gloo twins of the DP groups.

Without a `device_id` PyTorch makes a group's NCCL communicator at the group's first collective,
not when the group is made, so the device memory a rank holds is one communicator per group
that a PPO step's collectives touch. A group of one (TP1, PP1, ...) makes no communicator; the
gloo groups are host memory and sockets only. The groups a step touches, at a dense model's
settings (no MoE, no FP8, embeddings not tied, CP1):

* TP: the layers' all-reduces and Megatron-Bridge's weight export gathers;
* PP: the pipeline's send and receive between neighbouring stages (batched, on the group);
* DP with CP: the distributed optimizer's gradient reduce-scatter and parameter all-gather
  (megatron-core's DDP reduces over the group with CP, a group of its own even at CP1);
* DP: verl's reductions of metrics and token counts over data-parallel ranks;
* model-parallel (TP x PP): the gradient norm and the optimizer's inf check;
* the default group of every rank: verl's barriers.

`communicators` counts them for a layout; `validation/megatron-process-group.md` has the
arithmetic at 70b-3d's TP4 x PP2 x DP4 and what would confirm it on 8 GPUs. The bytes a
communicator holds are NCCL's own buffers (`Constants.nccl_bytes_per_communicator`, a prior);
`share_uncertainty` is how far the term can be off: the same count at twice those bytes (ring
and tree connections each holding their buffers at NCCL's default channel count) plus one
communicator more, for a pipeline peer that PyTorch may pair on a communicator of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the groups of megatron-core's `initialize_model_parallel` that a dense PPO step's collectives
#: touch, each with the sizes it spans (module docstring)
_TOUCHED = (
    ("tensor parallel", ("tp",)),
    ("pipeline parallel", ("pp",)),
    ("data parallel with context parallel", ("dp", "cp")),
    ("data parallel", ("dp",)),
    ("model parallel (TP x PP)", ("tp", "pp")),
    ("default (every rank)", ("world",)),
)


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator a rank holds: the group's name and how many ranks it spans."""

    group: str
    size: int


def communicators(tp: int, pp: int, cp: int, dp: int) -> list[Communicator]:
    """The communicators a rank of a TP x PP x CP x DP job holds after a step (groups of one
    make none)."""
    sizes = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "world": tp * pp * cp * dp}
    out = []
    for name, dims in _TOUCHED:
        n = 1
        for d in dims:
            n *= sizes[d]
        if n > 1:
            out.append(Communicator(name, n))
    return out


def share_uncertainty(tp: int, pp: int, cp: int, dp: int, per_communicator: int) -> int:
    """Bytes the planner's communicator term may be short by: the same communicators at twice
    `per_communicator`, and one more for a pipeline peer paired on its own (module docstring)."""
    n = len(communicators(tp, pp, cp, dp))
    if n == 0:
        return 0
    extra = 1 if pp > 1 else 0
    return (n + extra) * 2 * per_communicator - n * per_communicator
