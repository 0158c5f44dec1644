"""Actor, critic and reference as engines with one interface: DeepSpeed ZeRO-3, or plain torch.

The seed's DeepSpeed side is "ZeRO-3 + gradient checkpointing + bf16, actor and critic initialised
separately": here each trained model is its own `deepspeed.initialize` engine with its own
optimizer, and the frozen reference is a ZeRO-3 engine without an optimizer (its bf16 weights are
sharded like the others'). `TorchEngine` has the same interface over a plain module and
optimizer; it exists so the CPU tests can run the whole loop without DeepSpeed and is never used
for a measurement.

Choices, and why:
- Critic = `AutoModelForTokenClassification(num_labels=1)` on the same checkpoint (the decoder
  body plus a fresh 1-output `score` head, dropout 0): the architecture verl 0.9.1's critic loads
  (`verl.utils.model.load_valuehead_model`), so both sides train the same critic.
- Optimizer = `torch.optim.AdamW` passed to `deepspeed.initialize`, not DeepSpeed's FusedAdam:
  FusedAdam is a CUDA extension compiled at first use (minutes, and only where nvcc exists), and
  verl's FSDP side uses torch's AdamW too. Hyper-parameters are verl's defaults (losses.PPOHyper).
- `backward(loss)` never divides by the accumulation steps: the losses are already normalised
  over the global mini-batch, as verl's are (see losses.py).
- Gradient checkpointing uses HF's non-reentrant checkpoint by default: ZeRO-3's pre-forward hooks
  gather the weights again in the recompute. Its known failure (CheckpointError "recomputed
  shape [0]", DeepSpeed PR #8148) needs frozen parameters inside a checkpointed layer, which a full
  fine-tune has not; `--grad-ckpt reentrant` is the fallback should it appear.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

DS_CONFIG = Path(__file__).resolve().parent.parent / "ds_config.json"


class Engine(Protocol):
    """What the PPO loop needs from a model: call, and for trained models backward/step."""

    module: nn.Module

    def __call__(self, **inputs: Any) -> Any: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self) -> None: ...
    def train(self) -> None: ...
    def eval(self) -> None: ...
    @property
    def grad_norm(self) -> float | None: ...


class TorchEngine:
    """A plain module + AdamW with DeepSpeed's accumulation semantics (CPU tests only).

    `step()` is called after every micro-batch, as with DeepSpeed; the optimizer steps (after
    clipping to `grad_clip`) only on every `accumulation_steps`-th call.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        accumulation_steps: int = 1,
        grad_clip: float = 1.0,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.grad_clip = grad_clip
        self._micro = 0
        self._grad_norm: float | None = None

    def __call__(self, **inputs: Any) -> Any:
        return self.module(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        assert self.optimizer is not None, "a frozen engine has no step"
        self._micro += 1
        if self._micro % self.accumulation_steps == 0:
            norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
            self._grad_norm = float(norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    @property
    def grad_norm(self) -> float | None:
        return self._grad_norm


class DeepSpeedEngine:
    """A `deepspeed.initialize` engine behind the Engine interface."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.module = engine.module

    def __call__(self, **inputs: Any) -> Any:
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> None:
        self.engine.step()

    def train(self) -> None:
        self.engine.train()

    def eval(self) -> None:
        self.engine.eval()

    @property
    def grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)


def ds_config(base: dict[str, Any], micro_per_gpu: int, accumulation_steps: int, world: int) -> dict[str, Any]:
    """The base ZeRO-3 config with the batch sizes DeepSpeed checks filled in."""
    cfg = copy.deepcopy(base)
    cfg["train_micro_batch_size_per_gpu"] = micro_per_gpu
    cfg["gradient_accumulation_steps"] = accumulation_steps
    cfg["train_batch_size"] = micro_per_gpu * accumulation_steps * world
    return cfg


def load_ds_config(path: str | Path | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(Path(path or DS_CONFIG).read_text())
    return cfg


GRAD_CKPT = ("non-reentrant", "reentrant", "off")


def _checkpointing(model: Any, mode: str) -> None:
    if mode not in GRAD_CKPT:
        raise ValueError(f"gradient checkpointing {mode!r}: use one of {', '.join(GRAD_CKPT)}")
    if mode != "off":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode == "reentrant"})


def load_actor(model_dir: str, dtype: torch.dtype, grad_ckpt: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    _checkpointing(model, grad_ckpt)
    return model


def load_critic(model_dir: str, dtype: torch.dtype, grad_ckpt: str) -> nn.Module:
    """Token classifier with one label and no dropout, as verl's critic (see module docstring)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(model_dir, num_labels=1, classifier_dropout=0.0)
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, config=config, dtype=dtype, attn_implementation="sdpa"
    )
    _checkpointing(model, grad_ckpt)
    return model


def load_ref(model_dir: str, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    model.requires_grad_(False)
    return model.eval()


def adamw(module: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    return torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)


def deepspeed_trained(
    module: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], config: dict[str, Any]
) -> DeepSpeedEngine:
    """A ZeRO-3 training engine: DeepSpeed moves the module to the GPU and shards it."""
    import deepspeed

    engine, *_ = deepspeed.initialize(model=module, optimizer=adamw(module, lr, weight_decay, betas), config=config)
    return DeepSpeedEngine(engine)


def deepspeed_frozen(module: nn.Module, config: dict[str, Any]) -> DeepSpeedEngine:
    """A ZeRO-3 inference engine (no optimizer): sharded bf16 weights, gathered per forward."""
    import deepspeed

    engine, *_ = deepspeed.initialize(model=module, config=config)
    engine.eval()
    return DeepSpeedEngine(engine)
