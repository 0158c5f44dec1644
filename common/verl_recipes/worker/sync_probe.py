"""Instruments for the weight-sync correctness test; inert unless their variables are set.

A sync to vLLM that sends nothing, or sends the base weights without the adapter, is invisible
on a random model whose adapter is still zero (peft initialises LoRA B to zero), and GRPO's
gradients are zero there too. The test (tests/test_gpu_sync.py) therefore needs:

- ``VERL_RECIPES_PROBE_LORA_B_STD``: the actor's LoRA B drawn from N(0, std) instead of zeros,
  with a fixed seed, so the merged policy differs clearly from the base from the first step;
- ``VERL_RECIPES_PROBE_DROP_ADAPTER_SYNCS``: comma-separated 0-based indices of this process's
  merged syncs that send the base weights without the adapter (the negative control: vLLM then
  samples from a policy the actor does not hold, and verl's rollout-vs-actor metrics must show it).

Sync 0 is the one before step 1, sync k the one at the end of step k (used by step k+1).
"""

from __future__ import annotations

import os
from typing import Any

ENV_LORA_B_STD = "VERL_RECIPES_PROBE_LORA_B_STD"
ENV_DROP_SYNCS = "VERL_RECIPES_PROBE_DROP_ADAPTER_SYNCS"
SEED = 1234

_syncs = 0


def drop_syncs() -> set[int]:
    raw = os.environ.get(ENV_DROP_SYNCS, "")
    return {int(x) for x in raw.split(",") if x.strip()}


def next_sync_drops_adapter() -> bool:
    """Count one merged sync in this process; whether it is one the control drops the adapter of."""
    global _syncs
    n, _syncs = _syncs, _syncs + 1
    return n in drop_syncs()


def init_lora_b(module: Any, std: float) -> int:
    """Fill every LoRA B weight of ``module`` from N(0, std) (seeded); returns how many tensors."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    n = 0
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std).to(p.dtype))
                n += 1
    return n


def wrap_build_lora_module(build: Any) -> Any:
    """verl's `_build_lora_module`, followed by the non-zero B init for the actor when asked."""
    std = os.environ.get(ENV_LORA_B_STD)
    if not std:
        return build

    def _build_lora_module(self: Any, module: Any) -> Any:
        out = build(self, module)
        if getattr(self.model_config, "model_type", None) != "value_model":
            init_lora_b(out, float(std))
        return out

    _build_lora_module.__wrapped__ = build  # type: ignore[attr-defined]
    return _build_lora_module
