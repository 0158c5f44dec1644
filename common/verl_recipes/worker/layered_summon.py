"""A LoRA adapter gathered one FSDP1 unit at a time, as verl's `rollout.layered_summon` means to.

verl 0.9.1's `layered_summon_lora_params` (verl/utils/fsdp_utils.py) visits each FSDP unit and
gathers the ones whose own parameters are named `lora_*`. Under FSDP1 two things keep it from
finding any. verl's LoRA wrap policy (`get_fsdp_wrap_policy(..., is_lora=True)`) makes every
trainable leaf, each `lora_A.default` / `lora_B.default` Linear, a unit of its own whose one
parameter is named `weight`; and with `use_orig_params: false` (verl's default) a unit's parameters
outside a summon are its flat parameter. So it returns nothing, and `collect_lora_params` falls back
to `FSDP.summon_full_params(module, offload_to_cpu=True)`: every rank copies the whole model, base
weights and all, to host memory on every sync (`verl_recipes.predict.host.adapter_full_gather`);
on one GPU, where FSDP1 keeps the model unsharded (NO_SHARD), torch refuses that summon and the
job stops at its first adapter sync.

Here a unit is chosen by the names of the parameters it holds itself (its flat parameter's, named
from the model's root; nested units hold their own), where PEFT's `get_peft_model_state_dict` would
keep any of them; it is summoned alone, and PEFT picks the adapter's tensors out under the names
the full summon gives them. Each unit's full tensors live on the device for the length of its summon only,
and the host receives the adapter alone. FSDP2 models go to verl's own function, which finds them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any


def unwrapped(name: str) -> str:
    """A module or state-dict name without the wrapper prefixes FSDP1 and activation
    checkpointing insert into module names (but not into state-dict keys)."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def _own_fqns(unit: Any) -> tuple[str, ...]:
    """The names of the parameters a unit holds itself (its flat parameter's), relative to the
    module it wraps: nested units hold their own."""
    handle = getattr(unit, "_handle", None)
    return tuple(handle.flat_param._fqns) if handle is not None else ()


def fsdp1_adapter(fsdp_module: Any) -> OrderedDict[str, Any]:
    """The adapter's tensors of an FSDP1-wrapped PEFT model, on the CPU, under the names
    `get_peft_model_state_dict` gives the whole model's (what verl's full summon returns)."""
    import torch
    from peft.utils.save_and_load import get_peft_model_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from verl.utils.device import get_torch_device
    from verl.utils.fsdp_utils import fsdp_version

    empty = torch.empty(0)  # a stand-in value, for asking PEFT which names it would pick
    peft_model = getattr(fsdp_module, "_fsdp_wrapped_module", fsdp_module)
    adapter: OrderedDict[str, Any] = OrderedDict()
    for name, unit in fsdp_module.named_modules():
        if fsdp_version(unit) != 1:
            continue
        prefix = unwrapped(name) + "." if name else ""
        own = {unwrapped(n) for n in _own_fqns(unit)}
        # what PEFT picks from these names decides, before anything is gathered
        if not own or not get_peft_model_state_dict(peft_model, state_dict={prefix + n: empty for n in own}):
            continue
        root = unit is fsdp_module
        unit._is_root = True  # summon this unit alone, as verl's own function does
        try:
            # recurse=False: nested units are summoned at their own visit, or not at all
            with FSDP.summon_full_params(unit, writeback=False, recurse=False):
                full = {prefix + unwrapped(n): p for n, p in unit.named_parameters() if unwrapped(n) in own}
                picked = get_peft_model_state_dict(peft_model, state_dict=full)
                adapter.update((k, v.detach().to("cpu", copy=True)) for k, v in picked.items())
        finally:
            unit._is_root = root
        get_torch_device().empty_cache()
    return adapter


def make_layered_summon(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """verl's `layered_summon_lora_params` with FSDP1 models taken by `fsdp1_adapter`."""

    def layered_summon_lora_params(fsdp_module: Any) -> Any:
        from verl.utils.fsdp_utils import fsdp_version

        if fsdp_version(fsdp_module) == 1:
            return fsdp1_adapter(fsdp_module)
        return original(fsdp_module)

    layered_summon_lora_params.__wrapped__ = original  # type: ignore[attr-defined]
    return layered_summon_lora_params
