"""When and how much host memory an FSDP1 forward-only reference takes: its build, its first forward.

    python3 gpu/probes/fsdp1_ref_pin.py OUT.json     (on a GPU host, OUT.json new; about a minute)

Why: verl 0.9.1 wraps a separate reference model under FSDP1 with `CPUOffload(offload_params=True)`,
and the host planner (`predict/host.py`) puts its pinned weights and gradient buffer (one
power-of-two block each per unit) at its first forward, FSDP1's lazy init, with its pageable
shard beside them until each unit reshards; one run (the Qwen2-7B GRPO rank 0 of 8) bore that out
within 3.7%. This builds rank 0 of 8 of such a reference at Qwen2-7B widths (28 decoder units and
a root of the two embeddings, fp32, parameters left uninitialised: memory, not values, is asked),
under torch's fake process group, and reads the process's RSS after the build, through the first
forward (20 Hz) and after it, beside the planner's two figures worked out here from the shapes.
Torch only: no verl, no vLLM.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

GIB = 2**30
WORLD = 8
HIDDEN, INTER, KV, LAYERS, VOCAB = 3584, 18944, 512, 28, 152064


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def main(out: str) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import CPUOffload, MixedPrecision
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not torch.cuda.is_available():
        print("fsdp1_ref_pin: needs a CUDA GPU (pinned host memory)", file=sys.stderr)
        return 2
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    torch.cuda.set_device(0)

    def param(*shape: int) -> nn.Parameter:
        return nn.Parameter(torch.empty(*shape), requires_grad=False)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = param(HIDDEN, HIDDEN), param(KV, HIDDEN), param(KV, HIDDEN)
            self.o = param(HIDDEN, HIDDEN)
            self.gate, self.up, self.down = param(INTER, HIDDEN), param(INTER, HIDDEN), param(HIDDEN, INTER)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + x @ self.o.t()
            return x + (torch.nn.functional.silu(x @ self.gate.t()) * (x @ self.up.t())) @ self.down.t()

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.lm_head = param(VOCAB, HIDDEN), param(VOCAB, HIDDEN)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed[ids]
            for layer in self.layers:
                x = layer(x)
            return x @ self.lm_head.t()

    t0 = time.monotonic()
    r0 = rss()
    model = Model()
    r_built = rss()
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    ref = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Layer}),
        cpu_offload=CPUOffload(offload_params=True),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        device_id=torch.cuda.current_device(),
        use_orig_params=False,
    )
    r_wrapped = rss()
    peak = [r_wrapped]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t1 = time.monotonic()
    with torch.no_grad():
        ref(torch.zeros(1, 16, dtype=torch.long, device="cuda"))
    torch.cuda.synchronize()
    t2 = time.monotonic()
    time.sleep(1.0)
    stop.set()
    th.join()
    r_after = rss()

    layer = 2 * HIDDEN * HIDDEN + 2 * KV * HIDDEN + 3 * INTER * HIDDEN
    root = 2 * VOCAB * HIDDEN
    shard = [-(-layer // WORLD) * 4] * LAYERS + [-(-root // WORLD) * 4]
    pinned = 2 * sum(pow2(b) for b in shard)  # the shard and the gradient buffer, power-of-two blocks
    doc = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "world": WORLD,
        "shape": {"hidden": HIDDEN, "intermediate": INTER, "kv": KV, "layers": LAYERS, "vocab": VOCAB},
        "gib": {
            "rss_start": r0 / GIB,
            "rss_model_built": r_built / GIB,
            "rss_wrapped": r_wrapped / GIB,
            "rss_first_forward_peak": peak[0] / GIB,
            "rss_after_first_forward": r_after / GIB,
            "shard_exact": sum(shard) / GIB,
            "pinned_planned": pinned / GIB,
        },
        "seconds": {"build_and_wrap": t1 - t0, "first_forward": t2 - t1},
    }
    with open(out, "x") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc["gib"], indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python3 gpu/probes/fsdp1_ref_pin.py OUT.json", file=sys.stderr)
        sys.exit(2)
    if os.path.exists(sys.argv[1]):
        print(f"fsdp1_ref_pin: {sys.argv[1]} exists; give a new file (nothing is overwritten)", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
