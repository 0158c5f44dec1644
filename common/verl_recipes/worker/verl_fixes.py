"""Runtime fixes for verl 0.9.1 bugs the recipes hit, applied without forking verl.

Each fix replaces one function or method at import time, inside every Ray worker (through the
hook in `verl_recipes.worker.hooks`), only when the installed verl is the version it was written for.
Each has a test that shows verl's failure without it and the fix working (tests/test_verl_fixes.py).

1. `verl.utils.model.load_valuehead_model` passes ``attn_implementation="flash_attention_2"``
   to ``from_pretrained`` whatever the config says. flash-attn has no PyPI wheel, so the PPO
   critic cannot load where it is not built from source. The fix uses the attention the model
   config asks for (``override_config.attn_implementation``, which verl puts on the HF config),
   defaulting to sdpa.
2. `FSDPEngine._build_lora_module` wraps every model as ``TaskType.CAUSAL_LM``. For the critic
   (a ``*ForTokenClassification`` value model) PEFT then fails with
   ``'LlamaForTokenClassification' object has no attribute 'prepare_inputs_for_generation'``.
   The fix wraps value models as ``TaskType.TOKEN_CLS``, which also keeps the value head
   (``score``) trainable through PEFT's ``modules_to_save``.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: names of the value head in HF *ForTokenClassification models.
VALUE_HEAD_NAMES = ("score", "classifier")

#: verl versions these fixes were written against; other versions are left alone.
FIXED_VERL_VERSIONS = ("0.9.1",)


def _attn_from_config(model_config: Any) -> str:
    attn = getattr(model_config, "_attn_implementation", None) or getattr(model_config, "attn_implementation", None)
    if attn in (None, "flash_attention_2", "flash_attention_3"):
        try:
            import flash_attn  # noqa: F401

            return attn or "flash_attention_2"
        except ImportError:
            return "sdpa"
    return str(attn)


def load_valuehead_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
    """verl's value-model loader, with the attention implementation taken from the config."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        pretrained_model_name_or_path=local_path,
        torch_dtype=torch_dtype,
        config=model_config,
        attn_implementation=_attn_from_config(model_config),
        trust_remote_code=trust_remote_code,
    )


def _make_build_lora_module(original: Any) -> Any:
    def _build_lora_module(self: Any, module: Any) -> Any:
        if getattr(self.model_config, "model_type", None) != "value_model" or getattr(
            self.model_config, "lora_adapter_path", None
        ):
            return original(self, module)
        from peft import LoraConfig, TaskType, get_peft_model
        from verl.utils.py_functional import convert_to_regular_types

        module.enable_input_require_grads()
        # The value head trains in full through modules_to_save; it must not also get LoRA
        # (PEFT refuses modules_to_save on a LoRA layer, and "all-linear" would pick it).
        exclude = convert_to_regular_types(self.model_config.exclude_modules)
        if exclude is None or isinstance(exclude, (list, tuple)):
            exclude = [*(exclude or []), *VALUE_HEAD_NAMES]
        lora_config = LoraConfig(
            task_type=TaskType.TOKEN_CLS,
            r=self.model_config.lora_rank,
            lora_alpha=self.model_config.lora_alpha,
            target_modules=convert_to_regular_types(self.model_config.target_modules),
            exclude_modules=exclude,
            bias="none",
        )
        module = get_peft_model(module, lora_config)
        # FSDP flat groups need one dtype: follow the frozen base weights, as verl does.
        base_dtype = next((p.dtype for p in module.parameters() if not p.requires_grad), None)
        if base_dtype is not None:
            for p in module.parameters():
                if p.requires_grad and p.dtype != base_dtype:
                    p.data = p.data.to(base_dtype)
        return module

    _build_lora_module.__wrapped__ = original  # type: ignore[attr-defined]
    return _build_lora_module


#: verl's own functions, kept when a fix replaces them (tests call them to show the bug).
ORIGINALS: dict[str, Any] = {}


def verl_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:
        return None


def apply() -> list[str]:
    """Apply every fix that matches the installed verl; return the names applied."""
    if verl_version() not in FIXED_VERL_VERSIONS:
        return []
    applied = []
    import verl.utils.model as vmodel

    if getattr(vmodel.load_valuehead_model, "__module__", "") != __name__:
        ORIGINALS["load_valuehead_model"] = vmodel.load_valuehead_model
        vmodel.load_valuehead_model = load_valuehead_model
    applied.append("critic-attn-implementation")
    try:
        from verl.workers.engine.fsdp import transformer_impl
    except Exception as e:  # needs a CUDA-capable torch build; report and go on
        log.warning("verl_recipes: critic LoRA fix not applied: %s", e)
        return applied
    engine = transformer_impl.FSDPEngine
    if not hasattr(engine._build_lora_module, "__wrapped__"):
        ORIGINALS["_build_lora_module"] = engine._build_lora_module
        engine._build_lora_module = _make_build_lora_module(engine._build_lora_module)  # type: ignore[method-assign,unused-ignore]
    applied.append("critic-lora-token-cls")
    return applied
