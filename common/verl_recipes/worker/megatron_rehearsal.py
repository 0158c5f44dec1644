"""Rank rehearsal on verl's Megatron backend: one GPU runs rank R of a TP x PP x DP job.

`rank_rehearsal` gives verl's training worker a fake process group of the job's N GPUs. On the
Megatron path (verl 0.9.1's ``workers/engine/megatron/transformer_impl.py`` with megatron-core
0.19.2 and Megatron-Bridge 0.6.2) four more things stand between that group and a step, and
each has its patch here, registered through `import_hooks.after_import` only when the rehearsal
is asked for:

- Megatron's parallel state makes a gloo twin of every group by default, and gloo cannot be
  made over the fake group's store (`initialize_model_parallel`); its optimizer then must not
  ask for them (`get_megatron_optimizer`).
- The weights come from the HF checkpoint through the Bridge; at 70B widths the checkpoint is
  written without weights, so Megatron's own initialisation stands (`load_hf_weights`).
- verl runs the pipeline schedule with ``variable_seq_lengths``: each stage learns the shape it
  receives from its neighbour, which under the fake group sends nothing (`P2PCommunicator`).
- Only the last stage's first TP rank answers the driver; a rehearsed rank must answer for its
  pipeline whatever its stage (`MegatronEngine`).

Megatron orders ranks ``tp-cp-ep-dp-pp`` (TP fastest, PP slowest); `layout.MegatronLayout` says which
rank holds which coordinates, and which ranks are worth rehearsing: the first of stage 0
(embedding) and the first of the last stage (output layer, loss, logits).
"""

from __future__ import annotations

import importlib
from collections import deque
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError
from verl_recipes.worker.import_hooks import after_import, replacing

# --- the worker side --------------------------------------------------------------------------


def _make_init_model_parallel(original: Any) -> Any:
    def initialize_model_parallel(*args: Any, **kwargs: Any) -> Any:
        # megatron-core 0.19.2 defaults create_gloo_process_groups to True; verl 0.9.1 does not
        # pass it. A gloo group needs a real store and every member at its rendezvous; over the
        # fake group's store torch refuses to make one ("ProcessGroupGloo ... Not implemented").
        # verl's Megatron path uses none of the gloo twins on a GPU.
        kwargs["create_gloo_process_groups"] = False
        return original(*args, **kwargs)

    initialize_model_parallel.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize_model_parallel


def _make_get_optimizer(original: Any) -> Any:
    def get_megatron_optimizer(*args: Any, **kwargs: Any) -> Any:
        # The parallel state has no gloo groups (`_make_init_model_parallel`), and megatron-core
        # 0.19.2's optimizer fetches the gloo data-parallel group by default, which then asserts
        # it was never initialised; verl 0.9.1 passes only the config and the model. The gloo
        # group serves the distributed optimizer's checkpoint of its state, which a rehearsal
        # does not write.
        kwargs["use_gloo_process_groups"] = False
        return original(*args, **kwargs)

    get_megatron_optimizer.__wrapped__ = original  # type: ignore[attr-defined]
    return get_megatron_optimizer


def _rebind(source: str, name: str, alias: str) -> Any:
    """An import hook for a module that bound `source.name` as `alias` when it was imported."""

    def rebind(mod: Any) -> None:

        patched = getattr(importlib.import_module(source), name)
        if getattr(mod, alias, None) is not patched:
            setattr(mod, alias, patched)

    return rebind


def has_weights(path: Any) -> bool:
    """Whether the HF checkpoint folder `path` holds weight files (safetensors or torch bins)."""
    folder = Path(path)
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def _make_load_hf_weights(original: Any) -> Any:
    def load_hf_weights(self: Any, model: Any, hf_path: Any = None, *args: Any, **kwargs: Any) -> Any:
        # verl builds the provider with load_weights=False, so Megatron has initialised every
        # parameter when it built the model; this call would overwrite them from the checkpoint.
        # A rehearsal at 70B widths writes none (`synth-model --no-weights`: the checkpoint would
        # not fit the host's disk), so Megatron's initialisation stands; a checkpoint with
        # weights is loaded as verl loads it.
        if hf_path is not None and not has_weights(hf_path):
            return None
        return original(self, model, hf_path, *args, **kwargs)

    load_hf_weights.__wrapped__ = original  # type: ignore[attr-defined]
    return load_hf_weights


class ShapeSupplier:
    """The tensor shapes a pipeline neighbour would have sent, for one process.

    With ``variable_seq_lengths`` megatron-core's ``P2PCommunicator._communicate_shapes`` receives
    a [3] shape before each activation or gradient; under the fake group the receive is a no-op
    and the shape is whatever ``torch.empty`` held. The two directions are supplied so:

    - a gradient from the next stage has the shape of the activation this rank sent it for the
      same micro-batch; 1F1B runs backward in forward order, so the shapes sent forward are
      queued and each gradient received takes the oldest (the queue starts empty with each of
      verl's schedules, `_make_forward_backward_batch`);
    - an activation from the previous stage has the shape of this rank's own micro-batch at the
      decoder's input, known only once the model sees that micro-batch: it is received empty
      and sized there (`activation_shape`, `size_placeholder`).
    """

    def __init__(self) -> None:
        self.sent: deque[list[int]] = deque()

    def shapes(self, tensor_send_next: Any, recv_prev: bool, recv_next: bool) -> tuple[list[int], list[int]]:
        if tensor_send_next is not None:
            self.sent.append(list(tensor_send_next.shape))
        prev = [0, 0, 0]  # sized by the model on first use
        nxt = self.sent.popleft() if recv_next else [0, 0, 0]
        return prev, nxt


_SUPPLIER = ShapeSupplier()


def _make_communicate_shapes(original: Any) -> Any:
    def _communicate_shapes(
        self: Any, tensor_send_next: Any, tensor_send_prev: Any, recv_prev: bool, recv_next: bool
    ) -> tuple[list[int], list[int]]:
        return _SUPPLIER.shapes(tensor_send_next, recv_prev, recv_next)

    _communicate_shapes.__wrapped__ = original  # type: ignore[attr-defined]
    return _communicate_shapes


def _make_communicate(original: Any) -> Any:
    def _communicate(self: Any, **kwargs: Any) -> Any:
        # megatron-core allocates receive buffers with torch.empty; nothing is received into them
        # under the fake group, so they are zeroed: no NaN or stale memory flows into the stage.
        import torch

        recv_prev, recv_next, reqs = original(self, **kwargs)
        with torch.no_grad():
            for t in (recv_prev, recv_next):
                if t is not None:
                    t.zero_()
        return recv_prev, recv_next, reqs

    _communicate.__wrapped__ = original  # type: ignore[attr-defined]
    return _communicate


def activation_shape(
    hidden: int,
    tp: int,
    sequence_parallel: bool,
    cp: int = 1,
    input_ids: Any = None,
    position_ids: Any = None,
    packed_seq_params: Any = None,
) -> list[int]:
    """[seq, micro-batch, hidden] of the hidden states the previous stage sends for this
    micro-batch, from what verl passes every stage's GPTModel.

    THD (packed) micro-batches are one sequence of all tokens, padded per sequence by verl
    (``preprocess_packed_seqs``): its length is the last padded cumulative length, 1/CP of it per
    context-parallel rank. BSHD micro-batches are [batch, seq] (verl's ``preprocess_bshd`` pads the
    sequence to a multiple of TP). Sequence parallelism splits the sequence over the TP ranks.
    """
    if packed_seq_params is not None:
        cu = getattr(packed_seq_params, "cu_seqlens_q_padded", None)
        if cu is None:
            cu = packed_seq_params.cu_seqlens_q
        seq, batch = int(cu[-1]) // cp, 1
    else:
        ref = position_ids if position_ids is not None else input_ids
        if ref is None:
            raise RecipeError("a pipeline stage got neither input ids, position ids nor packed sequences")
        batch, seq = int(ref.shape[0]), int(ref.shape[-1])
    if sequence_parallel:
        seq //= tp
    return [seq, batch, hidden]


def size_placeholder(tensor: Any, shape: list[int]) -> None:
    """Give the empty received activation `tensor` zero-filled storage of `shape`, in place: the
    schedule keeps this very object to read its gradient and send it back a stage."""
    import torch

    if tensor is not None and tensor.numel() == 0 and list(tensor.shape) != shape:
        tensor.data = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)


def _make_gpt_forward(original: Any) -> Any:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        decoder = getattr(self, "decoder", None)
        received = getattr(decoder, "input_tensor", None)
        if not self.pre_process and received is not None and received.numel() == 0:
            cfg = self.config
            names = ("input_ids", "position_ids", "attention_mask")
            given = {**dict(zip(names, args, strict=False)), **kwargs}
            shape = activation_shape(
                cfg.hidden_size,
                cfg.tensor_model_parallel_size,
                bool(cfg.sequence_parallel),
                cfg.context_parallel_size,
                given.get("input_ids"),
                given.get("position_ids"),
                given.get("packed_seq_params"),
            )
            size_placeholder(received, shape)
        return original(self, *args, **kwargs)

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward


def stand_in_outputs(ids: Any, is_value_model: bool, entropy: bool = False) -> dict[str, Any]:
    """What the last stage returns for a batch of `ids`, zero-filled, for a rank on an earlier stage.

    verl's driver reads per-token log-probs (and entropy when asked) from the actor and values
    from the critic, shaped as the batch's ``input_ids`` (nested, one row per sequence). A rank
    on an earlier stage computes none of them; in the real job the last stage's TP rank 0
    answers for the whole pipeline. Zeros of the same shapes let the driver's step go on."""
    import torch

    keys = ["values"] if is_value_model else ["log_probs", *(["entropy"] if entropy else [])]
    out: dict[str, Any] = {}
    for key in keys:
        if getattr(ids, "is_nested", False):
            zeros = torch.zeros(ids.values().shape, dtype=torch.float32, device=ids.device)
            out[key] = torch.nested.nested_tensor_from_jagged(zeros, offsets=ids.offsets())
        else:
            out[key] = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    return {"model_output": out, "loss": [], "metrics": {}}


def _make_forward_backward_batch(original: Any) -> Any:
    def forward_backward_batch(self: Any, data: Any, loss_function: Any, forward_only: bool = False) -> Any:
        # one pipeline schedule per call: a forward-only one sends activations whose gradients
        # never come back, and their shapes must not stand for the next schedule's
        _SUPPLIER.sent.clear()
        out = original(self, data, loss_function, forward_only=forward_only)
        if not out:  # not the last pipeline stage
            from verl.utils import tensordict_utils as tu

            entropy = bool(tu.get_non_tensor_data(data, key="calculate_entropy", default=False))
            out = stand_in_outputs(data["input_ids"], bool(getattr(self, "is_value_model", False)), entropy)
        return out

    forward_backward_batch.__wrapped__ = original  # type: ignore[attr-defined]
    return forward_backward_batch


def _make_is_src_rank(original: Any) -> Any:
    def is_mp_src_rank_with_outputs(self: Any) -> bool:
        # The one worker of a rehearsal answers the driver for its whole pipeline.
        return True

    is_mp_src_rank_with_outputs.__wrapped__ = original  # type: ignore[attr-defined]
    return is_mp_src_rank_with_outputs


#: (module, attribute, patch maker): every patch this module applies, for the tests to check
#: against the pinned sources.
_P2P = "megatron.core.pipeline_parallel.p2p_communication"
_ENGINE = "verl.workers.engine.megatron.transformer_impl"
PATCHES: tuple[tuple[str, str, Any], ...] = (
    ("megatron.core.parallel_state", "initialize_model_parallel", _make_init_model_parallel),
    ("megatron.core.optimizer", "get_megatron_optimizer", _make_get_optimizer),
    ("megatron.bridge.models.conversion.auto_bridge", "AutoBridge.load_hf_weights", _make_load_hf_weights),
    (_P2P, "P2PCommunicator._communicate_shapes", _make_communicate_shapes),
    (_P2P, "P2PCommunicator._communicate", _make_communicate),
    ("megatron.core.models.gpt.gpt_model", "GPTModel.forward", _make_gpt_forward),
    (_ENGINE, "MegatronEngine.forward_backward_batch", _make_forward_backward_batch),
    (_ENGINE, "MegatronEngine.is_mp_src_rank_with_outputs", _make_is_src_rank),
)


def apply() -> None:
    """Register the Megatron patches; each takes effect when its module is imported."""
    for module, name, make in PATCHES:
        after_import(module, replacing(name, make))
    # verl imports megatron-core's optimizer factory by name, as get_megatron_optimizer_native
    after_import(
        "verl.utils.megatron.optimizer",
        _rebind("megatron.core.optimizer", "get_megatron_optimizer", "get_megatron_optimizer_native"),
    )
