"""Where a run's time before step 1 goes, stage by stage, from what the run folder already holds.

verl 0.9.1 logs each initialisation milestone with a wall-clock stamp (``INFO:2026-11-30
01:55:15,371:train and validate dataloader initialized``), Ray logs its own start, and vLLM (at
``VLLM_LOGGING_LEVEL=INFO``, which the launcher sets) logs how long its parts took. Together with
the monitor's start record and the first `step` begin in phases.jsonl they cut the start-up into
stages; each stage is the time from the previous milestone to its own. A milestone missing from
the log (another verl version, a run that died early) simply drops out, and its time goes to the
next stage that is there.

The log stamps carry no time zone. They are read as UTC and, if the whole log is shifted from the
monitor's clock by whole hours (a host in another zone), shifted back by that many hours.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from verl_recipes import rundir

#: the last stage of verl's start-up: after it verl begins its first weight sync
TRAINER_READY = "trainer ready"
#: (stage name, regex of the log line that ends it), in the order verl 0.9.1 starts things.
MILESTONES: tuple[tuple[str, str], ...] = (
    ("driver start, config check, Ray start", r"Started a local Ray instance"),
    ("trainer actor, TransferQueue, datasets", r"train and validate dataloader initialized"),
    ("worker processes, critic load + FSDP", r"critic model engine initialized"),
    ("actor + reference load + FSDP", r"actor and ref model engine initialized"),
    ("reward loop", r"reward loop manager initialized"),
    # vLLM's server in its own processes, each a fresh Python that imports torch and vLLM: the
    # server actor, the model-config inspection, the engine core and the GPU worker; at
    # VLLM_LOGGING_LEVEL=INFO each logs a stamped line (month-day only), else these drop out.
    ("vLLM server actor start (Ray, imports)", r"\(vLLMHttpServer pid=\d+\).* INFO \d{2}-\d{2} "),
    ("vLLM model config (architecture inspection)", r"Resolved architecture:"),
    ("vLLM engine core process start", r"Initializing a V1 LLM engine"),
    ("vLLM worker process start", r"Loading model from scratch|Starting to load model"),
    ("vLLM load, compile, KV cache, CUDA graphs, warm-up", r"init engine \(profile, create kv cache"),
    ("vLLM server up, checkpoint engine", r"checkpoint engine manager initialized"),
    (TRAINER_READY, r"all initialize finished"),
)
FIRST_STEP = "first step begins (initial weight sync)"
#: the one stage of a log that names none of verl's milestones (another training loop, or no log):
#: the whole start-up, not verl's weight sync
TO_FIRST_STEP = "launch to the first step (the log names no stage)"

_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})[,.](\d{3})")
#: vLLM's own stamp: ``INFO 12-01 17:30:25 [model.py:524]``, no year, whole seconds
_VLLM_STAMP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) (\d{2})-(\d{2}) (\d{2}:\d{2}:\d{2}) \[")
#: vLLM's own timing lines: (what, regex with the seconds as group 1)
VLLM_TIMINGS: tuple[tuple[str, str], ...] = (
    ("model loading", r"Model loading took [\d.]+ Gi?B (?:memory )?and ([\d.]+) s"),
    ("torch.compile", r"torch\.compile (?:takes|took) ([\d.]+) s in total"),
    ("dynamo bytecode transform", r"Dynamo bytecode transform time: ([\d.]+) s"),
    ("compile cache load", r"[Ll]oad(?:ed|ing)? the compiled graph.* ([\d.]+) s"),
    ("CUDA graph capture", r"Graph capturing finished in ([\d.]+) sec"),
    (
        "engine init (profile, KV cache, warm-up)",
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)",
    ),
)


def _stamp(line: str, year: int | None = None) -> float | None:
    """A line's stamp in epoch seconds: verl's and Ray's full one, else vLLM's in ``year``."""
    m = _STAMP.search(line)
    if m:
        when = _dt.datetime.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=_dt.timezone.utc)
        return when.timestamp() + int(m[3]) / 1000
    v = _VLLM_STAMP.search(line)
    if v and year is not None:
        when = _dt.datetime.strptime(f"{year}-{v[1]}-{v[2]} {v[3]}", "%Y-%m-%d %H:%M:%S")
        return when.replace(tzinfo=_dt.timezone.utc).timestamp()
    return None


def milestones(lines: Iterable[str]) -> dict[str, float]:
    """The first stamped occurrence of each milestone in a verl log: stage name -> epoch seconds.
    vLLM's stamps carry no year: they take the year of the last full stamp above them."""
    found: dict[str, float] = {}
    pats = [(name, re.compile(rx)) for name, rx in MILESTONES]
    year: int | None = None
    for line in lines:
        full = _STAMP.search(line)
        if full:
            year = int(full[1][:4])
        for name, rx in pats:
            if name not in found and rx.search(line):
                t = _stamp(line, year)
                if t is not None:
                    found[name] = t
    return found


def vllm_timings(lines: Iterable[str]) -> dict[str, float]:
    """vLLM's own start-up timings (seconds), the first of each."""
    out: dict[str, float] = {}
    pats = [(name, re.compile(rx)) for name, rx in VLLM_TIMINGS]
    for line in lines:
        for name, rx in pats:
            if name not in out:
                m = rx.search(line)
                if m:
                    out[name] = float(m[1])
    return out


_BACKEND = re.compile(r"Using (\w+) attention backend out of potential backends: \[([^\]]*)\]")
_FA_VERSION = re.compile(r"Using FlashAttention version (\d+)")
_GRAPH_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([\d, ]+)\]")
_GRAPH_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")


def vllm_picks(lines: Iterable[str]) -> dict[str, Any]:
    """What vLLM chose for itself on this GPU, from its own log lines (the first of each): the
    attention backend and the ones it could have taken, the FlashAttention version, and the batch
    sizes it captured CUDA graphs for with their mode. The decode speed of a rollout depends on
    these, and none is in verl's config unless the recipe sets it."""
    out: dict[str, Any] = {}
    for line in lines:
        if "attention_backend" not in out and (m := _BACKEND.search(line)):
            out["attention_backend"] = m[1]
            out["attention_backends_possible"] = [x.strip(" '") for x in m[2].split(",") if x.strip(" '")]
        if "flash_attention_version" not in out and (m := _FA_VERSION.search(line)):
            out["flash_attention_version"] = int(m[1])
        if "cudagraph_capture_sizes" not in out and (m := _GRAPH_SIZES.search(line)):
            out["cudagraph_capture_sizes"] = [int(x) for x in m[1].split(",") if x.strip()]
        if "cudagraph_mode" not in out and (m := _GRAPH_MODE.search(line)):
            out["cudagraph_mode"] = m[1]
    return out


def picks_line(picks: dict[str, Any]) -> str | None:
    """The report's one line for `vllm_picks` (None when the log had none of them)."""
    parts = []
    if picks.get("attention_backend"):
        fa = f" (FlashAttention {picks['flash_attention_version']})" if picks.get("flash_attention_version") else ""
        others = [b for b in picks.get("attention_backends_possible", []) if b != picks["attention_backend"]]
        parts.append(f"attention {picks['attention_backend']}{fa}" + (f", of {', '.join(others)}" if others else ""))
    sizes = picks.get("cudagraph_capture_sizes")
    if sizes:
        mode = f" {picks['cudagraph_mode']}" if picks.get("cudagraph_mode") else ""
        parts.append(f"CUDA graphs{mode} for batch sizes {', '.join(map(str, sizes))}")
    return "vLLM's own picks: " + "; ".join(parts) if parts else None


def stages(t_start: float, found: dict[str, float], t_first_step: float | None) -> list[dict[str, Any]]:
    """Consecutive stages from the monitor's start to the first step's begin."""
    if found:
        shift = round((min(found.values()) - t_start) / 3600) * 3600
        found = {k: v - shift for k, v in found.items()}
    points = [(name, found[name]) for name, _ in MILESTONES if name in found]
    if t_first_step is not None:
        points.append((FIRST_STEP if points else TO_FIRST_STEP, t_first_step))
    out, prev = [], t_start
    for name, t in points:
        if t < prev:  # out of order (a line logged late): fold it into the next stage
            continue
        out.append({"stage": name, "s": round(t - prev, 2), "at_s": round(t - t_start, 2)})
        prev = t
    return out


def summarize(run_dir: Path, t_start: float, t_first_step: float | None, log_name: str = rundir.LOG) -> dict[str, Any]:
    """summary.json's "startup": the stages, their total, and vLLM's own timings."""
    lines = rundir.read_log(run_dir / log_name).splitlines()
    st = stages(t_start, milestones(lines), t_first_step)
    return {
        "to_first_step_s": round(t_first_step - t_start, 2) if t_first_step is not None else None,
        "stages": st,
        "vllm_s": vllm_timings(lines),
        "vllm_picks": vllm_picks(lines),
    }
