"""Rank rehearsal: one local GPU runs verl's real trainer as rank R of an N-GPU job.

NCCL refuses two ranks on one GPU, so a job written for N GPUs cannot run on a host with fewer.
PyTorch's fake process group (backend ``fake``) lets one process be rank R of a world of N:
collectives return at once, but every buffer is allocated at its real size, so the rank's
shards, gathers and activations are real allocations on the GPU. The launcher asks for it with
`ENV_RANK` (``R/N``); the worker-side patches that act on it live here too, and those verl's
Megatron engine needs beyond them in `megatron_rehearsal`.

What a rehearsal cannot measure is said wherever its numbers are shown: no NCCL buffers, no
communication time, no imbalance between ranks; its step time is a compute-only lower bound.
Nor does it learn at a world above 1: the fake reduce-scatter writes nothing into the gradient
shards it hands back, so they hold whatever their new buffer held (zeros on the GPU hosts
here: every committed rank rehearsal of such a world logs a grad_norm of 0.0 for each model it
updates; leftover values on a CPU); the optimizer steps at full size on them, and a rehearsal
says what a step holds and costs, never what it learns.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from verl_recipes import RecipeError
from verl_recipes.layout import (
    JOB_POOLS,
    STAND_IN_KEYS,
    RankSpec,
    adapter_slices,
    layout_of,
    pool_share,
    rollout_stand_in,
)
from verl_recipes.worker import megatron_rehearsal
from verl_recipes.worker.import_hooks import after_import, replacing

# --- the worker side: the fake process group -------------------------------------------------


def init_fake_group(spec: RankSpec) -> None:
    """verl's process group as rank `spec.rank` of `spec.world`, through PyTorch's fake backend.

    verl 0.9.1 starts its training workers' group in
    ``verl.utils.distributed.initialize_global_process_group_ray`` (``cpu:gloo,cuda:nccl``, rank and
    world size from the ``RANK``/``WORLD_SIZE`` Ray sets for a worker group of one). Here the same
    call makes a fake group instead: FSDP shards to 1/N, gathers allocate full-size buffers, and no
    peer is waited for. DeviceMesh skips its device set-up under ``fake``, so the device is set
    here (Ray gives the worker one GPU, local index 0).
    """
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("fake", store=FakeStore(), rank=spec.rank, world_size=spec.world)
    for name in FAKE_GATHERS:
        if hasattr(dist, name):
            setattr(dist, name, outside_autograd_if_fake(getattr(dist, name)))


#: the all-gathers whose fake kernel autograd sees (torch.distributed's names FSDP1 calls)
FAKE_GATHERS = ("all_gather_into_tensor", "_all_gather_base")


def outside_autograd_if_fake(gather: Any) -> Any:
    """`gather` run under `torch.no_grad()` where its group is a fake one, as NCCL's kernel is
    outside autograd. torch 2.11's fake backend fills the output as `out.chunk(N)[i].copy_(in)`
    with autograd live (pytorch/pytorch#181774, fixed in a later torch), and FSDP1's full-precision
    gather buffer carries autograd history after one `summon_full_params(offload_to_cpu=True)`
    with grad enabled (its copy back from the host: verl's adapter-sync fallback): the next summon's
    gather into it raised "Output 0 of SplitBackward0 is a view and is being modified inplace"
    (the Qwen2.5-3B LoRA rank of 2, H100, 2026-12-07). A real group is left as it is."""
    import torch
    import torch.distributed as dist

    if getattr(gather, "_fake_no_grad", False):
        return gather

    @functools.wraps(gather)
    def wrapper(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        if torch.is_grad_enabled() and dist.get_backend(group) == "fake":
            with torch.no_grad():
                return gather(output_tensor, input_tensor, group, async_op)
        return gather(output_tensor, input_tensor, group, async_op)

    wrapper._fake_no_grad = True  # type: ignore[attr-defined]
    return wrapper


def _make_initialize(original: Any, spec: RankSpec) -> Any:
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None) -> None:
        # Only the training workers' own call (no backend named) stands in for the rank; a call
        # that names a backend (the checkpoint engine's gloo group for sglang / TRT-LLM) is verl's.
        if backend is None:
            init_fake_group(spec)
            return None
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize_global_process_group_ray


def _wrap(name: str, make: Any, spec: RankSpec) -> Any:
    """An import hook that replaces the module's function `name` (`Class.method` for a method) with
    `make(original, spec)`, once."""
    return replacing(name, lambda original: make(original, spec))


def _rebind(source: str, name: str) -> Any:
    """An import hook for a module that imported `source.name` by name: it may hold the original if
    it was bound before `source` was patched."""

    def rebind(mod: ModuleType) -> None:

        patched = getattr(importlib.import_module(source), name)
        if getattr(mod, name, None) is not patched:
            setattr(mod, name, patched)

    return rebind


def _make_load(original: Any, spec: RankSpec) -> Any:
    def fsdp2_load_full_state_dict(model: Any, full_state: Any, *args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        out = original(model, full_state, *args, **kwargs)
        if dist.get_rank() != 0:
            fill_unsent(model)
        return out

    fsdp2_load_full_state_dict.__wrapped__ = original  # type: ignore[attr-defined]
    return fsdp2_load_full_state_dict


def _make_init_fn(original: Any, spec: RankSpec) -> Any:
    def init_fn(x: Any) -> Any:
        # FSDP1's ``param_init_fn``: a non-zero rank materialises its meta modules with
        # ``to_empty`` and waits for rank 0's ``sync_module_states`` broadcast, which the fake
        # group never sends; the module's own tensors get finite values in place instead.
        import torch.distributed as dist

        x = original(x)
        if dist.get_rank() != 0:
            fill_unsent(x, recurse=False)
        return x

    init_fn.__wrapped__ = original  # type: ignore[attr-defined]
    return init_fn


#: the object rank 0's broadcast of a state dict's key list would carry, for the one
#: `broadcast_object_list` a non-zero rank receives inside `_broadcast_state_dict`
_from_rank0: list[dict[str, Any]] = []


def rank0_state_info(full_state: dict[str, Any]) -> dict[str, Any]:
    """The key list rank 0 broadcasts before the tensors (torch's ``_broadcast_state_dict``):
    ``_TensorInfo(size, dtype)`` for each tensor, the value itself for a scalar or a non-tensor.

    A non-zero rank of verl holds the same state dict on the meta device (or, for a model with
    tied embeddings, loaded as rank 0 loads it): the same keys, shapes and dtypes, so it computes
    rank 0's list itself. A scalar it cannot know arrives as zero, in rank 0's dtype.
    """
    import torch
    from torch.distributed._state_dict_utils import _TensorInfo

    info: dict[str, Any] = {}
    for key, value in full_state.items():
        if not torch.is_tensor(value):
            info[key] = value
        elif value.dim() == 0:
            info[key] = torch.zeros((), dtype=value.dtype) if value.is_meta else value.cpu()
        else:
            info[key] = _TensorInfo(value.size(), value.dtype)
    return info


def _make_broadcast_state_dict(original: Any, spec: RankSpec) -> Any:
    def _broadcast_state_dict(full_state_dict: Any, local_state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        # torch broadcasts rank 0's key list as an object, then each tensor, and (strict, as
        # verl loads) drops every local key the list lacks. Under the fake group a non-zero rank
        # receives no list: it would drop all its keys and load verl's meta or CPU full state
        # into its DTensor parameters ("aten.copy_.default got mixed torch.Tensor and DTensor").
        # It receives the list rank 0 computes instead, then runs torch's own path: one full-size
        # receive buffer a key, its shard copied out, as the real rank does.
        import torch.distributed as dist

        pg = kwargs.get("pg", args[1] if len(args) > 1 else None)
        if dist.get_backend(pg) == "fake" and dist.get_rank() != 0:
            _from_rank0.append(rank0_state_info(full_state_dict))
        try:
            return original(full_state_dict, local_state_dict, *args, **kwargs)
        finally:
            _from_rank0.clear()

    _broadcast_state_dict.__wrapped__ = original  # type: ignore[attr-defined]
    return _broadcast_state_dict


def fill_unsent(model: Any, recurse: bool = True) -> None:
    """What rank 0's broadcast would have put in a non-zero rank's shards, in values only.

    verl loads the checkpoint on rank 0 and broadcasts it (`fsdp2_load_full_state_dict`); under the
    fake group the broadcast sends nothing, so rank R > 0 keeps the uninitialised memory of
    ``to_empty``, whose NaNs and infinities would reach vLLM through the weight sync and the loss.
    The shards are filled in place with small normal values (the synthetic checkpoint's own
    init scale): the same tensors at the same sizes, so the memory is the rank's as it would be.
    A tensor still on the meta device (a module FSDP1 has not reached yet) is left as it is.
    """
    import torch

    with torch.no_grad():
        for p in list(model.parameters(recurse=recurse)) + list(model.buffers(recurse=recurse)):
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.is_floating_point() and local.numel():
                local.normal_(0.0, 0.02)


# --- the driver side: the rank's share of the job ---------------------------------------------


def data_parallel_size(config: Any, world: int) -> int:
    """How many data-parallel ranks the job's `world` GPUs form, each reading 1/DP of a batch:
    world / (TP x PP x CP) on Megatron (`layout.layout_of`), world / Ulysses SP on FSDP."""
    layout = layout_of(config, world)
    if layout is not None:
        return layout.dp
    sp = int(config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1) or 1)
    if world % sp:
        raise RecipeError(f"Ulysses sequence parallel {sp} does not divide the job's {world} GPUs")
    return world // sp


def localize(config: Any, spec: RankSpec, arch: dict[str, Any] | None = None) -> dict[str, tuple[Any, Any]]:
    """Turn verl's composed job config into what the driver of rank `spec.rank` alone runs.

    Called after verl's own ``validate_config`` checked the whole job. The driver then asks Ray for
    one GPU (a worker group of one) and reads 1/DP of the prompts each step (`data_parallel_size`:
    N on FSDP, N / (TP x PP x CP) on Megatron, where the ranks of one pipeline and TP group read
    the same batch), and runs its share of the job's CPU worker pools (`JOB_POOLS`); the worker's fake
    group of N keeps every per-rank division verl makes from the process group (FSDP shards, the
    mini-batch per data-parallel rank in ``TrainingWorker.train_mini_batch``) as in the real job.
    A rollout of TP=k becomes one TP1 replica of the per-rank stand-in (`rollout_stand_in`, from
    `arch`, else the model folder's config.json). Returns {key: (job value, rank value)}.
    """
    from omegaconf import OmegaConf, open_dict

    n = spec.world
    changed: dict[str, tuple[Any, Any]] = {}
    trainer, data = config.trainer, config.data
    rollout = config.actor_rollout_ref.rollout
    tp = int(rollout.get("tensor_model_parallel_size", 1) or 1)
    pp = int(rollout.get("pipeline_model_parallel_size", 1) or 1)
    if pp != 1 or int(rollout.get("data_parallel_size", 1) or 1) != 1:
        raise RecipeError(
            "a rank rehearsal stands in for a tensor-parallel rollout only; set the rollout's PP and DP to 1"
        )
    if tp > n:
        raise RecipeError(f"rollout TP={tp} spans more than the job's {n} GPUs")
    dp = data_parallel_size(config, n)
    batch = int(data.train_batch_size)
    if batch % dp:
        raise RecipeError(
            f"data.train_batch_size={batch} does not split over {dp} data-parallel ranks: use a multiple of {dp}"
        )
    overrides: dict[str, int] = {}
    if tp > 1:
        if arch is None:
            arch = json.loads((Path(config.actor_rollout_ref.model.path) / "config.json").read_text())
        overrides = rollout_stand_in(arch, tp)
    with open_dict(config):
        for key, section, name, value in (
            ("trainer.n_gpus_per_node", trainer, "n_gpus_per_node", 1),
            ("trainer.nnodes", trainer, "nnodes", 1),
            ("data.train_batch_size", data, "train_batch_size", batch // dp),
            ("actor_rollout_ref.rollout.tensor_model_parallel_size", rollout, "tensor_model_parallel_size", 1),
        ):
            if section[name] != value:
                changed[key] = (section[name], value)
                section[name] = value
        gen = data.get("gen_batch_size")
        if gen:
            changed["data.gen_batch_size"] = (gen, int(gen) // dp)
            data.gen_batch_size = int(gen) // dp
        for key in JOB_POOLS:
            pool = OmegaConf.select(config, key)
            share = pool_share(int(pool), n) if pool is not None else None
            if share is not None and share != int(pool):
                changed[key] = (pool, share)
                OmegaConf.update(config, key, share)
        if overrides:
            vllm_kwargs = rollout.engine_kwargs.get("vllm") or {}
            merged = {**(vllm_kwargs.get("hf_overrides") or {}), **overrides}
            rollout.engine_kwargs.vllm = {**vllm_kwargs, "hf_overrides": merged}
            changed["actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides"] = (None, overrides)
    return changed


def share_lines(config: Any, spec: RankSpec, arch: dict[str, Any]) -> list[str]:
    """What a rank rehearsal of the composed job is, or the one line why it cannot be: the share
    the driver will run (`localize`, on a copy) and, on Megatron, where the rank sits in the
    layout and which ranks hold the pipeline's two ends. The pre-flight prints these."""
    localize(copy.deepcopy(config), spec, arch)
    lines = [f"rank: {spec.label}; the plan below is one GPU's share of the job"]
    layout = layout_of(config, spec.world)
    if layout is not None:
        lines.append(f"rank: {layout.describe(spec.rank)}")
    return lines


def _make_register(original: Any, spec: RankSpec) -> Any:
    def _register_dispatch_collect_info(self: Any, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        # The driver splits each batch into max(DP rank of its workers) + 1 parts and gives a
        # worker the part of its DP rank, and collects outputs from the workers marked to
        # collect. A rehearsal has one worker, which holds the rank's whole share of the batch
        # whatever its DP rank in the job, and answers for its pipeline and TP group.
        return original(self, mesh_name, 0, True)

    _register_dispatch_collect_info.__wrapped__ = original  # type: ignore[attr-defined]
    return _register_dispatch_collect_info


def _make_broadcast_object_list(original: Any, spec: RankSpec) -> Any:
    def broadcast_object_list(
        object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None, group_src: Any = None
    ) -> None:
        # Under the fake group a tensor broadcast leaves the receiver's tensor as it was, but
        # torch's object broadcast then sizes its receive buffer from the sizes tensor it never
        # received: uninitialised memory (a CPU run asked for 140 TB), or garbage unpickled. A
        # rank that is not the source keeps its own objects, as it keeps its own tensors.
        # Megatron-Bridge's weight export calls it on every non-owning pipeline stage
        # (`MegatronParamMapping.broadcast_obj_from_pp_rank`, for expert counts).
        import torch.distributed as dist

        if dist.get_backend(group) == "fake":
            source = (
                src
                if src is not None
                else dist.get_global_rank(group or dist.distributed_c10d._get_default_group(), group_src)
            )
            if source != dist.get_rank():
                if source == 0 and _from_rank0:
                    object_list[0] = _from_rank0.pop()
                return None
        return original(object_list, src=src, group=group, device=device, group_src=group_src)

    broadcast_object_list.__wrapped__ = original  # type: ignore[attr-defined]
    return broadcast_object_list


def _make_run_ppo(original: Any, spec: RankSpec) -> Any:
    def run_ppo(config: Any, *args: Any, **kwargs: Any) -> Any:
        changed = localize(config, spec)
        print(
            f"verl_recipes: {spec.label}: the driver runs this rank's share: "
            + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
            file=sys.stderr,
            flush=True,
        )
        return original(config, *args, **kwargs)

    run_ppo.__wrapped__ = original  # type: ignore[attr-defined]
    return run_ppo


def _make_batch_multiple(original: Any, spec: RankSpec) -> Any:
    def _get_required_batch_multiple(self: Any, dp_size: int) -> int:
        # The real job pads its global batch to lcm(DP, PPO mini-batches); this rank's share of
        # that multiple is 1/DP of it (verl would pad the rank's batch back up to the global one).
        dp = data_parallel_size(self.config, spec.world)
        return int(original(self, dp_size * dp)) // dp

    _get_required_batch_multiple.__wrapped__ = original  # type: ignore[attr-defined]
    return _get_required_batch_multiple


# --- the TP rollout's stand-in receives rank 0's slice of each LoRA adapter tensor --------------

#: the rollout model's sizes (`STAND_IN_KEYS` of its HF overrides) in this worker process, read
#: where verl builds its actor-rollout worker from the localized config; empty: no stand-in
_rollout_sizes: dict[str, int] = {}


def rollout_sizes(rollout: Any) -> dict[str, int]:
    """The `STAND_IN_KEYS` a rollout config's vLLM HF overrides set (`localize` puts the stand-in's there)."""
    from omegaconf import OmegaConf

    overrides = OmegaConf.select(rollout, "engine_kwargs.vllm.hf_overrides") if rollout is not None else None
    return {k: int(v) for k, v in (overrides or {}).items() if k in STAND_IN_KEYS}


def slice_adapter(params: Iterable[tuple[str, Any]], slices: dict[tuple[str, str], int]) -> Iterator[tuple[str, Any]]:
    """PEFT's adapter tensors (``...<projection>.lora_A.weight`` [r, in], ``lora_B`` [out, r]) as
    the rollout's model holds them (`adapter_slices`): B's first rows, A's first columns."""
    for name, tensor in params:
        parts = name.split(".")
        for i, part in enumerate(parts[1:], start=1):
            if part in ("lora_A", "lora_B"):
                n = slices.get((parts[i - 1], part))
                if n is not None:
                    tensor = (tensor[:n] if part == "lora_B" else tensor[:, :n]).contiguous()
                break
        yield name, tensor


def _make_worker_init(original: Any, spec: RankSpec) -> Any:
    def __init__(self: Any, config: Any, role: str, *args: Any, **kwargs: Any) -> None:
        original(self, config, role, *args, **kwargs)
        _rollout_sizes.clear()
        _rollout_sizes.update(rollout_sizes(config.get("rollout")))

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _make_per_tensor_param(original: Any, spec: RankSpec) -> Any:
    def get_per_tensor_param(self: Any, *args: Any, **kwargs: Any) -> Any:
        # verl 0.9.1's adapter sync: (name, tensor) pairs and the PEFT config when the LoRA
        # adapter alone is sent (base_sync_done); the base weights go through vLLM's loaders,
        # which narrow a full tensor to the rank's slice themselves.
        params, peft = original(self, *args, **kwargs)
        base_sync_done = kwargs.get("base_sync_done", args[1] if len(args) > 1 else False)
        if peft is not None and base_sync_done and _rollout_sizes:
            slices = adapter_slices(self.model_config.hf_config.to_dict(), _rollout_sizes)
            if slices:
                params = slice_adapter(params, slices)
        return params, peft

    get_per_tensor_param.__wrapped__ = original  # type: ignore[attr-defined]
    return get_per_tensor_param


def apply() -> RankSpec | None:
    """Register the rehearsal's patches in this process when `ENV_RANK` is set (driver and workers)."""
    spec = RankSpec.from_env()
    if spec is None:
        return None
    after_import("verl.utils.distributed", _wrap("initialize_global_process_group_ray", _make_initialize, spec))
    after_import(
        "verl.workers.engine_workers", _rebind("verl.utils.distributed", "initialize_global_process_group_ray")
    )
    after_import("verl.utils.fsdp_utils", _wrap("fsdp2_load_full_state_dict", _make_load, spec))
    after_import(
        "verl.workers.engine.fsdp.transformer_impl", _rebind("verl.utils.fsdp_utils", "fsdp2_load_full_state_dict")
    )
    after_import("verl.utils.fsdp_utils", _wrap("init_fn", _make_init_fn, spec))
    after_import("verl.workers.engine.fsdp.transformer_impl", _rebind("verl.utils.fsdp_utils", "init_fn"))
    after_import(
        "verl.workers.engine.fsdp.fsdp_turbo_impl", _rebind("verl.utils.fsdp_utils", "fsdp2_load_full_state_dict")
    )
    after_import(
        "torch.distributed.checkpoint.state_dict", _wrap("_broadcast_state_dict", _make_broadcast_state_dict, spec)
    )
    after_import("verl.trainer.main_ppo", _wrap("run_ppo", _make_run_ppo, spec))
    after_import(
        "verl.trainer.ppo.v1.trainer_base",
        _wrap("PPOTrainer._get_required_batch_multiple", _make_batch_multiple, spec),
    )
    after_import(
        "verl.single_controller.base.worker", _wrap("Worker._register_dispatch_collect_info", _make_register, spec)
    )
    after_import("torch.distributed", _wrap("broadcast_object_list", _make_broadcast_object_list, spec))
    after_import("verl.workers.engine_workers", _wrap("ActorRolloutRefWorker.__init__", _make_worker_init, spec))
    after_import(
        "verl.workers.engine.fsdp.transformer_impl",
        _wrap("FSDPEngine.get_per_tensor_param", _make_per_tensor_param, spec),
    )

    megatron_rehearsal.apply()
    return spec
