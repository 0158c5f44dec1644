"""Padding-free attention on this GPU with torch alone: torch's own variable-length kernel
(`torch.nn.attention.varlen.varlen_attn`) against SDPA over the same sequences padded, at a
GRPO-like batch. It decides whether training on real tokens needs a flash-attn wheel: exactness
per sequence (bf16 against an fp32 reference), forward+backward time and peak memory.

usage: python3 varlen_attn.py OUT.json
"""

from __future__ import annotations

import inspect
import json
import sys
import time

import torch
import torch.nn.functional as F


def _cu(lengths: list[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _timed(fn, reps: int = 5) -> tuple[float, float]:
    """Median seconds of fn() and its peak allocated GiB (after one warm-up)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], (torch.cuda.max_memory_allocated() - base) / 1024**3


def _write(out: str, rec: dict) -> None:
    with open(out, "w") as f:
        json.dump(rec, f, indent=1)
    print(json.dumps(rec, indent=1))


def main(out: str) -> None:
    dev = torch.device("cuda")
    rec: dict = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as e:
        rec["varlen_attn"] = f"absent: {type(e).__name__}: {e}"
        _write(out, rec)
        return
    params = inspect.signature(varlen_attn).parameters
    rec["signature"] = str(inspect.signature(varlen_attn))
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    g = torch.Generator().manual_seed(0)
    cases = []
    # Llama-2-7B (32/32 heads) and Qwen2-7B (28/4 heads, GQA): 64 sequences of 200-1024 tokens.
    for name, hq, hkv in (("llama2-7b", 32, 32), ("qwen2-7b", 28, 4)):
        d = 128
        lengths = torch.randint(200, 1025, (64,), generator=g).tolist()
        total, longest = sum(lengths), max(lengths)
        q = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        cu = _cu(lengths, dev)
        kw = dict(causal)
        if hq != hkv and "enable_gqa" in params:
            kw["enable_gqa"] = True
        case: dict = {"model": name, "heads": hq, "kv_heads": hkv, "tokens": total, "padded_tokens": 64 * 1024}
        try:
            o = varlen_attn(q, k, v, cu, cu, longest, longest, **kw)
            # exactness: each sequence against fp32 causal SDPA of that sequence alone
            worst = 0.0
            for i in range(0, 64, 8):
                a, b = int(cu[i]), int(cu[i + 1])
                qi, ki, vi = (t[a:b].float().transpose(0, 1).unsqueeze(0) for t in (q, k, v))
                ref = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=hq != hkv)
                worst = max(worst, (o[a:b].float() - ref[0].transpose(0, 1)).abs().max().item())
            case["max_abs_err_vs_fp32"] = worst
            go = torch.randn_like(o)

            def run_varlen(q=q, k=k, v=v, cu=cu, n=longest, kw=kw, go=go) -> None:
                varlen_attn(q, k, v, cu, cu, n, n, **kw).backward(go)

            case["varlen_fwd_bwd_s"], case["varlen_peak_gib"] = _timed(run_varlen)
        except Exception as e:
            case["varlen_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        # the padded path the recipes run today: SDPA over [64, H, 1024, D] with a causal mask
        qp = torch.randn(64, hq, 1024, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        kp = torch.randn(64, hkv, 1024, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        vp = torch.randn(64, hkv, 1024, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        gp = torch.randn(64, hq, 1024, d, device=dev, dtype=torch.bfloat16)

        def run_padded(qp=qp, kp=kp, vp=vp, gp=gp, gqa=hq != hkv) -> None:
            F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=gqa).backward(gp)

        case["padded_sdpa_fwd_bwd_s"], case["padded_peak_gib"] = _timed(run_padded)
        cases.append(case)
        del q, k, v, qp, kp, vp, gp
        torch.cuda.empty_cache()
    rec["cases"] = cases
    _write(out, rec)


if __name__ == "__main__":
    main(sys.argv[1])
