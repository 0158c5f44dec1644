"""What `vllm-pool` reads inside vLLM's GPU worker: the torch caching allocator's figures, through
`collective_rpc("pool_stats")` on a worker extension.

vLLM resolves `worker_extension_cls` by name and mixes it into its worker class. The extension here
is verl 0.9.1's own (`vLLMColocateWorkerExtension`, so the worker is patched as verl's is) with two
methods added; it is built on first access (the module `__getattr__`), so importing this module
loads neither torch nor verl (the measure wing imports light).
"""

from __future__ import annotations

from typing import Any

GIB = 1024**3

#: torch.cuda.memory_stats keys read each sample (the "all" pools: small and large blocks)
STAT_KEYS = {
    "allocated_gib": "allocated_bytes.all.current",
    "reserved_gib": "reserved_bytes.all.current",
    "active_gib": "active_bytes.all.current",
    "inactive_split_gib": "inactive_split_bytes.all.current",
}
COUNT_KEYS = {
    "segments": "segment.all.current",
    "alloc_retries": "num_alloc_retries",
    "device_allocs": "num_device_alloc",
    "device_frees": "num_device_free",
    "ooms": "num_ooms",
}


def pick(stats: dict[str, Any], segments: list[dict[str, Any]], free: int, total: int) -> dict[str, Any]:
    """One sample from `torch.cuda.memory_stats()`, `torch.cuda.memory_snapshot()` and
    `torch.cuda.mem_get_info()`: GiB and counts, and the segments of torch's default pool (pool id
    (0, 0)) apart from those of vLLM's sleep-mode pool (weights and KV cache, which sleep frees)."""
    out: dict[str, Any] = {k: round(int(stats.get(v, 0)) / GIB, 4) for k, v in STAT_KEYS.items()}
    out.update({k: int(stats.get(v, 0)) for k, v in COUNT_KEYS.items()})
    default = [s for s in segments if tuple(s.get("segment_pool_id", (0, 0))) == (0, 0)]
    sizes = [int(s.get("total_size", 0)) for s in default]
    used = [int(s.get("allocated_size", 0)) for s in default]
    out["default_pool_gib"] = round(sum(sizes) / GIB, 4)
    out["default_pool_allocated_gib"] = round(sum(used) / GIB, 4)
    out["default_pool_segments"] = len(default)
    out["largest_segment_gib"] = round(max(sizes, default=0) / GIB, 4)
    out["device_used_gib"] = round((total - free) / GIB, 4)
    return out


def pool_stats() -> dict[str, Any]:
    """The sample, read in the worker process (torch is there)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    try:  # without the trace entries where this torch can leave them out: a reading between steps stays short
        segments = torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:
        segments = torch.cuda.memory_snapshot()
    return pick(torch.cuda.memory_stats(), segments, free, total)


def refill_dummy_weights(worker: Any) -> None:
    """After a level-2 sleep the weights' memory comes back uninitialized; verl writes the actor's
    weights into it, and this stands in with vLLM's own dummy initialization (in place). verl's
    receiver (bucketed_weight_transfer.py) ends its sync with `empty_cache`, and so does this: a
    round starts on an empty default pool either way."""
    import torch
    from vllm.model_executor.model_loader.weight_utils import initialize_dummy_weights

    runner = worker.model_runner
    initialize_dummy_weights(runner.get_model(), runner.model_config)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def __getattr__(name: str) -> Any:
    if name != "PoolStatsExtension":
        raise AttributeError(name)
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    class PoolStatsExtension(vLLMColocateWorkerExtension):
        def pool_stats(self) -> dict[str, Any]:
            return pool_stats()

        def pool_refill_weights(self) -> None:
            refill_dummy_weights(self)

    PoolStatsExtension.__qualname__ = name  # found by its module and name, as vLLM resolves it
    globals()[name] = PoolStatsExtension
    return PoolStatsExtension
