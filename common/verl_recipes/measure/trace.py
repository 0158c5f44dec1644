"""`verl-recipes trace TRACE`: where a torch profiler trace spends its time, as a short table.

verl's torch profiler (``global_profiler.tool=torch``) writes Chrome trace files (``*.json`` or
``*.json.gz``) per role and step; a 7B update is hundreds of MB of events nobody reads whole. This
sums the events of one kind (GPU kernels where the trace has them, CPU operators otherwise) by
name and by family (matrix multiply, attention, normalisation and elementwise, softmax and
cross-entropy, copies, communication, optimizer), and puts the busy time beside the trace's wall
span, so a slow phase says what it is slow at (e.g. logits work over the vocabulary against the
matrix multiplies of the layers).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, cli_types, inflight

#: family -> regex on the lower-cased event name; the first match wins, so order matters.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|all_gather|allgather|reduce_scatter|all_reduce|broadcast"),
    ("copy", r"memcpy|memset|copy_|aten::copy|aten::to\b|_to_copy|contiguous|cat\b|aten::cat"),
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|efficient_attention"),
    ("softmax / cross-entropy / log-probs", r"softmax|log_softmax|cross_entropy|nll_loss|logsumexp|entropy|gather"),
    ("matrix multiply", r"gemm|matmul|aten::mm\b|aten::bmm|aten::addmm|aten::linear|cutlass|sm90_xmma|nvjet|cublas"),
    ("optimizer", r"adam|foreach|multi_tensor|_fused_adam"),
    ("normalisation / elementwise", r"norm|elementwise|vectorized|unrolled|reduce|silu|mul|add|exp|pow|rsqrt|where"),
)


def family(name: str) -> str:
    low = name.lower()
    for fam, rx in FAMILIES:
        if re.search(rx, low):
            return fam
    return "other"


def load_events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise RecipeError(f"{path}: not a Chrome trace ({e}); give a torch profiler *.json or *.json.gz") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise RecipeError(f"{path}: no traceEvents list; give a torch profiler *.json or *.json.gz")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]


def summarize(events: list[dict[str, Any]], top: int = 15) -> dict[str, Any]:
    """Busy time by name and family of the GPU kernels (or, without any, the CPU operators)."""
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    kind = "GPU kernels" if kernels else "CPU operators"
    chosen = kernels or [e for e in events if e.get("cat") == "cpu_op"]
    if not chosen:
        raise RecipeError("the trace has neither GPU kernels nor CPU operators")
    by_name: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in chosen:
        by_name[str(e.get("name"))] += float(e["dur"])
        count[str(e.get("name"))] += 1
    by_family: dict[str, float] = defaultdict(float)
    for name, us in by_name.items():
        by_family[family(name)] += us
    start = min(float(e["ts"]) for e in chosen)
    end = max(float(e["ts"]) + float(e["dur"]) for e in chosen)
    busy = sum(by_name.values())
    names = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "kind": kind,
        "events": len(chosen),
        "span_ms": round((end - start) / 1000, 3),
        "busy_ms": round(busy / 1000, 3),
        "families_ms": {k: round(v / 1000, 3) for k, v in sorted(by_family.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n, "ms": round(us / 1000, 3), "calls": count[n], "family": family(n)} for n, us in names],
    }


def markdown(s: dict[str, Any], title: str) -> str:
    busy = s["busy_ms"] or 1.0
    lines = [
        f"# {title}",
        "",
        f"{s['events']} {s['kind']}: {s['busy_ms']:.1f} ms busy over a {s['span_ms']:.1f} ms span",
        "",
        "| family | ms | share |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v:.1f} | {100 * v / busy:.1f}% |" for k, v in s["families_ms"].items()]
    lines += ["", "| name | family | calls | ms |", "|---|---|---|---|"]
    lines += [f"| `{t['name'][:90]}` | {t['family']} | {t['calls']} | {t['ms']:.1f} |" for t in s["top"]]
    return "\n".join(lines) + "\n"


def traces_in(folder: Path) -> list[Path]:
    """The Chrome traces verl's profiler wrote into FOLDER (one per role, stage and step)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))


def folder_markdown(folder: Path, top: int = 15) -> str:
    """One section per trace of FOLDER, so the stages of one step (verl's discrete mode writes the
    actor's update, the critic's update and each log-prob pass to files of their own) sit side by
    side; a trace that cannot be read says so in its section instead of hiding the others."""
    found = traces_in(folder)
    if not found:
        raise RecipeError(f"{folder}: no *.json or *.json.gz traces in it")
    parts = []
    for path in found:
        try:
            parts.append(markdown(summarize(load_events(path), top), f"Trace: {path.name}"))
        except RecipeError as e:
            parts.append(f"# Trace: {path.name}\n\nunreadable: {e}\n")
    return "\n".join(parts)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="where a torch profiler trace spends its time")
    p.add_argument(
        "trace", type=Path, help="a Chrome trace from torch.profiler (*.json or *.json.gz), or a folder of them"
    )
    p.add_argument("--top", type=cli_types.count, default=15)
    p.add_argument("--out", type=Path, help="write the table here (markdown) instead of printing it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trace.is_dir():
        text = folder_markdown(args.trace, args.top)
    elif args.trace.is_file():
        text = markdown(summarize(load_events(args.trace), args.top), f"Trace: {args.trace.name}")
    else:
        raise RecipeError(f"{args.trace}: no such trace file or folder")
    if args.out:
        if args.out.exists():
            raise RecipeError(f"{args.out} exists; give a new --out path")
        inflight.write_text(args.out, text, "the trace summary")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
