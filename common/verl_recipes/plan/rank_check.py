"""`verl-recipes compare-ranks BASELINE RUN...`: a rehearsed rank against the run it stands for.

How far a rank rehearsal (one GPU as rank R of N, `train --rank`) can be trusted is a per-phase
question: its device peak against the same phase of a real run, GPU by GPU. The baseline is a
real run; each RUN is compared with the baseline's GPU of its own rank (GPU R of a baseline of N
GPUs, else the baseline's first GPU: a world of 1, or another layout). The planner's difference
for the two configurations says how much they should differ: for a rank of N against a world of
1, the sharded terms and FSDP2's all-gather buffers, which a world above 1 keeps reserved on
streams of their own (`phases._all_gather_cache`; their share is a column of its own), and the
measured difference over it reads how far the planner's difference holds. Below the table, the
training process's device memory beyond its own allocator (NVML per process minus verl's
`max_memory_reserved`: CUDA context, NCCL's buffers, which a rehearsal lacks), and PyTorch's own
peaks in the training phases, allocated and reserved, which part a difference into the tensors
the rank holds and the allocator's cache around them.
Tokens per step are shown, since a comparison is fair only where they
match; step time is the baseline's alone (a rehearsal's is one rank's compute).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from verl_recipes import GIB, inflight
from verl_recipes.plan.runs import judged_setup, read_run
from verl_recipes.predict.gpus import GPU
from verl_recipes.predict.phases import ALL_GATHER, RS_CACHED, Constants, plan_gpu
from verl_recipes.rundir import VERL_METRICS, read_jsonl, read_provenance, read_summary, steady_steps

# A planner's difference below this (GiB) is none: two runs of one layout judged at their own logged
# lengths differ by a few tokens, and a ratio over it would say nothing.
NO_DIFF_GIB = 0.1

#: the phases a rank differs in (verl's marked_timer names, as the report attributes them)
PHASES = ("gen", "update_weights", "old_log_prob", "values", "update_critic", "update_actor")


def _peaks(run_dir: Path) -> dict[str, dict[int, float]]:
    """phase -> position of the GPU in the run -> device peak GiB."""
    s = read_summary(run_dir)
    order = {str(g["index"]): pos for pos, g in enumerate(sorted(s.get("gpus") or [], key=lambda g: int(g["index"])))}
    out: dict[str, dict[int, float]] = {}
    for phase, pk in (s.get("phases") or {}).items():
        for idx, g in (pk.get("gpu") or {}).items():
            out.setdefault(phase, {})[order.get(str(idx), int(idx))] = float(g["used_gib"])
    return out


def _steady(run_dir: Path) -> dict[str, float | None]:
    """Median step time and, over steps 2+, the training process's device memory beyond its own
    allocator: its NVML per-process peak (the monitor's `fsdp_worker` class) minus verl's largest
    `max_memory_reserved`."""
    steps: list[Any] = list(steady_steps(read_summary(run_dir).get("steps") or []))
    times = [float(t) for st in steps if (t := st.get("time_s")) is not None]
    reserved = [float(r) for st in steps if (r := st.get("verl_max_reserved_gib")) is not None]
    allocated = [
        float(v)
        for st in steps
        for k, v in (st.get("verl_memory_gib") or {}).items()
        if k.endswith("max_memory_allocated_gb") and v is not None
    ]
    worker = [
        float(g.get("by_class_gib", {}).get("fsdp_worker", 0.0))
        for st in steps
        for g in st.get("peak", {}).get("gpu", {}).values()
    ]
    return {
        "step_s": statistics.median(times) if times else None,
        # the two peaks of steps 2+: the allocator's reservation only grows, NVML's reading with it
        "beyond_allocator_gib": max(worker) - max(reserved) if reserved and any(worker) else None,
        # PyTorch's own peaks in the training phases (verl's perf/max_memory_*_gb, GiB): the tensors
        # held, and the allocator's reservation around them; their gap is the allocator's cache
        "allocated_gib": max(allocated) if allocated else None,
        "reserved_gib": max(reserved) if reserved else None,
    }


def _tokens(run_dir: Path) -> float | None:

    rows, _ = read_jsonl(run_dir / VERL_METRICS)
    xs = [float(d["perf/total_num_tokens"]) for r in rows if (d := r.get("data", r)) and "perf/total_num_tokens" in d]
    return statistics.median(xs[1:] or xs) if xs else None


def _planned(run_dir: Path) -> dict[str, tuple[float, float, float]]:
    """The planner's per-phase peak for the configuration the run saved, on its own GPU, at the
    tokens it held (`runs.judged_setup`), and the parts of it that are cache on FSDP2's own streams
    (reserved, never allocated at the peak), GiB: (peak, all-gather buffers, gradients an earlier
    update left on its reduce-scatter stream)."""
    run = read_run(run_dir)
    total = next(iter(run.gpu_totals.values()), 0)
    gpu = GPU(id=run.gpu_name or "measured", name=run.gpu_name, memory_bytes=total, visible_bytes=total)
    plan = plan_gpu(judged_setup(run), gpu, Constants())
    return {
        ph: (
            p.total / GIB,
            sum(t.bytes for t in p.terms if ALL_GATHER in t.name) / GIB,
            sum(t.bytes for t in p.terms if RS_CACHED in t.name) / GIB,
        )
        for ph in PHASES
        if (p := plan.phase(ph)) is not None
    }


def compare(baseline: Path, runs: list[Path], planner: bool = True) -> dict[str, Any]:
    base_peaks, base_plan = _peaks(baseline), (_planned(baseline) if planner else {})
    out: dict[str, Any] = {"baseline": baseline.name, **_steady(baseline), "tokens": _tokens(baseline), "runs": []}
    for run in runs:
        rank = read_provenance(run).rank_rehearsal
        n_base = max((len(v) for v in base_peaks.values()), default=1)
        gpu = rank.rank if rank and rank.world == n_base else 0
        peaks, plan = _peaks(run), (_planned(run) if planner else {})
        rows = []
        for ph in PHASES:
            b, m = base_peaks.get(ph, {}).get(gpu), (peaks.get(ph) or {}).get(0)
            if b is None or m is None:
                continue
            both = ph in plan and ph in base_plan
            pdiff = plan[ph][0] - base_plan[ph][0] if both else None
            gather = plan[ph][1] - base_plan[ph][1] if both else None
            cached_grads = plan[ph][2] - base_plan[ph][2] if both else None
            rows.append(
                {
                    "phase": ph,
                    "baseline_gib": b,
                    "run_gib": m,
                    "diff_gib": m - b,
                    "planner_diff_gib": pdiff,
                    "planner_all_gather_gib": gather,
                    "planner_cached_grads_gib": cached_grads,
                    # how far the planner's difference holds: 1 where the run differs by just as much;
                    # none where the planner sees no difference (the same layout, a few tokens apart)
                    "measured_over_planner": (m - b) / pdiff if pdiff and abs(pdiff) >= NO_DIFF_GIB else None,
                }
            )
        out["runs"].append(
            {
                "run": run.name,
                "rank": [rank.rank, rank.world] if rank else None,
                "baseline_gpu": gpu,
                "tokens": _tokens(run),
            }
            | _steady(run)
            | {"rows": rows}
        )
    return out


def _f(v: float | None, nd: int = 2, sign: bool = False) -> str:
    return "-" if v is None else (f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}")


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def render(doc: dict[str, Any]) -> str:
    lines = []
    for r in doc["runs"]:
        who = f"rank rehearsal ({r['rank'][0]} of {r['rank'][1]})" if r["rank"] else "full run"
        lines += [
            f"### {r['run']} ({who}) against {doc['baseline']}, GPU {r['baseline_gpu']}",
            "",
            "| phase | baseline GiB | run GiB | run - baseline GiB | % | planner's difference GiB "
            "| of it FSDP2 all-gather buffers GiB | run - baseline over the planner's |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for x in r["rows"]:
            pct = 100 * x["diff_gib"] / x["baseline_gib"] if x["baseline_gib"] else None
            lines.append(
                f"| {x['phase']} | {_f(x['baseline_gib'])} | {_f(x['run_gib'])} | {_f(x['diff_gib'], sign=True)} "
                f"| {_f(pct, 1, sign=True)} | {_f(x['planner_diff_gib'], sign=True)} "
                f"| {_f(x['planner_all_gather_gib'], sign=True)} | {_f(x['measured_over_planner'], 3)} |"
            )
        lines += [
            "",
            f"- tokens per step (median of steps 2+): baseline {_f(doc['tokens'], 0)}, run {_f(r['tokens'], 0)}",
            "- training process beyond its allocator (NVML per process minus verl's max reserved, "
            "peaks of steps 2+): "
            f"baseline {_f(doc['beyond_allocator_gib'])} GiB, run {_f(r['beyond_allocator_gib'])} GiB",
            "- PyTorch's allocator in the training phases (verl's max_memory_allocated / reserved, peaks of "
            f"steps 2+): allocated baseline {_f(doc['allocated_gib'])} GiB, run {_f(r['allocated_gib'])} GiB "
            f"({_f(_sub(r['allocated_gib'], doc['allocated_gib']), sign=True)}); reserved beyond allocated "
            f"baseline {_f(_sub(doc['reserved_gib'], doc['allocated_gib']))} GiB, "
            f"run {_f(_sub(r['reserved_gib'], r['allocated_gib']))} GiB",
            f"- step time: baseline {_f(doc['step_s'], 1)} s"
            + (
                "; a rehearsal's is one rank's compute, not the job's" if r["rank"] else f", run {_f(r['step_s'], 1)} s"
            ),
            "",
        ]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare-ranks", help="rehearsed ranks against the real run they stand for, phase by phase")
    p.add_argument("baseline", type=Path, help="a real run (the job on its GPUs, or a world of 1)")
    p.add_argument("runs", type=Path, nargs="+", help="rank rehearsals (or other runs) to hold against it")
    p.add_argument("--no-planner", action="store_true", help="leave out the planner's difference")
    p.add_argument("--out", type=Path, help="also write the tables (Markdown) here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = render(compare(args.baseline, args.runs, planner=not args.no_planner))
    print(text, end="")
    if args.out:
        inflight.write_text(args.out, text, "the comparison")
    return 0
