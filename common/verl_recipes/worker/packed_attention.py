"""Attention over packed sequences without flash-attn: torch's own variable-length kernel.

verl's ``use_remove_padding`` path hands the model one row (batch 1) holding every real token of
a micro-batch, with ``position_ids`` that restart at 0 for each sequence. ``torch_varlen``, the
transformers attention implementation registered here, recovers the sequence boundaries from those
position ids and calls ``torch.nn.attention.varlen.varlen_attn`` (causal via
``window_size=(-1, 0)``) on CUDA. Off CUDA that kernel does not run (torch 2.13 CPU raises
NotImplementedError for ``aten::_flash_attention_forward``), so the same segments go through
per-sequence causal SDPA instead: the CPU tests exercise the real segmentation.

Neither kernel soft-caps attention logits (Gemma 2's `attn_logit_softcapping`) or masks a sliding
window, so a layer that asks for either is refused by name rather than computed wrongly; a window
longer than every packed sequence changes nothing and passes.

Runs inside verl's Ray workers; imports torch and transformers only when called.
"""

from __future__ import annotations

import itertools
from typing import Any

NAME = "torch_varlen"


def cu_seqlens(position_ids: Any) -> tuple[Any, int]:
    """Cumulative sequence starts (int32, with the total at the end) and the longest length.

    A sequence starts wherever the position id is 0 (and at index 0).
    """
    import torch

    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    total = starts.new_tensor([pos.numel()])
    cu = torch.cat([starts, total]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def _repeat_kv(x: Any, n_heads: int) -> Any:
    """[kv_heads, tokens, dim] -> [n_heads, tokens, dim] (grouped-query attention)."""
    rep = n_heads // x.shape[0]
    return x if rep == 1 else x.repeat_interleave(rep, dim=0)


def varlen_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers attention interface: q/k/v [1, heads, tokens, dim] -> [1, tokens, heads, dim]."""
    import torch
    import torch.nn.functional as F

    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError(f"{NAME} needs position_ids (verl's use_remove_padding path passes them)")
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} takes packed sequences (batch 1), got batch {query.shape[0]}")
    cu, max_len = cu_seqlens(position_ids.to(query.device))
    if kwargs.get("softcap") is not None:
        raise ValueError(
            f"{NAME} has no attention-logit soft-capping ({type(module).__name__} asks for "
            f"{kwargs['softcap']}); use flash_attention_2 or actor_rollout_ref.model.use_remove_padding=False"
        )
    window = kwargs.get("sliding_window")
    if window is not None and max_len > int(window):
        raise ValueError(
            f"{NAME} has no sliding window ({type(module).__name__} asks for {window} tokens, a packed "
            f"sequence has {max_len}); use flash_attention_2 or shorter sequences"
        )
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [tokens, heads, dim]
    if query.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scaling, window_size=(-1, 0))
        assert isinstance(out, torch.Tensor)  # a tuple only with return_aux
        return out.unsqueeze(0), None
    parts = []
    bounds = cu.tolist()
    for a, b in itertools.pairwise(bounds):
        qs = q[a:b].transpose(0, 1)
        ks = _repeat_kv(k[a:b].transpose(0, 1), qs.shape[0])
        vs = _repeat_kv(v[a:b].transpose(0, 1), qs.shape[0])
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling)
        parts.append(o.transpose(0, 1))
    return torch.cat(parts).unsqueeze(0), None


def register() -> None:
    """Make ``attn_implementation: torch_varlen`` known to transformers in this process."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
