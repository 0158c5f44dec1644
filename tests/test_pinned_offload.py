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
from verl_recipes.worker import verl_fixes
from verl_recipes.worker.pinned_offload import ddp_buffers, make_offload, page_locked


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


def verl_offload() -> Any:
    """verl 0.9.1's `offload_megatron_model_to_cpu`, compiled from its installed source."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "utils" / "megatron_utils.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "offload_megatron_model_to_cpu")
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_can_safely_resize_storage")
    module = ast.Module(body=[helper, fn], type_ignores=[])
    scope: dict[str, Any] = {
        "torch": torch,
        "DDP": DDP,
        "logger": logging.getLogger("verl"),
        "get_torch_device": lambda: SimpleNamespace(empty_cache=lambda: None),
        "_clear_te_fp8_weight_workspaces": lambda chunk: 0,
    }
    exec(compile(module, str(path), "exec"), scope)
    return scope["offload_megatron_model_to_cpu"]


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
    module, _ = verl_fixes.FIXES[verl_fixes.MEGATRON_PIN_FIX]
    assert module == "verl.workers.engine.megatron.transformer_impl"


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
