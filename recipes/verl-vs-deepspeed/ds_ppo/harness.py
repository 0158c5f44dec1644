"""The measured run of the DeepSpeed baseline, and the side-by-side report with a verl run.

`run_ds` builds the engines, runs `warmup_steps + measured_steps` PPO steps and writes, into the
output folder (rank 0):
- run.json at the start (provenance, workload, hyper-parameters, DeepSpeed config);
- steps.jsonl, one line per finished step, so a killed run keeps what it measured;
- samples.jsonl, device-level NVML samples at 10 Hz from `verl_recipes.measure.monitor.Monitor` (a
  background thread of rank 0, all GPUs of the job), joined to the steps by wall-clock time;
- at the end results.json (everything above plus min/median/max over the measured steps),
  table.md and plot.png, and the run in the project's shared formats (phases.jsonl,
  metrics.jsonl, provenance.json: ds_ppo.records), so `verl-recipes report` and check-bounds read
  it as they read a verl run.
`compare.py report` rebuilds results/table/plot from run.json + steps.jsonl + samples.jsonl (a run
cut short) and adds a verl run's metrics JSONL (and, optionally, its monitor summary).

A rank rehearsal (`VERL_RECIPES_RANK_REHEARSAL=R/N`, ds_ppo.timing.Dist) runs one process as rank R
of N through PyTorch's fake process group. Its memory is that rank's; its step time and tokens/s
are that rank's compute alone (no communication, the rank's own tokens), never the job's speed.
run.json records `rank_rehearsal: {rank, world}`, and every output that shows numbers says so
with `verl_recipes.measure.report.rank_line`, the sentence verl's rehearsals carry.

Definitions (the same for both sides; a token is a prompt or response token, padding excluded,
which is verl's `perf/total_num_tokens`):
- step_s: the whole PPO step (probes excluded); gen_s, update_actor_s, update_critic_s: phases;
  train_s = update_actor_s + update_critic_s;
- gen_tok_s = tokens / gen_s; train_tok_s = tokens / train_s; overall_tok_s = tokens / step_s;
  overall_tok_s_per_gpu = overall_tok_s / GPUs (verl's `perf/throughput`), GPUs being those whose
  work `tokens` counts: the job's, or the one of a rehearsed rank (its tokens are its own);
- switch_*_s and repeat_*_s: see ds_ppo.loop (DeepSpeed only; verl reports no such metric);
- nvml_peak_gib: per GPU, the largest device-level used memory (NVML total - free) sampled during
  the step; actor/critic phase peaks are the same over the actor's phases (gen, old_log_prob,
  update_actor) and the critic's (values, update_critic). Under ZeRO-3 all three models stay
  resident, so a phase peak is the device's total during that phase, not one model's share.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ds_ppo import GIB, records
from ds_ppo.records import rank_of, token_gpus
from ds_ppo.workload import Workload

NVML_INTERVAL_S = 0.1  # 10 Hz: phases last seconds; keeps samples.jsonl under 16 MB for a 30-min run
ACTOR_PHASES = ("gen", "old_log_prob", "update_actor")
CRITIC_PHASES = ("values", "update_critic")
# (key, label, unit) of the table rows, in order.
ROWS = (
    ("step_s", "step time", "s"),
    ("gen_s", "generation time", "s"),
    ("update_actor_s", "actor update time", "s"),
    ("update_critic_s", "critic update time", "s"),
    ("gen_tok_s", "generation throughput", "tokens/s"),
    ("train_tok_s", "training throughput (actor + critic updates)", "tokens/s"),
    ("overall_tok_s", "PPO overall throughput", "tokens/s"),
    ("overall_tok_s_per_gpu", "PPO overall throughput per GPU", "tokens/s/GPU"),
    ("switch_actor_to_critic_s", "switch actor -> critic", "s"),
    ("repeat_critic_forward_s", "  same trivial critic forward, repeated", "s"),
    ("switch_critic_to_actor_s", "switch critic -> actor", "s"),
    ("repeat_actor_forward_s", "  same trivial actor forward, repeated", "s"),
    ("update_weights_s", "verl: actor -> rollout weight sync", "s"),
    ("nvml_peak_gib", "NVML peak, max over GPUs", "GiB"),
    ("nvml_actor_phase_peak_gib", "NVML peak in actor phases", "GiB"),
    ("nvml_critic_phase_peak_gib", "NVML peak in critic phases", "GiB"),
    ("nvml_swing_gib", "NVML max - min within a step", "GiB"),
)
_ENV_KEYS = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "OMP_NUM_THREADS",
)
FILES = {
    "run": "run.json",
    "steps": "steps.jsonl",
    "samples": "samples.jsonl",
    "results": "results.json",
    "table": "table.md",
    "plot": "plot.png",
}


# ---------------------------------------------------------------------------------------------
# Derived metrics


def derive(timing: dict[str, float], step_s: float, tokens: int, n_gpus: int) -> dict[str, float]:
    """The table's per-step numbers from phase seconds (verl's timing_s/* names) and tokens;
    `n_gpus` are the GPUs whose work `tokens` counts (`token_gpus`)."""
    out: dict[str, float] = {"step_s": step_s, "tokens": float(tokens)}
    for name in ("gen", "update_actor", "update_critic", "update_weights", *_probe_names()):
        if name in timing:
            out[f"{name}_s"] = timing[name]
    train = timing.get("update_actor", 0.0) + timing.get("update_critic", 0.0)
    if train > 0:
        out["train_s"] = train
        out["train_tok_s"] = tokens / train
    if timing.get("gen"):
        out["gen_tok_s"] = tokens / timing["gen"]
    if step_s > 0:
        out["overall_tok_s"] = tokens / step_s
        out["overall_tok_s_per_gpu"] = tokens / step_s / n_gpus
    return out


def _probe_names() -> tuple[str, ...]:
    from ds_ppo.loop import PROBES

    return PROBES


def nvml_step_peaks(
    samples: list[dict[str, Any]], wall: tuple[float, float], intervals: list[tuple[str, float, float]]
) -> dict[str, Any]:
    """Per-GPU NVML peaks (GiB) of one step: whole step, actor phases, critic phases, and swing."""

    def peaks(spans: Iterable[tuple[float, float]]) -> dict[str, float]:
        spans = list(spans)
        best: dict[str, float] = {}
        for s in samples:
            if any(a <= s["t"] <= b for a, b in spans):
                for g in s.get("gpus", []):
                    key = str(g["index"])
                    best[key] = max(best.get(key, 0.0), g["used"] / GIB)
        return best

    def lows(a: float, b: float) -> dict[str, float]:
        low: dict[str, float] = {}
        for s in samples:
            if a <= s["t"] <= b:
                for g in s.get("gpus", []):
                    key = str(g["index"])
                    low[key] = min(low.get(key, math.inf), g["used"] / GIB)
        return low

    step = peaks([wall])
    low = lows(*wall)
    return {
        "nvml_peak_gib_per_gpu": step,
        "nvml_actor_phase_peak_gib_per_gpu": peaks((a, b) for n, a, b in intervals if n in ACTOR_PHASES),
        "nvml_critic_phase_peak_gib_per_gpu": peaks((a, b) for n, a, b in intervals if n in CRITIC_PHASES),
        "nvml_swing_gib_per_gpu": {k: step[k] - low[k] for k in step if k in low},
    }


def flatten_nvml(rec: dict[str, Any]) -> dict[str, float]:
    """Max over GPUs of each per-GPU NVML map, under the table's key names."""
    out = {}
    for key in ("nvml_peak_gib", "nvml_actor_phase_peak_gib", "nvml_critic_phase_peak_gib", "nvml_swing_gib"):
        per = rec.get(key + "_per_gpu") or {}
        if per:
            out[key] = max(per.values())
    return out


def summarize(steps: list[dict[str, float]], warmup: int) -> dict[str, dict[str, float]]:
    """min/median/max of every numeric key over the measured steps (index >= warmup)."""
    measured = steps[warmup:]
    keys = sorted({k for s in measured for k, v in s.items() if isinstance(v, int | float)})
    out = {}
    for k in keys:
        vals = [float(s[k]) for s in measured if isinstance(s.get(k), int | float) and math.isfinite(s[k])]
        if vals:
            out[k] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "n": len(vals)}
    return out


# ---------------------------------------------------------------------------------------------
# The verl side


def read_verl_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Per-step metric dicts of a verl run, ordered by step.

    Accepts verl's FileLogger lines ({"step": n, "data": {...}}, trainer.logger=[...,file]),
    verl_recipes.worker.markers' metrics.jsonl ({"step", "metrics": {...}}) and flat dicts with "step".
    """
    by_step: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        data = rec.get("data") or rec.get("metrics") or rec
        step = int(rec.get("step", data.get("training/global_step", len(by_step) + 1)))
        by_step.setdefault(step, {}).update(data)
    return [by_step[k] for k in sorted(by_step)]


def verl_steps(rows: list[dict[str, Any]], n_gpus: int | None) -> list[dict[str, float]]:
    """The table's per-step numbers from verl metrics (timing_s/*, perf/total_num_tokens)."""
    out = []
    for m in rows:
        if "timing_s/step" not in m:
            continue
        timing = {k.split("/", 1)[1]: float(v) for k, v in m.items() if k.startswith("timing_s/")}
        tokens = int(m.get("perf/total_num_tokens", 0))
        gpus = n_gpus
        if gpus is None and m.get("perf/throughput"):
            gpus = max(1, round(tokens / (timing["step"] * float(m["perf/throughput"]))))
        rec = derive(timing, timing["step"], tokens, gpus or 1)
        if "perf/throughput" in m:
            rec["verl_perf_throughput"] = float(m["perf/throughput"])
        out.append(rec)
    return out


def verl_monitor_peaks(summary_path: str | Path) -> dict[int, float]:
    """step -> NVML peak (GiB, max over GPUs) from `verl-recipes report`'s summary.json."""
    from verl_recipes.rundir import read_summary

    data = read_summary(Path(summary_path).parent)
    return {int(s["step"]): float(p) for s in data.get("steps", []) if (p := s.get("nvml_peak_gib")) is not None}


# ---------------------------------------------------------------------------------------------
# Table and plot


def _fmt(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _cell(summary: dict[str, dict[str, float]] | None, key: str) -> str:
    if not summary or key not in summary:
        return "n/a"
    s = summary[key]
    return f"{_fmt(s['median'])} ({_fmt(s['min'])} - {_fmt(s['max'])})"


#: units of the rows a rank rehearsal measures as one rank's compute, not as the job's speed
SPEED_UNITS = ("s", "tokens/s", "tokens/s/GPU")


def markdown_table(
    ds: dict[str, dict[str, float]] | None,
    verl: dict[str, dict[str, float]] | None,
    notes: list[str],
    ds_label: str = "DeepSpeed ZeRO-3",
    rank: tuple[int, int] | None = None,
) -> str:
    """The side-by-side table; a rank rehearsal's opens with `rank_line` and labels its speed rows.

    A rehearsal's speed rows are kept, each labelled as the rank's compute, rather than dropped:
    the phase times are what says where a rank of the DeepSpeed loop spends its compute (ZeRO-3's
    generate is most of the step) and what a switch between actor and critic costs beside the
    same forward repeated, figures that no other record gives; verl's rehearsal reports keep their
    step times under the same sentence. The label rides on each row, so a row quoted alone still
    says that it is not the job's speed.
    """
    cols = [(ds_label, ds)] + ([("verl", verl)] if verl is not None else [])
    head = "| metric | unit | " + " | ".join(c for c, _ in cols) + " |"
    sep = "|---|---|" + "---|" * len(cols)
    lines = [head, sep]
    if rank:
        lines = [_rank_line(rank), "", *lines]
    for key, label, unit in ROWS:
        cells = [_cell(s, key) for _, s in cols]
        if all(c == "n/a" for c in cells):
            continue
        if rank and unit in SPEED_UNITS:
            label = f"{label} (rank {rank[0]} of {rank[1]}: its compute alone)"
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cells: median (min - max) over the measured steps (warm-up steps excluded).")
    lines.extend(notes)
    return "\n".join(lines) + "\n"


def plot(
    path: Path,
    ds_steps: list[dict[str, float]],
    verl: list[dict[str, float]] | None,
    warmup: int,
    ds_gpu_peaks: list[dict[str, float]],
    verl_peaks: dict[int, float] | None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    xs = list(range(1, len(ds_steps) + 1))
    for key, style in (("step_s", "-o"), ("gen_s", "--"), ("train_s", ":")):
        ax1.plot(xs, [s.get(key, math.nan) for s in ds_steps], style, color="tab:blue", label=f"DeepSpeed {key}")
    if verl:
        vx = list(range(1, len(verl) + 1))
        for key, style in (("step_s", "-s"), ("gen_s", "--"), ("train_s", ":")):
            ax1.plot(vx, [s.get(key, math.nan) for s in verl], style, color="tab:orange", label=f"verl {key}")
    for ax in (ax1, ax2):
        if warmup:
            ax.axvspan(0.5, warmup + 0.5, color="0.9", label="warm-up" if ax is ax1 else None)
    ax1.set_ylabel("seconds")
    ax1.set_title("Per-step time")
    ax1.legend(fontsize=7, ncol=2)
    gpus = sorted({k for p in ds_gpu_peaks for k in p}, key=int)
    for g in gpus:
        ax2.plot(xs, [p.get(g, math.nan) for p in ds_gpu_peaks], "-o", label=f"DeepSpeed GPU {g}")
    if verl_peaks:
        ks = sorted(verl_peaks)
        ax2.plot(ks, [verl_peaks[k] for k in ks], "-s", color="tab:orange", label="verl (max over GPUs)")
    if not gpus and not verl_peaks:
        ax2.text(0.5, 0.5, "no NVML samples (no GPU)", ha="center", va="center", transform=ax2.transAxes)
    ax2.xaxis.get_major_locator().set_params(integer=True)
    ax2.set_ylabel("NVML peak (GiB)")
    ax2.set_xlabel("PPO step")
    ax2.set_title("Per-step device memory peak (NVML, device level)")
    if gpus or verl_peaks:
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Assembling results


def load_ds_dir(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """run.json and the steps of a (possibly unfinished) DeepSpeed run, NVML peaks joined.

    Each step's table is derived again from its raw record (phase seconds, step seconds, tokens),
    so a run is read under today's definitions: a rehearsal made before `token_gpus` gave its
    per-GPU rate a world-th of the rank's own. So is its `torch_memory`: before `gather_objects`
    knew the fake group, a rehearsal listed its one process once per rank of the fake world,
    copies of one record, which are read as the one they are."""
    from verl_recipes.rundir import read_jsonl

    run = json.loads((out / FILES["run"]).read_text())
    steps, _ = read_jsonl(out / FILES["steps"])
    samples = [s for s in read_jsonl(out / FILES["samples"])[0] if s.get("kind") == "sample"]
    gpus = token_gpus(run)
    for s in steps:
        mem = s.get("torch_memory")
        if rank_of(run) and isinstance(mem, list) and mem and all(m == mem[0] for m in mem):
            s["torch_memory"] = mem[:1]
        s["table"] = derive(s["timing_s"], s["step_s"], s["tokens"], gpus)
        s.update(nvml_step_peaks(samples, tuple(s["wall"]), [tuple(i) for i in s["intervals"]]))
        s["table"].update(flatten_nvml(s))
    run["nvml_run_peak_gib_per_gpu"] = nvml_step_peaks(samples, (-math.inf, math.inf), [])["nvml_peak_gib_per_gpu"]
    return run, steps


def write_run_json(out: Path, run: dict[str, Any]) -> None:
    (out / FILES["run"]).write_text(json.dumps(run, indent=1, default=str) + "\n")


def record_rehearsal(out: Path, rank: int, world: int) -> dict[str, Any]:
    """Add `rank_rehearsal` to the run.json of a rehearsal made before run.json recorded it.

    The records must agree: run.json's world is the rehearsal's, and every step's torch_memory
    is one record or copies of one (a fake group's gather), never N ranks' own. A run.json that
    already records a rehearsal keeps it; another one is refused."""
    from verl_recipes import RecipeError
    from verl_recipes.rundir import read_jsonl

    run = json.loads((out / FILES["run"]).read_text())
    want = {"rank": rank, "world": world}
    if run.get("rank_rehearsal") is not None:
        if run["rank_rehearsal"] != want:
            raise RecipeError(f"{out / FILES['run']}: records rank_rehearsal {run['rank_rehearsal']}, not {want}")
        return run
    if int(run["world"]) != world:
        raise RecipeError(f"{out / FILES['run']}: a world of {run['world']}, not the rehearsal's {world}")
    for s in read_jsonl(out / FILES["steps"])[0]:
        mem = s.get("torch_memory") or []
        if any(m != mem[0] for m in mem):
            raise RecipeError(f"{out}: step {s.get('step')} has torch_memory of several processes: not a rehearsal")
    run["rank_rehearsal"] = want
    write_run_json(out, run)
    return run


def write_report(
    out: Path,
    run: dict[str, Any] | None,
    ds_steps: list[dict[str, Any]],
    verl_rows: list[dict[str, Any]] | None = None,
    verl_gpus: int | None = None,
    verl_warmup: int | None = None,
    verl_monitor: str | Path | None = None,
) -> dict[str, Any]:
    """results.json, table.md and plot.png in `out`; returns the results dict."""
    out.mkdir(parents=True, exist_ok=True)
    warmup = int(run["workload"]["warmup_steps"]) if run else 0
    ds_table = [s["table"] for s in ds_steps]
    ds_summary = summarize(ds_table, warmup) if ds_steps else None
    verl_table = verl_steps(verl_rows, verl_gpus) if verl_rows is not None else None
    vwarm = warmup if verl_warmup is None else verl_warmup
    verl_peaks = verl_monitor_peaks(verl_monitor) if verl_monitor else None
    if verl_table is not None and verl_peaks:
        for i, rec in enumerate(verl_table, start=1):
            if i in verl_peaks:
                rec["nvml_peak_gib"] = verl_peaks[i]
    verl_summary = summarize(verl_table, vwarm) if verl_table is not None else None
    notes = _notes(run, ds_steps, verl_table, vwarm, verl_peaks)
    rank = rank_of(run)
    results = {
        "schema": "verl-recipes/verl-vs-deepspeed/1",
        # a rehearsal's figures say what they are where they are read: the sentence and the rank
        **({"rank_rehearsal": {"rank": rank[0], "world": rank[1], "line": _rank_line(rank)}} if rank else {}),
        "run": run,
        "ds": {"summary": ds_summary, "steps": ds_steps},
        "verl": None
        if verl_table is None
        else {"summary": verl_summary, "steps": verl_table, "warmup": vwarm, "raw": verl_rows},
        "notes": notes,
    }
    (out / FILES["results"]).write_text(json.dumps(results, indent=1, default=str) + "\n")
    label = "DeepSpeed ZeRO-3" if not run or run.get("backend") == "deepspeed" else "plain torch (test stand-in)"
    (out / FILES["table"]).write_text(markdown_table(ds_summary, verl_summary, notes, label, rank))
    plot(
        out / FILES["plot"],
        ds_table,
        verl_table,
        warmup,
        [s.get("nvml_peak_gib_per_gpu", {}) for s in ds_steps],
        verl_peaks,
    )
    return results


def _rank_line(rank: tuple[int, int]) -> str:
    """verl_recipes.measure.report.rank_line: the one sentence every rehearsal's figures carry."""
    from verl_recipes.layout import RankSpec
    from verl_recipes.measure.report import rank_line

    return rank_line(RankSpec(*rank))


def _notes(
    run: dict[str, Any] | None,
    ds_steps: list[dict[str, Any]],
    verl: list[dict[str, float]] | None,
    vwarm: int,
    verl_peaks: dict[int, float] | None,
) -> list[str]:
    notes = []
    if run:
        w = run["workload"]
        ref = "on (KL in reward)" if w["use_ref"] else "off"
        rank = rank_of(run)
        where = (
            f"one GPU as rank {rank[0]} of a {rank[1]}-GPU job ({w['batch'] // rank[1]} of the prompts a step)"
            if rank
            else f"{run['world']} GPU(s)"
        )
        notes.append(
            f"Workload: {w['batch']} prompts x ({w['prompt_len']} prompt + {w['response_len']} response) "
            f"tokens, mini-batch {w['mini_batch']}, reference model {ref}; DeepSpeed on {where}, "
            f"{len(ds_steps)} steps of which {w['warmup_steps']} warm-up."
        )
        if run.get("prompt_len_mismatch"):
            notes.append(f"{run['prompt_len_mismatch']} prompts were not exactly prompt_len tokens (padded/cut).")
        planned = w["warmup_steps"] + w["measured_steps"]
        if len(ds_steps) < planned:
            notes.append(f"The DeepSpeed run stopped after {len(ds_steps)} of {planned} steps.")
    if verl is not None:
        notes.append(
            f"verl: {len(verl)} steps from its metrics JSONL, first {vwarm} treated as warm-up; verl has "
            "no actor<->critic switch metric (its resharding cost is timing_s/update_weights)."
        )
        if not verl_peaks:
            notes.append("verl NVML peaks: not given (pass --verl-monitor summary.json of verl-recipes report).")
    return notes


# ---------------------------------------------------------------------------------------------
# The DeepSpeed run


def cpu_collectives_over_gloo() -> None:
    """CPU ranks: every collective over gloo, without DeepSpeed's shared-memory op. Call it before
    `deepspeed.init_distributed`.

    DeepSpeed's TorchBackend JIT-compiles its shared-memory op (deepspeed_shm_comm) whenever the
    op's compatibility probe passes: 30-60 s on two cores, again in every fresh environment. The op
    serves only `inference_all_reduce` (AutoTP inference), which ZeRO-3 training never calls. The
    probe's result marked incompatible, TorchBackend takes the path DeepSpeed itself takes where the
    op cannot be built (`build_shm_op` returns None): torch.distributed over gloo for everything.
    """
    from deepspeed import ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        ops.__compatible_ops__[builder.NAME] = False


def run_ds(
    w: Workload,
    out: Path,
    *,
    backend: str,
    device_type: str,
    ds_config_path: str | None,
    time_budget_s: float,
    headroom_gib: float,
    skip_memory_check: bool,
    grad_ckpt: str = "non-reentrant",
    hp_overrides: dict[str, Any] | None = None,
) -> int:
    """Run the baseline (every rank calls this); rank 0 writes the files. Returns an exit code."""
    import torch

    from ds_ppo import engines, losses
    from ds_ppo.loop import PPOLoop, Shapes, StepBatch
    from ds_ppo.timing import Dist
    from ds_ppo.workload import (
        chat_ids,
        encode_prompts,
        memory_preflight,
        param_counts,
        read_rows,
        zero3_state_bytes_per_gpu,
    )

    d = Dist.from_env(device_type)
    if backend == "deepspeed":
        import deepspeed

        if device_type == "cpu":
            cpu_collectives_over_gloo()
        deepspeed.init_distributed(dist_backend="nccl" if device_type == "cuda" else "gloo")
    elif d.world != 1:
        raise SystemExit("the torch backend (CPU tests) runs in one process only")
    w.check(d.world)
    hp = losses.PPOHyper.from_verl_defaults(**(hp_overrides or {}))
    counts = param_counts(w.model)
    if backend == "deepspeed" and device_type == "cuda" and not skip_memory_check:
        total = torch.cuda.get_device_properties(d.device).total_memory
        why = memory_preflight(counts, d.world, w.use_ref, total, headroom_gib)
        if why:
            if d.writes:
                print(f"error: {why}", file=sys.stderr)
            return 2

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(w.model)
    tokenizer.padding_side = "left"
    rows = read_rows(w.data, limit=w.batch * w.steps)
    if not rows:
        raise SystemExit(f"{w.data}: no rows")
    while len(rows) < w.batch * w.steps:  # a small file is reused in order
        rows = rows + rows
    token_lists = [chat_ids(tokenizer, r.messages) for r in rows[: w.batch * w.steps]]
    mismatch = sum(len(t) != w.prompt_len for t in token_lists)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    base = engines.load_ds_config(ds_config_path)
    local = w.batch // d.world
    mini_local = w.mini_batch // d.world
    gas = mini_local // w.train_micro_per_gpu
    train_cfg = engines.ds_config(base, w.train_micro_per_gpu, gas, d.world)
    train_cfg["gradient_clipping"] = hp.grad_clip
    infer_cfg = engines.ds_config(base, w.infer_micro_per_gpu, 1, d.world)

    monitor = None
    if d.writes:
        out.mkdir(parents=True, exist_ok=True)
        for name in (*FILES.values(), *records.FILES):  # no record of an earlier run in this folder
            (out / name).unlink(missing_ok=True)
        from verl_recipes.measure.monitor import Monitor

        # The launcher (torchrun / deepspeed) is the parent of every rank: its tree is the job.
        root = os.getppid() if "LOCAL_RANK" in os.environ else os.getpid()
        monitor = Monitor(out, interval=NVML_INTERVAL_S, root_pid=root, cmd=sys.argv).start()

    torch.manual_seed(w.seed)  # same critic-head init on every rank
    t0 = time.perf_counter()
    actor: engines.Engine
    critic: engines.Engine
    ref: engines.Engine | None
    if backend == "deepspeed":
        dt = torch.bfloat16
        ref = engines.deepspeed_frozen(engines.load_ref(w.model, dt), infer_cfg) if w.use_ref else None
        actor = engines.deepspeed_trained(
            engines.load_actor(w.model, dt, grad_ckpt), hp.actor_lr, hp.weight_decay, hp.betas, train_cfg
        )
        critic = engines.deepspeed_trained(
            engines.load_critic(w.model, dt, grad_ckpt), hp.critic_lr, hp.weight_decay, hp.betas, train_cfg
        )
    else:  # plain torch, fp32: the CPU tests' stand-in, never measured
        dt = torch.float32
        ref = engines.TorchEngine(engines.load_ref(w.model, dt), None) if w.use_ref else None
        am = engines.load_actor(w.model, dt, grad_ckpt)
        cm = engines.load_critic(w.model, dt, grad_ckpt)
        actor = engines.TorchEngine(am, engines.adamw(am, hp.actor_lr, hp.weight_decay, hp.betas), gas, hp.grad_clip)
        critic = engines.TorchEngine(cm, engines.adamw(cm, hp.critic_lr, hp.weight_decay, hp.betas), gas, hp.grad_clip)
    init_s = d.max_floats([time.perf_counter() - t0])[0]
    torch.manual_seed(w.seed + 1000 * (d.rank + 1))  # sampling differs across ranks, as across prompts

    shapes = Shapes(
        w.prompt_len,
        w.response_len,
        mini_local,
        w.train_micro_per_gpu,
        w.infer_micro_per_gpu,
        w.gen_micro_per_gpu,
    )
    loop = PPOLoop(actor, critic, ref, tokenizer, hp, shapes, d)
    if d.writes:
        run = _run_record(w, hp, d, backend, train_cfg, infer_cfg, counts, init_s, mismatch, time_budget_s)
        if d.rank_rehearsal:
            run["rank_rehearsal"] = d.rank_rehearsal
        run["grad_ckpt"] = grad_ckpt
        run["zero3_model_state_gib_per_gpu"] = zero3_state_bytes_per_gpu(counts, d.world, w.use_ref) / GIB
        write_run_json(out, run)

    t_loop = time.perf_counter()
    ds_last_step_s = 0.0
    for i in range(w.steps):
        if i and time_budget_s > 0:
            over = time.perf_counter() - t_loop + 1.2 * ds_last_step_s > time_budget_s
            if d.max_floats([1.0 if over else 0.0])[0] > 0:
                if d.writes:
                    print(f"time budget {time_budget_s:g} s: stopping after {i} steps", flush=True)
                break
        sl = slice(i * w.batch + d.rank * local, i * w.batch + (d.rank + 1) * local)
        ids, mask = encode_prompts(token_lists[sl], w.prompt_len, pad)
        mine = rows[sl]
        res = loop.step(StepBatch(ids, mask, [r.ground_truth for r in mine], [r.data_source for r in mine]))
        ds_last_step_s = res["step_s"]
        if d.writes:
            rec = {
                "step": i + 1,
                "warmup": i < w.warmup_steps,
                **res,
                "table": derive(res["timing_s"], res["step_s"], res["tokens"], 1 if d.rehearsed else d.world),
            }
            with open(out / FILES["steps"], "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
            t = rec["table"]
            print(
                f"step {i + 1}/{w.steps}: {t['step_s']:.2f} s (gen {t.get('gen_s', 0):.2f}, "
                f"train {t.get('train_s', 0):.2f}), {t.get('overall_tok_s', 0):.0f} tok/s, "
                f"vf_loss {res['metrics'].get('critic/vf_loss', math.nan):.4g}, "
                f"pg_loss {res['metrics'].get('actor/pg_loss', math.nan):.4g}",
                flush=True,
            )

    if d.writes:
        assert monitor is not None
        monitor.set_exit(0)
        monitor.stop()
        run, steps = load_ds_dir(out)
        write_report(out, run, steps)
        print(f"wrote {out / FILES['results']}, {out / FILES['table']}, {out / FILES['plot']}", flush=True)
        written = records.write_records(out, run, steps)
        print(f"wrote {', '.join(p.name for p in written)}: `verl-recipes report {out}` reads them", flush=True)
    d.barrier()
    return 0


def _run_record(
    w: Workload,
    hp: Any,
    d: Any,
    backend: str,
    train_cfg: dict[str, Any],
    infer_cfg: dict[str, Any],
    counts: Any,
    init_s: float,
    mismatch: int,
    budget: float,
) -> dict[str, Any]:
    import torch
    from verl_recipes.measure.provenance import record

    extra = {
        "backend": backend,
        "world": d.world,
        "torch_cuda": torch.version.cuda,
        "gpu_name": torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else None,
        "env": {k: os.environ.get(k) for k in _ENV_KEYS},
        "workload": w.to_dict(),
        "hyper": hp.to_dict(),
        "ds_config_train": train_cfg,
        "ds_config_ref": infer_cfg,
        "params": {"actor": counts.actor, "critic": counts.critic, "ref": counts.ref},
        "critic_model": "AutoModelForTokenClassification(num_labels=1, classifier_dropout=0) as verl's",
        "init_s": init_s,
        "prompt_len_mismatch": mismatch,
        "time_budget_s": budget,
    }
    return record(command=[sys.executable, *sys.argv], extra=extra)
