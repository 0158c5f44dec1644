"""Whether torch's caching allocator alone grows its pool past the peak of what is allocated when
a sampler's tensors grow batch by batch, as vLLM's do while a round's requests arrive.

    python3 gpu/probes/sampler_pool.py OUT.json     (on a GPU host, OUT.json new; under a minute)

Why: in verl's GSM8K quickstart (256 prompts a round, Qwen2.5's 151,936-entry vocabulary) the
memory of vLLM's worker grows 1.7-6.5 GiB above its awake footprint in the first second of each
generation round, a different amount each round, in steps of 0.2-1.3 GiB, and vLLM's sleep frees
it with the torch allocator's cache (validation/planner-notes.yaml). One candidate is the caching
allocator's fragmentation: a block cached for a batch of N rows cannot serve a larger batch, so a
batch that grows step by step may leave a segment behind at each size. This replays, in a fresh
process per pattern, what vLLM 0.24's sampler allocates per decode step for B running requests
(logits in bf16 and their fp32 copy, log-probs of the processed logits, softmax, the exponential
noise of random sampling and their quotient, the rank count's comparison), with B growing by a
fixed number of requests a step up to the round's 256, then held for 20 steps, and records the
allocator's reserved memory against its peak allocated memory. The profile pattern allocates the
full batch at once, as vLLM's profile run does. A pattern whose reserved memory ends far above its
peak allocated memory is fragmentation the profile cannot see; none that does says the growth is
tensors that are alive, not the allocator's cache. Nothing here is vLLM: the sizes are its
sampler's, the allocator is the one its worker uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

GIB = 2**30
VOCAB = 151936  # Qwen2.5's vocabulary, the quickstart's
HIDDEN = 896  # Qwen2.5-0.5B
ROUND = 256  # the quickstart's requests a round (max_num_seqs 256)
#: pattern -> requests that join the batch each step (ROUND: all at once, as the profile run)
PATTERNS = {"profile": ROUND, "182+74": 182, "by-32": 32, "by-8": 8, "by-1": 1}


def sampler_step(b: int) -> None:
    """The sampler's tensors for `b` running requests, freed at the step's end."""
    import torch

    hidden = torch.randn(b, HIDDEN, device="cuda", dtype=torch.bfloat16)
    head = sampler_step.head  # type: ignore[attr-defined]
    logits = hidden @ head.T  # [b, V] bf16
    x = logits.float()  # [b, V] fp32
    logprobs = torch.log_softmax(x, dim=-1)
    probs = torch.softmax(x, dim=-1)
    q = torch.empty_like(probs).exponential_()
    token = probs.div(q).argmax(dim=-1)
    chosen = logprobs.gather(-1, token[:, None])
    ranks = (logprobs >= chosen).sum(-1)
    torch.cuda.synchronize()
    del hidden, logits, x, logprobs, probs, q, token, chosen, ranks


def one(pattern: str) -> dict[str, object]:
    import torch

    torch.cuda.init()
    sampler_step.head = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16)  # type: ignore[attr-defined]
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step, b, sizes = PATTERNS[pattern], 0, []
    while b < ROUND:
        b = min(ROUND, b + step)
        sizes.append(b)
    sizes += [ROUND] * 20
    reserved = []
    for n in sizes:
        sampler_step(n)
        reserved.append(torch.cuda.memory_reserved())
    peak = torch.cuda.max_memory_allocated() - base
    return {
        "pattern": pattern,
        "steps": len(sizes),
        "peak_allocated_gib": round(peak / GIB, 3),
        "reserved_end_gib": round((reserved[-1] - base) / GIB, 3),
        "reserved_max_gib": round((max(reserved) - base) / GIB, 3),
        "beyond_peak_gib": round((max(reserved) - base - peak) / GIB, 3),
        "segments": len(torch.cuda.memory_snapshot()),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2])))
        return 0
    if len(sys.argv) != 2 or os.path.exists(sys.argv[1]):
        print("usage: sampler_pool.py OUT.json (a new file)", file=sys.stderr)
        return 2
    rows = []
    for pattern in PATTERNS:
        out = subprocess.run(
            [sys.executable, __file__, "--one", pattern], capture_output=True, text=True, check=True, timeout=300
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]))
    with open(sys.argv[1], "w") as f:
        json.dump({"probe": "sampler_pool", "vocab": VOCAB, "round": ROUND, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
