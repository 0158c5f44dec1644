"""What verl's log-prob and entropy take on the GPU per (token x vocabulary) element.

    python3 gpu/probes/logits_autocast.py OUT.json     (on a GPU host, torch only; about 20 s)

Why: the planner counts the logits of a forward that computes log-probs and entropy at
`Constants.logits_fwd_bytes` bytes per element and an update's at `logits_train_bytes`. Judged at
the tokens the committed runs held, old_log_prob reads 12-15 bytes per element, not the 6 of
"bf16 logits + one fp32 copy". verl 0.9.1's FSDP engine runs `prepare_model_outputs` inside the
forward's `torch.autocast(bfloat16)` (verl/workers/engine/fsdp/transformer_impl.py `forward_step`),
where softmax, log_softmax and the reductions are fp32 ops: each makes an fp32 copy of the bf16
logits. This replays, in one process, the sequence of tensor operations verl runs on the logits
(`entropy_from_logits`, the narrow-and-cat to the unpadded rows, `logprobs_from_logits_v2`'s bf16
row loop; flash-attn's cross-entropy is not installed, so that is the path) from the lm_head's
output on, with and without the autocast, and records the allocator's peak above what was held
before, per element of the padded logits.

Modes: `old_log_prob` (entropy and log-probs, no grad), `ref` (log-probs only, no grad), `update`
(log-probs with grad, then backward through the lm_head), each `autocast` or `plain` (the control).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

# (rows, padded length, hidden, vocabulary): a 13b-fsdp rank's micro-batch (Llama, 4 x 1075) and a
# verl-vs-deepspeed one (Qwen2-7B, 8 x 1024)
SHAPES = [(4, 1075, 5120, 32000), (8, 1024, 3584, 152064), (4, 564, 3584, 152064)]


def _entropy(logits: Any) -> Any:
    """verl.utils.torch_functional.entropy_from_logits, as 0.9.1 writes it."""
    import torch

    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def _logprobs_rows(logits: Any, labels: Any) -> Any:
    """verl.utils.torch_functional.logprobs_from_logits_v2's bf16 branch (a row at a time)."""
    import torch
    import torch.nn.functional as F

    out = []
    for row, lab in zip(logits, labels, strict=True):
        out.append(F.log_softmax(row, dim=-1).gather(dim=-1, index=lab.unsqueeze(-1)).squeeze(-1))
    return torch.stack(out)


def _outputs(logits: Any, labels: Any, lengths: Any, entropy: bool) -> Any:
    """prepare_model_outputs' no-rmpad branch: entropy on the padded logits, then the real tokens
    cut out and concatenated, then their log-probs."""
    import torch

    ent = _entropy(logits) if entropy else None
    rows = torch.cat([logits[i, : int(n)] for i, n in enumerate(lengths)])
    lp = _logprobs_rows(rows.unsqueeze(0), labels.unsqueeze(0)).squeeze(0)
    return lp, ent


def measure(mode: str, cast: bool, shape: tuple[int, int, int, int]) -> dict[str, Any]:
    import torch

    b, length, hidden, vocab = shape
    dev = torch.device("cuda")
    torch.manual_seed(0)
    grad = mode == "update"
    h = torch.randn(b, length, hidden, device=dev, dtype=torch.bfloat16, requires_grad=grad)
    w = (torch.randn(vocab, hidden, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_(grad)
    lengths = torch.full((b,), length, dtype=torch.int64)
    lengths[-1] = length - 3  # one shorter row, as in a real micro-batch
    labels = torch.randint(0, vocab, (int(lengths.sum()),), device=dev)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    reserved_before = torch.cuda.memory_reserved()

    def ctx() -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=cast)

    t0 = time.perf_counter()
    if grad:
        with ctx():
            logits = torch.nn.functional.linear(h, w)
            lp, _ = _outputs(logits, labels, lengths, entropy=False)
            loss = -lp.float().mean()
        del logits
        loss.backward()
    else:
        with torch.no_grad(), ctx():
            logits = torch.nn.functional.linear(h, w)
            lp, ent = _outputs(logits, labels, lengths, entropy=mode == "old_log_prob")
            del logits, lp, ent
    torch.cuda.synchronize()
    elems = b * length * vocab
    peak = torch.cuda.max_memory_allocated() - before
    return {
        "mode": mode,
        "autocast": cast,
        "rows": b,
        "length": length,
        "hidden": hidden,
        "vocab": vocab,
        "elements": elems,
        "peak_above_bytes": peak,
        "bytes_per_element": round(peak / elems, 3),
        "reserved_growth_bytes": torch.cuda.max_memory_reserved() - reserved_before,
        "reserved_per_element": round((torch.cuda.max_memory_reserved() - reserved_before) / elems, 3),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: logits_autocast.py OUT.json (a new file)", file=sys.stderr)
        return 2
    out = Path(argv[1])
    if out.exists():
        print(f"{out} exists: name a new file", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("logits_autocast.py measures the CUDA allocator: run it on a GPU host", file=sys.stderr)
        return 2
    rows = []
    for shape in SHAPES:
        for mode in ("old_log_prob", "ref", "update"):
            for cast in (True, False):
                r = measure(mode, cast, shape)
                rows.append(r)
                print(
                    f"{mode:13s} autocast={cast!s:5s} {shape} {r['bytes_per_element']:6.2f} B/elem allocated, "
                    f"{r['reserved_per_element']:6.2f} reserved",
                    flush=True,
                )
    record = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}
    out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
