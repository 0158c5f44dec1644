"""How much host memory a pinned CPU copy of a GPU tensor takes, by size (torch's host allocator).

    python3 gpu/probes/pinned_rounding.py OUT.json     (on a GPU host, OUT.json new; about 30 s)

Why: verl's Megatron offload keeps each model's parameter buffers and optimizer states in pinned
host memory, and recipe 70b-3d on one GPU is limited by the host, not the GPU. torch's caching host
allocator is suspected of rounding every block up to a power of two. This allocates, in a fresh
process per mode, one pinned copy per size of a Llama-2-70B layer's fp32 tensors (the way verl
moves optimizer states: `.to("cpu", non_blocking=True)`, and its parameter buffers:
`torch.empty(..., pin_memory=True)`) and records what the allocator reports and what the
process's RSS grew by. The last mode asks for torch's cap on that rounding
(`pinned_max_round_threshold_mb`): with it, verl's offloaded optimizer states would take their
exact size (recipe 70b-3d: about 68 GiB less host memory a node, 4.2 GiB a rank and model, by the planner's blocks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

MB = 10**6
MIB = 2**20
# Llama-2-70B, one layer, fp32 elements: qkv (8192 x 10240), o (8192 x 8192), fc1 (2 x 28672 x
# 8192), fc2 (8192 x 28672)
SIZES = {"qkv": 8192 * 10240, "proj": 8192 * 8192, "fc1": 2 * 28672 * 8192, "fc2": 8192 * 28672}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(mode: str) -> dict[str, object]:
    import torch

    torch.cuda.init()
    out: dict[str, object] = {
        "mode": mode,
        "torch": torch.__version__,
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
    }
    rows = []
    keep = []
    for name, n in SIZES.items():
        before = rss()
        if mode == "to_nonblocking":
            x = torch.empty(n, dtype=torch.float32, device="cuda")
            y = x.to("cpu", non_blocking=True)
            torch.cuda.synchronize()
            del x
        elif mode == "register_exact":
            # an exact-size pageable tensor, page-locked in place (cudaHostRegister), outside
            # torch's caching host allocator: the candidate fix
            y = torch.empty(n, dtype=torch.float32)
            y.fill_(1.0)
            err = torch.cuda.cudart().cudaHostRegister(y.data_ptr(), n * 4, 0)
            assert int(err) == 0, f"cudaHostRegister: {err}"
            x = torch.empty(n, dtype=torch.float32, device="cuda")
            y.copy_(x, non_blocking=True)
            torch.cuda.synchronize()
            del x
        else:
            y = torch.empty(n, dtype=torch.float32, pin_memory=True)
            y.fill_(1.0)
        y.fill_(1.0)  # touch every page
        keep.append(y)
        stats = torch.cuda.host_memory_stats()
        rows.append(
            {
                "tensor": name,
                "bytes": n * 4,
                "pinned": bool(y.is_pinned()),
                "rss_growth_bytes": rss() - before,
                "allocated_bytes": stats.get("allocated_bytes.current"),
                "reserved_bytes": stats.get("reserved_bytes.current"),
            }
        )
    out["rows"] = rows
    return out


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2])))
        return 0
    if len(sys.argv) != 2:
        print("usage: python3 gpu/probes/pinned_rounding.py OUT.json (a new file)", file=sys.stderr)
        return 2
    if os.path.exists(sys.argv[1]):
        print(f"{sys.argv[1]} exists; give a new path (it is not overwritten)", file=sys.stderr)
        return 2
    results = []
    cuda, generic = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"
    modes = (
        ("to_nonblocking", None, cuda),
        ("empty_pinned", None, cuda),
        ("empty_pinned", "pinned_use_cuda_host_register:True", cuda),
        ("register_exact", None, cuda),
        # torch's cap on the rounding (pytorch PR 171662, in 2.13), a key of the device-generic
        # setting: whether the host's torch has it; a torch without the key refuses it, which the
        # record keeps as the answer (torch 2.11 on the H200 host, 2026-12-05: "Unrecognized key")
        ("to_nonblocking", "pinned_max_round_threshold_mb:1", generic),
    )
    asked = {"pinned_max_round_threshold_mb:1"}  # a refusal of these is an answer, not a failure
    for mode, conf, var in modes:
        env = dict(os.environ)
        if conf:
            env[var] = conf
        p = subprocess.run([sys.executable, __file__, "--one", mode], env=env, capture_output=True, text=True)
        if p.returncode:
            results.append({"mode": mode, "conf": conf, "error": p.stderr[-2000:]})
            continue
        results.append(json.loads(p.stdout.strip().splitlines()[-1]))
    for r in results:
        if "error" in r:
            continue
        print(r.get("mode"), r.get("conf"))
        for row in r.get("rows", []):
            print(
                f"  {row['tensor']:5s} {row['bytes'] / MIB:8.1f} MiB  RSS +{row['rss_growth_bytes'] / MIB:8.1f} MiB"
                f"  allocator reserved {(row['reserved_bytes'] or 0) / MIB:8.1f} MiB  pinned {row['pinned']}"
            )
    with open(sys.argv[1], "x") as f:
        json.dump(results, f, indent=1)
    for r in results:
        if "error" in r and r["conf"] in asked:
            refused = "Unrecognized key" in r["error"]
            print(f"{r['conf']}: {'not taken by this torch' if refused else 'failed'}")
    errors = [r for r in results if "error" in r and not (r["conf"] in asked and "Unrecognized key" in r["error"])]
    if errors:
        last = errors[0]["error"].strip().splitlines() or ["?"]
        modes = ", ".join(r["mode"] for r in errors)
        print(f"{modes} failed (needs a CUDA GPU and torch with CUDA): {last[-1]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
