"""The fix `megatron-weights-exact-pinned` against verl 0.9.1's own offload function.

verl's `offload_megatron_model_to_cpu` lives in a module that imports megatron-core, which this
machine does not have, so the function is compiled here from verl's installed source on its own,
with megatron-core's DDP class as its one stand-in (an object with megatron-core's buffer
attributes). The CPU test shows verl's code taking the fix's host copy (its allocation, which
needs a GPU, never runs); the GPU test shows the copy exact in size and page-locked, where verl's
own allocation rounds up to a power of two.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from verl_recipes.fixes import FIXES, MEGATRON_OPT_PIN_FIX, MEGATRON_PIN_FIX
from verl_recipes.worker import verl_fixes
from verl_recipes.worker.pinned_offload import ddp_buffers, make_offload, make_optimizer_offload, page_locked


class Buffer:
    """megatron-core's `_ParamAndGradBuffer`, as verl's offload reads it."""

    def __init__(self, n: int, device: str = "cpu") -> None:
        self.param_data = torch.arange(n, dtype=torch.bfloat16, device=device)
        self.grad_data = torch.zeros(n, dtype=torch.float32, device=device)


class DDP(torch.nn.Module):
    """megatron-core's DistributedDataParallel: its buffers are a list attribute."""

    def __init__(self, *buffers: Buffer) -> None:
        super().__init__()
        self.module = torch.nn.Linear(2, 2)
        self.buffers = list(buffers)  # type: ignore[assignment]
        self.expert_parallel_buffers: list[Buffer] = []


class ChainedOptimizer:
    """megatron-core's ChainedOptimizer, as verl's offload tells it apart (never built here)."""


def _verl_functions(*names: str) -> dict[str, Any]:
    """verl 0.9.1's functions of `verl/utils/megatron_utils.py`, compiled from its installed
    source with megatron-core's names as their stand-ins."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "utils" / "megatron_utils.py"
    tree = ast.parse(path.read_text())
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(f.name for f in fns) == sorted(names)
    scope: dict[str, Any] = {
        "torch": torch,
        "DDP": DDP,
        "ChainedOptimizer": ChainedOptimizer,
        "logger": logging.getLogger("verl"),
        "get_torch_device": lambda: SimpleNamespace(empty_cache=lambda: None),
        "get_device_id": lambda: "cpu",
        "get_global_memory_buffer": lambda: SimpleNamespace(buffer={}),
        "_clear_te_fp8_weight_workspaces": lambda chunk: 0,
    }
    exec(compile(ast.Module(body=fns, type_ignores=[]), str(path), "exec"), scope)
    return scope


def verl_offload() -> Any:
    """verl 0.9.1's `offload_megatron_model_to_cpu`, compiled from its installed source."""
    return _verl_functions("offload_megatron_model_to_cpu", "_can_safely_resize_storage")[
        "offload_megatron_model_to_cpu"
    ]


def test_verl_takes_the_fixs_host_copy_and_keeps_it() -> None:
    """verl's own allocation (`pin_memory=True`) cannot run without a GPU; with the fix's copy made
    first, verl's code runs to its end: it copies into that very tensor, frees the buffer, and on
    the next offload reuses it. A plain module (a reference model) and a buffer already offloaded
    are left to verl."""
    verl = verl_offload()
    with pytest.raises(RuntimeError, match="pin"):
        verl([DDP(Buffer(8))])
    made: list[torch.Tensor] = []

    def alloc(shape: Any, dtype: Any) -> torch.Tensor:
        made.append(torch.empty(shape, dtype=dtype))  # page_locked less its registration (a GPU's)
        return made[-1]

    fixed = make_offload(verl, alloc)
    assert fixed.__wrapped__ is verl  # type: ignore[attr-defined]
    buf = Buffer(1000)
    ref = torch.nn.Linear(3, 3)
    chunk = DDP(buf)
    assert ddp_buffers([chunk, ref]) == [buf]
    fixed([chunk, ref])
    assert len(made) == 1 and buf.param_data.cpu_data is made[0]  # type: ignore[attr-defined]
    assert made[0].shape == (1000,) and made[0].dtype == torch.bfloat16
    assert torch.equal(made[0], torch.arange(1000, dtype=torch.bfloat16))
    assert buf.param_data.untyped_storage().size() == 0 and buf.param_data_size == 1000  # type: ignore[attr-defined]
    fixed([chunk])  # offloaded already: verl's code skips it, and nothing new is made
    assert len(made) == 1
    # the next offload, after verl loads the buffer back: the same host copy, no new allocation
    buf.param_data.untyped_storage().resize_(1000 * 2)
    buf.param_data.copy_(torch.full((1000,), 3.0, dtype=torch.bfloat16))
    fixed([chunk])
    assert len(made) == 1 and torch.equal(made[0], torch.full((1000,), 3.0, dtype=torch.bfloat16))


def test_the_fix_patches_the_name_verl_calls() -> None:
    """verl's Megatron engine imports the function by name; the fix replaces that name."""
    engine = SimpleNamespace(offload_megatron_model_to_cpu=verl_offload())
    verl_fixes._patch_megatron_offload(engine)  # type: ignore[arg-type]
    assert engine.offload_megatron_model_to_cpu.__wrapped__ is verl_fixes.ORIGINALS["offload_megatron_model_to_cpu"]
    once = engine.offload_megatron_model_to_cpu
    verl_fixes._patch_megatron_offload(engine)  # type: ignore[arg-type]
    assert engine.offload_megatron_model_to_cpu is once
    module = FIXES[MEGATRON_PIN_FIX].module
    assert module == "verl.workers.engine.megatron.transformer_impl"
    engine.offload_megatron_optimizer = _verl_functions("offload_megatron_copy_params", "offload_megatron_optimizer")[
        "offload_megatron_optimizer"
    ]
    verl_fixes._patch_megatron_optimizer_offload(engine)  # type: ignore[arg-type]
    assert engine.offload_megatron_optimizer.__wrapped__ is verl_fixes.ORIGINALS["offload_megatron_optimizer"]
    assert FIXES[MEGATRON_OPT_PIN_FIX].module == module


class Adam:
    """An optimizer with Adam's per-parameter state, as megatron-core's distributed optimizer
    holds it under `optimizer.state`."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.state = {p: {"exp_avg": torch.full_like(p, 1.0), "exp_avg_sq": torch.full_like(p, 2.0)} for p in params}


def test_verl_keeps_the_fixs_optimizer_copies_from_offload_to_offload() -> None:
    """verl's own `offload_megatron_optimizer` and its load, with the fix: each fp32 shard and Adam
    state goes into a host copy of its own size made at its first offload, verl's `.to("cpu")`
    keeps it, verl's load takes the state back from it, and the next offload copies into the same
    copy: one allocation per tensor over two rounds, every value where it was."""
    verl = _verl_functions(
        "offload_megatron_copy_params",
        "offload_megatron_optimizer",
        "load_megatron_copy_params",
        "load_megatron_optimizer",
    )
    shards = [torch.nn.Parameter(torch.arange(6, dtype=torch.float32)), torch.nn.Parameter(torch.ones(3))]
    opt = SimpleNamespace(shard_fp32_from_float16_groups=[[shards[0]], [shards[1]]], optimizer=Adam(shards))
    made: list[torch.Tensor] = []

    def alloc(shape: Any, dtype: Any) -> torch.Tensor:
        made.append(torch.empty(shape, dtype=dtype))  # page_locked less its registration (a GPU's)
        return made[-1]

    offload = make_optimizer_offload(verl["offload_megatron_optimizer"], alloc)
    for step in range(2):
        offload(opt)
        assert len(made) == 6  # two shards, two moments each, made once
        homes = {t.data_ptr() for t in made}
        assert {p.data.data_ptr() for p in shards} <= homes
        assert {st[k].data_ptr() for st in opt.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")} <= homes
        verl["load_megatron_optimizer"](opt)  # verl's load; on a GPU `.to(device)` makes new tensors,
        for shard in shards:  # which this CPU stand-in makes by hand
            shard.data = shard.data.clone()
        for st in opt.optimizer.state.values():
            st.update({k: st[k].clone() for k in ("exp_avg", "exp_avg_sq")})
        assert torch.equal(shards[0].data, torch.arange(6, dtype=torch.float32) + step)
        for st in opt.optimizer.state.values():
            assert torch.equal(st["exp_avg"], torch.full_like(st["exp_avg"], 1.0 + step))
        shards[0].data += 1  # an update between the rounds
        for st in opt.optimizer.state.values():
            st["exp_avg"] += 1
    # a HybridDeviceOptimizer's states are left to verl
    hybrid = SimpleNamespace(
        shard_fp32_from_float16_groups=None, optimizer=SimpleNamespace(sub_optimizers=[], state={})
    )
    make_optimizer_offload(lambda o: o, alloc)(hybrid)
    assert len(made) == 6


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.gpu
def test_page_locked_copy_is_exact_where_verls_rounds_up() -> None:
    """A 640 MiB bf16 buffer: verl's `torch.empty(..., pin_memory=True)` grows the process by
    1024 MiB, the fix's copy by 640, and verl's offload copies a GPU buffer into it and back."""
    mib = 2**20
    n = 640 * mib // 2
    # the CUDA context and each path's first-use cost (the probe of 2026-12-02 saw about 100 MiB at
    # the first registration) come before the measurements
    torch.cuda.init()
    warm = [torch.empty(mib, dtype=torch.uint8, pin_memory=True), page_locked((mib,), torch.uint8)]
    assert all(w.is_pinned() for w in warm)
    before = _rss()
    rounded = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    grew_verl = _rss() - before
    before = _rss()
    exact = page_locked((n,), torch.bfloat16)
    grew_fix = _rss() - before
    assert rounded.is_pinned() and exact.is_pinned()
    assert grew_verl >= 1000 * mib, grew_verl / mib
    assert 630 * mib <= grew_fix <= 700 * mib, grew_fix / mib
    buf = Buffer(n, device="cuda")
    want = buf.param_data.clone()
    make_offload(verl_offload(), lambda shape, dtype: page_locked(shape, dtype))([DDP(buf)])
    host = buf.param_data.cpu_data  # type: ignore[attr-defined]
    assert host.is_pinned() and buf.param_data.untyped_storage().size() == 0
    back = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, want)


@pytest.mark.gpu
def test_optimizer_states_round_trip_through_page_locked_copies_on_the_gpu() -> None:
    """verl's optimizer offload and load on a GPU, with the fix: the states come home into
    page-locked copies of their own size (a 1792 MiB fc1-sized state would take 2048 in verl's
    blocks), go back to the GPU with their values, and the second offload reuses the copies."""
    verl = _verl_functions(
        "offload_megatron_copy_params",
        "offload_megatron_optimizer",
        "load_megatron_copy_params",
        "load_megatron_optimizer",
    )
    verl["get_device_id"] = lambda: torch.cuda.current_device()
    shards = [torch.nn.Parameter(torch.randn(3 * 2**20, device="cuda"))]
    opt = SimpleNamespace(shard_fp32_from_float16_groups=[shards], optimizer=Adam(shards))
    want = [shards[0].detach().clone(), *(v.clone() for v in opt.optimizer.state[shards[0]].values())]
    offload = make_optimizer_offload(verl["offload_megatron_optimizer"])
    for _ in range(2):
        offload(opt)
        state = opt.optimizer.state[shards[0]]
        host = [shards[0].data, state["exp_avg"], state["exp_avg_sq"]]
        assert all(t.device.type == "cpu" and t.is_pinned() for t in host)
        verl["load_megatron_optimizer"](opt)
        torch.cuda.synchronize()
        got = [shards[0].data, state["exp_avg"], state["exp_avg_sq"]]
        assert all(t.is_cuda for t in got) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
