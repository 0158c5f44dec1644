"""A DeepSpeed run folder as a monitored run: phases.jsonl, metrics.jsonl and provenance.json.

`compare.py ds` keeps its run in its own files: run.json (provenance, workload, configs),
steps.jsonl (per step: phase seconds, wall-clock phase intervals, tokens, losses, torch's
allocator peaks) and the monitor's samples.jsonl, which is already the format verl runs have. The
project's tools read a run through three more files (`verl_recipes.rundir`): phases.jsonl (begin
and end of each phase), metrics.jsonl (each step's metrics under verl's names) and
provenance.json. `write_records` derives the three from the run's own records, so `verl-recipes
report RUN_DIR` attributes the NVML samples to the DeepSpeed loop's phases and writes the
summary that check-bounds, compare-runs and the tables read, as for a verl run.

Every line is spelled by the format's owner: phase and metric lines by
`verl_recipes.worker.markers`, the provenance keys by `verl_recipes.measure.provenance` (run.json
holds its `record`), file names and writers by `verl_recipes.rundir`. The records carry
`backend: deepspeed`, which keeps the run out of what only verl runs are (`rundir.Provenance.verl`):
the planner's error table never holds it against verl's planner.

What the derived files say, and why:
- phases.jsonl: a `step` interval over each step's wall-clock span (probes included) and one
  interval per timed phase, the loop's own time.time() stamps (ds_ppo.timing.PhaseClock). The
  phases named like verl's (gen, reward, old_log_prob, ref, values, adv, update_critic,
  update_actor) are the ones bounds hold; switch_* and repeat_* are the DeepSpeed-only probes.
- metrics.jsonl: per step `timing_s/<phase>`, `timing_s/step` (the step without its probes, the
  table's step time), `perf/total_num_tokens`, `perf/time_per_step`, `perf/throughput` (tokens/s
  per GPU whose work the tokens count: the rank's own in a rehearsal, as verl's rehearsals give
  it), `perf/max_memory_{allocated,reserved}_gb` (torch's allocator peaks in GiB, max over ranks:
  verl's names for the same figures) and the loop's losses.
- provenance.json: run.json's provenance record, the workload, and `backend`, `world`,
  `rank_rehearsal`, `adv_estimator` (GAE: PPO), which name the run (`recipe.run_names`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from verl_recipes.measure.provenance import RECORD_KEYS
from verl_recipes.rundir import (
    METRICS,
    MODEL_CONFIG,
    PHASES,
    PROVENANCE,
    SAMPLES,
    JsonlWriter,
    read_jsonl,
    write_provenance,
)
from verl_recipes.worker.markers import metrics_record, phase_record

#: the recipe whose DeepSpeed side this is
RECIPE = "verl-vs-deepspeed"
#: the loop's advantage estimator, in verl's config words: ds_ppo.losses.advantages_returns is GAE
ADV_ESTIMATOR = "gae"
#: the files `write_records` writes (a model_config.json too, where the checkpoint is readable)
FILES = (PHASES, METRICS, PROVENANCE)


def phase_lines(steps: Iterable[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    """phases.jsonl's lines: each step's span, and inside it every phase the loop timed."""
    out = []
    for s in steps:
        n = int(s["step"])
        t0, t1 = (float(x) for x in s["wall"])
        out.append(phase_record("begin", "step", n, t0, pid))
        for name, a, b in s["intervals"]:
            out.append(phase_record("begin", str(name), n, float(a), pid))
            out.append(phase_record("end", str(name), n, float(b), pid, ok=True))
        out.append(phase_record("end", "step", n, t1, pid, ok=True))
    return out


def step_metrics(s: dict[str, Any], gpus: int) -> dict[str, Any]:
    """One step's metrics under verl's names (module docstring); `gpus` as `token_gpus`."""
    step_s, tokens = float(s["step_s"]), int(s["tokens"])
    m: dict[str, Any] = {"training/global_step": int(s["step"])}
    m.update({f"timing_s/{k}": float(v) for k, v in s["timing_s"].items()})
    m["timing_s/step"] = step_s
    m["perf/total_num_tokens"] = tokens
    m["perf/time_per_step"] = step_s
    if step_s > 0:
        m["perf/throughput"] = tokens / step_s / gpus
    mem = [x for x in s.get("torch_memory") or [] if x]
    for key in ("allocated", "reserved"):
        vals = [float(x[f"max_{key}_gib"]) for x in mem if x.get(f"max_{key}_gib") is not None]
        if vals:
            m[f"perf/max_memory_{key}_gb"] = max(vals)
    m.update(s.get("metrics") or {})
    return m


def metric_lines(steps: Iterable[dict[str, Any]], gpus: int, pid: int) -> list[dict[str, Any]]:
    """metrics.jsonl's lines, one per step, stamped at the step's end."""
    return [metrics_record(int(s["step"]), step_metrics(s, gpus), float(s["wall"][1]), pid) for s in steps]


def provenance(run: dict[str, Any]) -> dict[str, Any]:
    """provenance.json from run.json: its provenance record as written, and what names the run."""
    w = run.get("workload") or {}
    return {
        **{k: run.get(k) for k in RECORD_KEYS},
        "recipe": RECIPE,
        "backend": run.get("backend"),
        "world": run.get("world"),
        "rank_rehearsal": run.get("rank_rehearsal"),
        "adv_estimator": ADV_ESTIMATOR,
        "variants": [],
        "sets": [],
        "steps": int(w["warmup_steps"]) + int(w["measured_steps"]) if w else None,
        "model": w.get("model"),
        "data": w.get("data"),
        "derived_from": ["run.json", "steps.jsonl"],  # by ds_ppo.records
    }


def _monitor_pid(run_dir: Path) -> int:
    """The pid the monitor watched (its start record): the key that pairs begin and end lines.
    The phases are the writing rank's, one process, so one key pairs them all."""
    recs, _ = read_jsonl(run_dir / SAMPLES)
    start = next((r for r in recs if r.get("kind") == "start"), {})
    return int(start.get("pid") or 0)


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> Path:
    """The file whole or not at all: written beside, then renamed over any earlier one."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    w = JsonlWriter(tmp)
    try:
        for line in lines:
            w.write(line)
    finally:
        w.close()
    os.replace(tmp, path)
    return path


def rank_of(run: dict[str, Any] | None) -> tuple[int, int] | None:
    """(R, N) of a rank rehearsal from run.json's `rank_rehearsal`; None for a real job."""
    rank = (run or {}).get("rank_rehearsal")
    return (int(rank["rank"]), int(rank["world"])) if rank else None


def token_gpus(run: dict[str, Any]) -> int:
    """The GPUs whose work a step's `tokens` counts: the job's world, or one for a rehearsed rank.

    A fake process group's all-reduce returns each value as it was, so a rehearsal's token sum is
    its own rank's share, which one GPU did: dividing it by the world would give a per-GPU rate a
    world-th of the rank's (as verl's rehearsals, whose perf/throughput is the rank's own)."""
    return 1 if rank_of(run) else int(run["world"])


def write_records(run_dir: Path, run: dict[str, Any], steps: list[dict[str, Any]]) -> list[Path]:
    """phases.jsonl, metrics.jsonl and provenance.json of a DeepSpeed run folder, from its run.json
    and steps as `harness.load_ds_dir` reads them (NVML peaks joined); again and the same for a run
    made before they were written. The checkpoint's config.json is kept as model_config.json where
    it is readable here (a truncated model's depth names its run) and none is there yet."""
    pid = _monitor_pid(run_dir)
    written = [
        _write_lines(run_dir / PHASES, phase_lines(steps, pid)),
        _write_lines(run_dir / METRICS, metric_lines(steps, token_gpus(run), pid)),
        write_provenance(run_dir, provenance(run)),
    ]
    model = (run.get("workload") or {}).get("model")
    config = Path(str(model)) / "config.json" if model else None
    if config is not None and config.is_file() and not (run_dir / MODEL_CONFIG).exists():
        (run_dir / MODEL_CONFIG).write_text(json.dumps(json.loads(config.read_text()), indent=2) + "\n")
        written.append(run_dir / MODEL_CONFIG)
    return written
