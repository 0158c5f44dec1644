"""Megatron's offloaded weights in page-locked host memory of their own size.

verl 0.9.1 offloads a Megatron model between phases by copying each megatron-core DDP buffer (every
trainable bf16 weight of the rank in one tensor) into ``buffer.param_data.cpu_data``, which it
allocates once as ``torch.empty(..., pin_memory=True)`` (`offload_megatron_model_to_cpu`). That
tensor comes from torch's caching host allocator, which rounds every block up to a power of two
(`gpu/probes/pinned_rounding.py`): recipe 70b-3d's actor buffer on a rank of TP4 x PP2, 8.62 B
parameters or 16.06 GiB, holds 32 GiB of the host, and on pipeline stage 0 so does its critic's.
Rank 0 of that layout died of host memory on a 125.8 GiB host for those 32 GiB
(recipes/70b-3d/results/h200x1-ppo-rank0of32-partial), and a node of eight stage-0 ranks holds
about 255 GiB it never uses.

The fix makes the same tensor before verl looks for it: pageable memory of the buffer's exact
size, page-locked in place with ``cudaHostRegister`` (what `torch.cuda` itself does for memory it
shares), so copies to and from the GPU stay asynchronous and the host holds the buffer's bytes.
verl then finds ``cpu_data`` present, checks its shape and dtype, and copies into it, as it does
on every offload after the first. The tensors stay registered for the life of the process, as
verl keeps them.

The optimizer's states take the same rounding another way: verl's `offload_megatron_optimizer`
moves each fp32 master shard and Adam moment with ``.to("cpu", non_blocking=True)`` on every
offload, a pinned block per tensor from the same allocator, freed when the state goes back to the
GPU and kept in the allocator's cache for the next offload (a layer's 1792 MiB fc1 state takes
2048). The second fix gives each state tensor a host copy of its own size, page-locked the same
way, made at its first offload and kept: each offload copies the GPU tensor into it (queued on the
current stream, as verl's own copy is) and puts it in the tensor's place, so verl's ``.to("cpu")``
finds a CPU tensor and keeps it, and its load copies from it to a new GPU tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: every tensor registered here, kept alive so that no registered memory is ever freed under CUDA
_REGISTERED: list[Any] = []

#: cudaHostRegisterPortable: pinned for every CUDA context, as the caching allocator's blocks are
_PORTABLE = 1


def page_locked(shape: Any, dtype: Any) -> Any:
    """A CPU tensor of exactly `shape` x `dtype`, page-locked for the GPU's copies."""
    import torch

    t = torch.empty(shape, dtype=dtype, device="cpu")
    nbytes = t.untyped_storage().nbytes()
    if nbytes:
        err = int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, _PORTABLE))
        if err:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with CUDA error {err}")
        _REGISTERED.append(t)
    return t


def ddp_buffers(models: Iterable[Any]) -> list[Any]:
    """megatron-core's parameter-and-gradient buffers of the model chunks verl offloads (its
    DistributedDataParallel wrappers; a forward-only model has none)."""
    out: list[Any] = []
    for chunk in models:
        for name in ("buffers", "expert_parallel_buffers"):
            group = getattr(chunk, name, None)  # a plain torch module's `buffers` is a method
            if isinstance(group, (list, tuple)):
                out.extend(b for b in group if hasattr(b, "param_data"))
    return out


def make_offload(
    original: Callable[[Any], Any], alloc: Callable[[Any, Any], Any] = page_locked
) -> Callable[[Any], Any]:
    """verl's `offload_megatron_model_to_cpu`, with each buffer's host copy made first at exact size.

    A buffer already offloaded (its GPU storage freed) or with a host copy keeps what it has."""

    def offload_megatron_model_to_cpu(models: Any) -> Any:
        for buffer in ddp_buffers(models):
            data = buffer.param_data
            size = data.storage().size()  # verl's own test and record of the buffer's size
            if size and getattr(data, "cpu_data", None) is None:
                data.cpu_data = alloc(data.size(), data.dtype)
                buffer.param_data_size = size
        return original(models)

    offload_megatron_model_to_cpu.__wrapped__ = original  # type: ignore[attr-defined]
    return offload_megatron_model_to_cpu


def _opt_parts(optimizers: Any) -> list[Any]:
    """The optimizers verl's offload walks: a ChainedOptimizer's parts, or the one."""
    return list(getattr(optimizers, "chained_optimizers", None) or [optimizers])


def _flat(group: Any) -> list[Any]:
    """The tensors of `shard_fp32_from_float16_groups` (a list of lists of fp32 shards)."""
    if group is None:
        return []
    if isinstance(group, (list, tuple)):
        return [t for g in group for t in _flat(g)]
    return [group]


#: Adam's per-parameter state verl offloads (`master_param` under Megatron's precision-aware optimizer)
OPTIMIZER_STATES = ("exp_avg", "exp_avg_sq", "master_param")


def make_optimizer_offload(
    original: Callable[[Any], Any], alloc: Callable[[Any, Any], Any] = page_locked
) -> Callable[[Any], Any]:
    """verl's `offload_megatron_optimizer`, with each fp32 shard and Adam state moved into a host
    copy of its own size, made once per tensor and kept. A HybridDeviceOptimizer (states already
    split between devices) is left to verl."""
    homes: dict[tuple[int, str], Any] = {}
    keep: list[Any] = []  # what `homes` is keyed by (ids stay unique while these live)

    def home(owner: Any, key: str, t: Any) -> Any:
        slot = (id(owner), key)
        if slot not in homes:
            homes[slot] = alloc(t.size(), t.dtype)
            keep.append(owner)
        return homes[slot]

    def move(owner: Any, key: str, t: Any) -> Any:
        host = home(owner, key, t)
        if t.data_ptr() == host.data_ptr():
            return host
        host.copy_(t, non_blocking=True)
        return host

    def offload_megatron_optimizer(optimizers: Any) -> Any:
        for opt in _opt_parts(optimizers):
            for shard in _flat(getattr(opt, "shard_fp32_from_float16_groups", None)):
                shard.data = move(shard, "data", shard.data)
            inner = getattr(opt, "optimizer", None)
            if inner is None or hasattr(inner, "sub_optimizers"):
                continue
            for state in inner.state.values():
                for key in OPTIMIZER_STATES:
                    if key in state:
                        state[key] = move(state, key, state[key])
        return original(optimizers)

    offload_megatron_optimizer.__wrapped__ = original  # type: ignore[attr-defined]
    return offload_megatron_optimizer
