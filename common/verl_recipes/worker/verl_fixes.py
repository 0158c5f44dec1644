"""Runtime fixes for verl 0.9.1 bugs the recipes hit, applied without forking verl.

Each fix replaces one function or method at import time, inside every Ray worker (through the
hook in `verl_recipes.worker.hooks`), only when the installed verl is the version it was written for.
Each has a test that shows verl's failure without it and the fix working (tests/test_verl_fixes.py).
The fixes' names, numbers, the modules they patch and what going without each changes are one
table, `verl_recipes.fixes`; here is the code of each patch (`PATCHES`), numbered as there (3 in
that list is a configuration, not a patch).

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
4. `FSDPEngine._merged_lora_per_tensor_param` (the merged LoRA weight sync to vLLM) copies every
   base weight GPU -> pageable CPU as a restore point, merges the adapters into the live FSDP
   parameters, streams them, and copies the backup back (``merged_lora_context(...,
   backup_adapters=True)``). On one H200 with Llama-2-7B that is 12.55 GiB each way and about
   10 s of a 12 s sync; under FSDP2's CPU offload policy peft's merge itself runs on the CPU.
   The fix streams ``W + scaling * B @ A`` per tensor, out of place, on the GPU: the training
   parameters are never written, so there is nothing to back up or restore. It takes the same
   arithmetic as peft's merge (same dtypes, same order), so vLLM receives the same bytes. It
   covers plain LoRA ``Linear`` layers on FSDP2; anything else (DoRA, LoRA bias, FSDP1, LoRA on
   embeddings) goes to verl's own path.
5. `verl.utils.torch_functional.logprobs_from_logits_v2`, verl's log-probs wherever flash-attn's
   cross-entropy is absent (it has no PyPI wheel), loops in Python over the first dimension of the
   logits to bound memory. verl's FSDP engine hands it 2-D ``[tokens, vocab]`` logits, so the loop
   runs once per token: a log_softmax, a gather and their backward for each of the 4470 tokens of
   a 7B PPO step. In the H200 profile (results/h200x1-ppo-profile) the actor's update launched
   75,295 GPU kernels, busy 0.74 s of its 4.7 s, against 11,329 for the critic's update of the
   same tokens. The fix takes the same rows a chunk at a time (at most `LOGPROB_CHUNK_ELEMENTS`
   logits at once, so memory stays bounded): the same per-row arithmetic in the same dtype, a few
   dozen kernels instead of tens of thousands.
6. verl 0.9.1's engine path never hands the critic's engine the critic's batching keys
   (``critic.use_dynamic_bsz``, ``ppo_micro_batch_size_per_gpu``, ``forward_micro_batch_size_per_gpu``,
   ``ppo_max_token_len_per_gpu``): `trainer/ppo/v1/trainer_base.py` sets only its token budget,
   from ``ppo_infer_max_token_len_per_gpu`` (32768, not a key of verl's YAML), and the engine's
   ``use_dynamic_bsz`` defaults to true. So the critic takes up to 32768 tokens per micro-batch
   whatever its configuration says (the 7B profile: one micro-batch of 8 where the config says 2),
   which puts the 70B recipe's critic update over an 80 GB card. The fix copies the critic's own
   keys into its engine config when the critic's config is built.
7. `verl.trainer.main_ppo.run_ppo` starts the one-host Ray cluster with everything it sets as the
   job's runtime_env, so none of the workers Ray prestarts (one per CPU) can serve the job and each
   of the trainer's first actors waits about 2 s for a worker of its own; Ray's dashboard also
   starts, and ``ray.init`` waits for it. The fix (`verl_recipes.worker.ray_start`) puts the
   runtime_env's variables and setup hook in the driver's environment, which the raylet and every
   worker inherit, and starts Ray with no job runtime_env and without the dashboard. It applies in
   the driver only (`verl_recipes.worker.driver`, the launcher's entry point), and only where verl
   starts a local cluster; a cluster elsewhere (Slurm, ``RAY_ADDRESS``) keeps verl's runtime_env.

8. verl 0.9.1's padding-free path (``use_remove_padding``) hands the model every real token of a
   micro-batch as one row with ``position_ids`` restarting at each sequence, and relies on
   flash-attn's variable-length kernel (transformers' ``flash_attention_2``) to keep the sequences
   apart. flash-attn has no PyPI wheel, and with ``sdpa`` transformers 5.10 attends across the
   sequence boundaries without a word (tests/test_packed_attention.py shows it). The fix registers
   ``torch_varlen`` (`verl_recipes.worker.packed_attention`: torch's own variable-length kernel)
   with transformers wherever verl builds a model config, so ``override_config.attn_implementation:
   torch_varlen`` trains on real tokens only; the pre-flight refuses padding removal with ``sdpa``
   or ``eager``.

9. verl 0.9.1's v1 trainer waits for a step's rollout by polling TransferQueue from its
   ``ReplayBuffer``, sleeping ``poll_interval`` between looks, and builds it with the constructor's
   default, 2.0 s, which no config key reaches. So `gen` ends at the first 2-second tick after the
   last answer: on one H200 the 7B PPO step's answers were all in 2.55 s after `gen` began and
   `gen` took 4.07 s, the GRPO 8x8 batch's 6.07 s (every committed `gen` is 2k + 0.07 s;
   recipes/7b-lora/results/h200x1-ppo-4, its `gen_split` records). The fix polls every
   `REPLAY_POLL_S` in the synchronous trainer (one ``kv_list`` call to TransferQueue per look).

10. verl 0.9.1 offloads a Megatron model's weights into one pinned tensor per megatron-core DDP
   buffer, from torch's caching host allocator, which rounds it up to a power of two: 70b-3d's
   16.06 GiB actor buffer holds 32 GiB of the host on every rank, its critic's too on pipeline
   stage 0. The fix (`verl_recipes.worker.pinned_offload`) makes that tensor first, at exact size,
   page-locked in place with ``cudaHostRegister``; verl then copies into it as it does on every
   offload after its first (recipes/70b-3d/README.md, "verl 0.9.1 fixes").
11. The same rounding takes the Megatron optimizer's states, which verl 0.9.1 moves to the host
   with ``.to("cpu", non_blocking=True)`` at every offload (a pinned block per fp32 shard and Adam
   moment). The fix gives each state a page-locked host copy of its own size, made at its first
   offload and reused (`pinned_offload.make_optimizer_offload`).
12. `verl.utils.fsdp_utils.layered_summon_lora_params` (a LoRA adapter's sync to vLLM with
   ``rollout.layered_summon``) finds nothing under FSDP1, whose LoRA wrap policy makes every
   adapter leaf a unit of its own, and verl falls back to gathering the whole model into every
   rank's host memory on each sync (Qwen2.5-3B's rank of 2 on an H100: 11.5 GiB, in syncs of 19.9
   and 21.4 s within steps of 63.9 and 43.4 s); on one GPU (FSDP1 unsharded) that fallback raises instead. The fix
   (`verl_recipes.worker.layered_summon`) gathers the units that hold adapter tensors, one at a
   time, and hands verl the same tensors under the same names.

Fixes are registered with `verl_recipes.worker.import_hooks` and applied when verl imports the module
they patch, so processes that never load verl's FSDP engine do not pay for importing it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from verl_recipes.fixes import (
    ATTN_FIX,
    CRITIC_BATCHING_FIX,
    CRITIC_LORA_FIX,
    ENV_FIXES_OFF,
    FIXES,
    LAYERED_SUMMON_FIX,
    LOGPROBS_FIX,
    MEGATRON_OPT_PIN_FIX,
    MEGATRON_PIN_FIX,
    MERGE_FIX,
    PACKED_ATTN_FIX,
    RAY_START_FIX,
    REPLAY_POLL_FIX,
)
from verl_recipes.worker import layered_summon, packed_attention, pinned_offload, sync_probe
from verl_recipes.worker.import_hooks import after_import
from verl_recipes.worker.ray_start import RayLocalStart

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


def _variant(layer: Any, adapter: str) -> bool:
    """Whether an adapter is more than plain LoRA (DoRA and other peft variants, LoRA bias)."""
    return bool(
        getattr(layer, "use_dora", {}).get(adapter, False)
        or adapter in getattr(layer, "lora_variant", {})
        or getattr(layer, "lora_bias", {}).get(adapter, False)
    )


def _lora_delta(layer: Any, full: Callable[[Any], Any]) -> Any | None:
    """``scaling * B @ A`` of every active adapter of a plain LoRA Linear, as peft's merge computes
    it (fp32 on the CPU for half dtypes, the weights' dtype elsewhere); None if peft's own merge
    must do it (DoRA, LoRA bias, adapters turned off)."""
    import torch

    if getattr(layer, "disable_adapters", False) or getattr(layer, "merged", False):
        return None
    delta = None
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        if _variant(layer, name):
            return None
        a, b = full(layer.lora_A[name].weight), full(layer.lora_B[name].weight)
        dtype = b.dtype
        cast = b.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
        if cast:
            a, b = a.float(), b.float()
        d = b @ a
        if layer.fan_in_fan_out:
            d = d.T
        d = d * layer.scaling[name]
        if cast:
            d = d.to(dtype)
        delta = d if delta is None else delta + d
    return delta


def _plain_lora_layers(module: Any) -> dict[str, Any] | None:
    """State-dict key of each LoRA layer's base weight -> the layer; None if a layer is not one
    this fix handles (it then leaves the whole sync to verl)."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import Linear

    out = {}
    for name, m in module.named_modules():
        if not isinstance(m, LoraLayer):
            continue
        if type(m) is not Linear or any(_variant(m, a) for a in m.lora_A):
            return None
        out[f"{layered_summon.unwrapped(name)}.base_layer.weight"] = m
    return out


def _make_merged_lora_per_tensor_param(original: Any) -> Any:
    def _merged_lora_per_tensor_param(self: Any) -> Iterator[tuple[str, Any]]:
        import torch
        from torch.distributed.tensor import DTensor
        from verl.utils.device import get_device_id
        from verl.utils.fsdp_utils import fsdp_version, normalize_peft_param_name, offload_fsdp_model_to_cpu
        from verl.utils.model import convert_weight_keys

        module = self.module
        layers = _plain_lora_layers(module) if fsdp_version(module) == 2 else None
        if not layers:
            yield from original(self)
            return
        device = get_device_id()
        drop = sync_probe.next_sync_drops_adapter()

        def full(t: Any) -> Any:  # a whole tensor on this rank's GPU (a collective for DTensors)
            if isinstance(t, DTensor):
                return t.to(device, non_blocking=True).full_tensor()  # type: ignore[attr-defined,unused-ignore]  # torch-less mypy: Any
            return t.detach()

        peft_model = getattr(module, "_fsdp_wrapped_module", module)
        state = module.state_dict()
        # verl's own renaming (peft prefixes off, LoRA tensors dropped, HF checkpoint keys), applied
        # to the keys alone: out name -> state-dict key.
        names = convert_weight_keys(normalize_peft_param_name({k: k for k in state}), peft_model)
        if {layered_summon.unwrapped(k) for k in names.values()} & set(layers) != set(layers):
            # a LoRA layer whose base weight is not among the tensors sent: verl's path, loudly
            log.warning("verl_recipes: LoRA layers not matched to state-dict keys; verl's merged sync is used")
            yield from original(self)
            return
        try:
            with torch.no_grad():
                for out_name, key in names.items():
                    param = state[key]
                    weight = full(param)
                    layer = layers.get(layered_summon.unwrapped(key))
                    delta = None if layer is None or drop else _lora_delta(layer, full)
                    if delta is not None:
                        # peft's `weight.data += delta`: one rounding into the weight's dtype
                        weight = weight.clone().add_(delta)
                    elif not isinstance(param, DTensor):
                        weight = weight.clone()  # plain tensors alias module storage
                    if isinstance(param, DTensor):
                        weight = weight.to(torch.bfloat16, non_blocking=True)
                    yield out_name, weight
        finally:
            if self._is_offload_param:
                offload_fsdp_model_to_cpu(module)

    _merged_lora_per_tensor_param.__wrapped__ = original  # type: ignore[attr-defined]
    return _merged_lora_per_tensor_param


#: verl's own functions, kept when a fix replaces them (tests call them to show the bug).
ORIGINALS: dict[str, Any] = {}


#: logits one chunk of `logprobs_from_logits_chunked` takes at once: 2**26 elements is 128 MiB in
#: bf16 (2097 tokens of Llama-2's 32000 vocabulary), about two of the rows verl's own loop takes
#: when it is handed 3-D ``[batch, seq, vocab]`` logits of 1024 tokens.
LOGPROB_CHUNK_ELEMENTS = 1 << 26


def logprobs_from_logits_chunked(logits: Any, labels: Any) -> Any:
    """verl's `logprobs_from_logits_v2` with its rows taken a chunk at a time, not one at a time.

    Same arithmetic per row as verl's: log_softmax then gather in bf16/fp16 (verl avoids logsumexp
    there for stability), gather minus logsumexp in fp32/fp64. Autograd keeps the same tensors
    (each chunk's log_softmax output, as verl keeps each row's), so memory stays in the same class.
    """
    import torch
    import torch.nn.functional as F

    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1, 1)
    if flat.shape[0] == 0:
        return logits.new_zeros(labels.shape)
    rows = max(1, LOGPROB_CHUNK_ELEMENTS // max(vocab, 1))
    out = []
    for start in range(0, flat.shape[0], rows):
        chunk, lab = flat[start : start + rows], flat_labels[start : start + rows]
        if logits.dtype in (torch.float32, torch.float64):
            out.append(chunk.gather(-1, lab).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
        else:
            out.append(F.log_softmax(chunk, dim=-1).gather(-1, lab).squeeze(-1))
    return torch.cat(out).view(labels.shape)


def verl_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:
        return None


def _patch_model_loader(vmodel: ModuleType) -> None:
    if getattr(vmodel.load_valuehead_model, "__module__", "") != __name__:
        ORIGINALS["load_valuehead_model"] = vmodel.load_valuehead_model
        vmodel.load_valuehead_model = load_valuehead_model  # type: ignore[attr-defined]


def _patch_critic_lora(transformer_impl: ModuleType) -> None:
    engine = transformer_impl.FSDPEngine
    if not hasattr(engine._build_lora_module, "__wrapped__"):
        ORIGINALS["_build_lora_module"] = engine._build_lora_module
        fixed = _make_build_lora_module(engine._build_lora_module)
        # the sync test's non-zero adapter init, only where its variable is set (sync_probe)
        engine._build_lora_module = sync_probe.wrap_build_lora_module(fixed)  # type: ignore[method-assign,unused-ignore]


def _patch_merged_sync(transformer_impl: ModuleType) -> None:
    engine = transformer_impl.FSDPEngine
    if not hasattr(engine._merged_lora_per_tensor_param, "__wrapped__"):
        ORIGINALS["_merged_lora_per_tensor_param"] = engine._merged_lora_per_tensor_param
        engine._merged_lora_per_tensor_param = _make_merged_lora_per_tensor_param(  # type: ignore[method-assign,unused-ignore]
            engine._merged_lora_per_tensor_param
        )


def _make_critic_post_init(original: Any) -> Any:
    def __post_init__(self: Any) -> None:
        original(self)
        engine = self.engine
        if bool(self.use_dynamic_bsz):
            object.__setattr__(engine, "use_dynamic_bsz", True)
            # trainer_base copies ppo_infer_max_token_len_per_gpu into both of the engine's budgets
            budget = getattr(self, "forward_max_token_len_per_gpu", None) or self.ppo_max_token_len_per_gpu
            object.__setattr__(self, "ppo_infer_max_token_len_per_gpu", int(budget))
        elif self.ppo_micro_batch_size_per_gpu:
            micro = int(self.ppo_micro_batch_size_per_gpu)
            fwd = getattr(self, "forward_micro_batch_size_per_gpu", None) or self.ppo_infer_micro_batch_size_per_gpu
            object.__setattr__(engine, "use_dynamic_bsz", False)
            object.__setattr__(engine, "micro_batch_size_per_gpu", micro)
            object.__setattr__(engine, "infer_micro_batch_size_per_gpu", int(fwd or micro))

    __post_init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __post_init__


def _patch_critic_batching(critic_config: ModuleType) -> None:
    for name in ("FSDPCriticConfig", "McoreCriticConfig"):
        cls = getattr(critic_config, name)
        if not hasattr(cls.__post_init__, "__wrapped__"):
            ORIGINALS[f"{name}.__post_init__"] = cls.__post_init__
            cls.__post_init__ = _make_critic_post_init(cls.__post_init__)


def _patch_logprobs(torch_functional: ModuleType) -> None:
    # verl's logprobs_from_logits looks the function up in its module at each call
    if getattr(torch_functional.logprobs_from_logits_v2, "__module__", "") != __name__:
        ORIGINALS["logprobs_from_logits_v2"] = torch_functional.logprobs_from_logits_v2
        torch_functional.logprobs_from_logits_v2 = logprobs_from_logits_chunked  # type: ignore[attr-defined]


def _patch_packed_attention(model_config: ModuleType) -> None:

    packed_attention.register()


#: seconds between the synchronous trainer's looks for finished rollouts (verl 0.9.1: 2.0).
REPLAY_POLL_S = 0.05

#: verl 0.9.1's `ReplayBuffer.__init__` default for `poll_interval`.
_VERL_REPLAY_POLL_S = 2.0


def _make_replay_init(original: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self.trainer_mode == "sync" and self.poll_interval == _VERL_REPLAY_POLL_S:
            self.poll_interval = REPLAY_POLL_S

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _patch_replay_poll(replay_buffer: ModuleType) -> None:
    cls = replay_buffer.ReplayBuffer
    if not hasattr(cls.__init__, "__wrapped__"):
        ORIGINALS["ReplayBuffer.__init__"] = cls.__init__
        cls.__init__ = _make_replay_init(cls.__init__)


def _patch_megatron_offload(transformer_impl: ModuleType) -> None:

    # the engine module imported verl's function by name: the name there is the one it calls
    # (verl's own carries `__wrapped__` too, from torch.no_grad)
    if getattr(transformer_impl.offload_megatron_model_to_cpu, "__module__", "") != pinned_offload.__name__:
        ORIGINALS["offload_megatron_model_to_cpu"] = transformer_impl.offload_megatron_model_to_cpu
        transformer_impl.offload_megatron_model_to_cpu = pinned_offload.make_offload(  # type: ignore[attr-defined]
            transformer_impl.offload_megatron_model_to_cpu
        )


def _patch_megatron_optimizer_offload(transformer_impl: ModuleType) -> None:

    if getattr(transformer_impl.offload_megatron_optimizer, "__module__", "") != pinned_offload.__name__:
        ORIGINALS["offload_megatron_optimizer"] = transformer_impl.offload_megatron_optimizer
        transformer_impl.offload_megatron_optimizer = pinned_offload.make_optimizer_offload(  # type: ignore[attr-defined]
            transformer_impl.offload_megatron_optimizer
        )


def _patch_ray_start(main_ppo: ModuleType) -> None:

    if not isinstance(main_ppo.ray, RayLocalStart):
        ORIGINALS["main_ppo.ray"] = main_ppo.ray
        main_ppo.ray = RayLocalStart(main_ppo.ray)  # type: ignore[attr-defined]


def _patch_layered_summon(fsdp_utils: ModuleType) -> None:

    # collect_lora_params looks the function up in its module at each call
    if not hasattr(fsdp_utils.layered_summon_lora_params, "__wrapped__"):
        ORIGINALS["layered_summon_lora_params"] = fsdp_utils.layered_summon_lora_params
        fsdp_utils.layered_summon_lora_params = layered_summon.make_layered_summon(  # type: ignore[attr-defined]
            fsdp_utils.layered_summon_lora_params
        )


#: the patch of every fix of the table (`verl_recipes.fixes.FIXES`), by name; each is registered
#: for the verl module the table names
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    ATTN_FIX: _patch_model_loader,
    CRITIC_LORA_FIX: _patch_critic_lora,
    MERGE_FIX: _patch_merged_sync,
    LOGPROBS_FIX: _patch_logprobs,
    CRITIC_BATCHING_FIX: _patch_critic_batching,
    RAY_START_FIX: _patch_ray_start,
    PACKED_ATTN_FIX: _patch_packed_attention,
    REPLAY_POLL_FIX: _patch_replay_poll,
    MEGATRON_PIN_FIX: _patch_megatron_offload,
    MEGATRON_OPT_PIN_FIX: _patch_megatron_optimizer_offload,
    LAYERED_SUMMON_FIX: _patch_layered_summon,
}


def _guarded(name: str, patch: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def hook(mod: ModuleType) -> None:
        try:
            patch(mod)
        except Exception as e:  # a fix that cannot apply must not break verl's import
            log.warning("verl_recipes: fix %s not applied: %s", name, e)

    hook.__qualname__ = f"fix[{name}]"
    return hook


_GUARDED: dict[Callable[[ModuleType], None], Callable[[ModuleType], None]] = {}


def fixes_off() -> set[str]:
    return {x.strip() for x in os.environ.get(ENV_FIXES_OFF, "").split(",") if x.strip()}


def apply() -> list[str]:
    """Register every fix that matches the installed verl and is not turned off; return their names.

    Each is applied when verl imports its module (at once if it is imported already).
    """
    if verl_version() not in FIXED_VERL_VERSIONS:
        return []
    off = fixes_off()
    unknown = off - set(FIXES)
    if unknown:
        log.warning("verl_recipes: %s names no fix (%s)", ENV_FIXES_OFF, ", ".join(sorted(unknown)))
    applied = []
    for name, fix in FIXES.items():
        if name in off:
            continue
        patch = PATCHES[name]
        hook = _GUARDED.setdefault(patch, _guarded(name, patch))
        after_import(fix.module, hook)
        applied.append(name)
    return applied
