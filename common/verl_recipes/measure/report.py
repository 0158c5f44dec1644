"""`verl-recipes report RUN_DIR`: per-step, per-phase memory peaks of a monitored run.

Joins the monitor's samples (samples.jsonl, `verl_recipes.measure.monitor`) with verl's phase intervals
(phases.jsonl) and step metrics (metrics.jsonl, both from `verl_recipes.worker.markers`) and writes, into
`--out` (default RUN_DIR): summary.json (read by check-bounds and the planner), report.md and
timeline.png. All clocks are time.time() on one host; a multi-node run needs one monitor per node.

Attribution: a sample belongs to the innermost phase open at its time (the latest-begun interval
that contains it), and to that interval's step. Time inside `step` but in no sub-phase is phase
`step`; time outside every step (model loading, vLLM start-up) is phase `outside`. A phase shorter
than the sampling interval may have no sample: its peaks are null. A phase's `end` line may carry
the device memory read at that instant (`verl_recipes.worker.markers`); it counts as one more sample of
that phase (device memory only), so an allocation in a phase's last instant is not credited to
the next phase. Each peak is the maximum over the samples attributed to that phase; per-class
peaks are maximised separately, so they need not have happened at the same time as the device
peak. A phase that was still open when the run ended (a crash, a host gone) is closed at the last
sample and counted in the peaks, but has no duration: its step has no time.

summary.json's schema, field by field, is `verl_recipes.rundir.Summary`.

Process classes are verl_recipes.measure.monitor.CLASSES; host RSS is summed over the monitored processes
(shared pages counted once per process); PSS, sampled every few seconds, counts them once.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_recipes import GIB, RecipeError, inflight
from verl_recipes.layout import RankSpec
from verl_recipes.measure import ending, gen_split, startup
from verl_recipes.measure.monitor import CLASSES
from verl_recipes.rundir import (
    EXIT_CODE,
    GEN_SPLIT,
    METRICS,
    PHASES,
    REPORT,
    SAMPLES,
    STEADY_FROM,
    SUMMARY,
    SUMMARY_SCHEMA,
    TIMELINE,
    cut_of,
    read_jsonl,
    read_provenance,
    write_summary,
)

OUTSIDE = "outside"


@dataclass
class Interval:
    name: str
    step: int | None
    begin: float
    end: float
    pid: int | None
    open: bool = False


@dataclass
class Peaks:
    """Running maxima of one group of samples."""

    samples: int = 0
    duration_s: float | None = None
    gpu_used: dict[int, int] = field(default_factory=dict)
    gpu_class: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    host: dict[str, int] = field(default_factory=dict)

    def add(self, s: dict[str, Any]) -> None:
        self.samples += 1
        for g in s.get("gpus", []):
            i = int(g["index"])
            self.gpu_used[i] = max(self.gpu_used.get(i, 0), int(g["used"]))
            by: dict[str, int] = defaultdict(int)
            for p in g.get("procs", []):
                if p.get("used") is not None:
                    by[p.get("class", "other")] += int(p["used"])
            for cls, v in by.items():
                self.gpu_class[i][cls] = max(self.gpu_class[i].get(cls, 0), v)
        for key in ("rss", "pss", "uss"):
            v = s.get("host", {}).get(key)
            if v is not None:
                self.host[key] = max(self.host.get(key, 0), int(v))

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "duration_s": _r(self.duration_s),
            "gpu": {
                str(i): {
                    "used_gib": _gib(used),
                    "by_class_gib": {c: _gib(self.gpu_class[i][c]) for c in _ordered(self.gpu_class.get(i, {}))},
                }
                for i, used in sorted(self.gpu_used.items())
            },
            "host": {f"{k}_gib": _gib(self.host[k]) if k in self.host else None for k in ("rss", "pss", "uss")},
        }


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def _gib(v: int | float) -> float:
    return round(v / GIB, 4)


def _ordered(classes: Any) -> list[str]:
    return sorted(classes, key=lambda c: (CLASSES.index(c) if c in CLASSES else len(CLASSES), c))


def load_intervals(records: list[dict[str, Any]], t_end: float) -> list[Interval]:
    """Pair begin/end lines per process (innermost first); close what is left open at `t_end`."""
    stacks: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    out: list[Interval] = []
    for r in sorted(records, key=lambda r: r.get("t", 0.0)):
        if "event" not in r:
            continue
        stack = stacks[r.get("pid")]
        if r["event"] == "begin":
            stack.append(r)
        elif r["event"] == "end":
            for k in range(len(stack) - 1, -1, -1):
                if stack[k]["name"] == r["name"]:
                    b = stack.pop(k)
                    out.append(Interval(b["name"], b.get("step"), b["t"], r["t"], b.get("pid")))
                    break
    for stack in stacks.values():
        for b in stack:
            out.append(Interval(b["name"], b.get("step"), b["t"], max(t_end, b["t"]), b.get("pid"), open=True))
    return sorted(out, key=lambda i: i.begin)


def _attribute(t: float, intervals: list[Interval]) -> tuple[str, int | None]:
    inner: Interval | None = None
    step: int | None = None
    for iv in intervals:
        if iv.begin > t:
            break
        if t <= iv.end:
            if inner is None or iv.begin >= inner.begin:
                inner = iv
            if iv.name == "step":
                step = iv.step
    if inner is None:
        return OUTSIDE, None
    return inner.name, inner.step if inner.step is not None else step


def recorded_exit_code(run_dir: Path) -> int | None:
    """The exit code `train` recorded beside the run (`exit_code`), or None."""
    try:
        return int((run_dir / EXIT_CODE).read_text().strip())
    except (OSError, ValueError):
        return None


def cut_line(cut: dict[str, Any]) -> str:
    """`samples cut at line N (time T)`: where the monitor's record ends early."""
    when = "time unknown"
    if cut.get("t") is not None:
        stamp = _dt.datetime.fromtimestamp(cut["t"], _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        when = f"time {stamp}, {cut['at_s']:.1f} s after the start"
    lost = "" if cut.get("exit_record") else ", with the monitor's exit record"
    return f"samples cut at line {cut['line']} ({when}) of {cut['file']}: the tables end there{lost}"


def summarize(run_dir: Path) -> dict[str, Any]:
    """Build summary.json's content from a run directory."""
    recs, bad = read_jsonl(run_dir / SAMPLES)
    if not recs:
        raise RecipeError(f"{run_dir / SAMPLES}: no samples; run `verl-recipes monitor --out {run_dir} -- CMD`")
    start = next((r for r in recs if r.get("kind") == "start"), {})
    exit_ = next((r for r in recs if r.get("kind") == "exit"), None)
    samples = [r for r in recs if r.get("kind") == "sample"]
    if not samples:
        raise RecipeError(f"{run_dir / SAMPLES}: no sample records; the monitored command ended at once?")
    t_end = samples[-1]["t"]
    ph_recs, bad_ph = read_jsonl(run_dir / PHASES)
    intervals = load_intervals(ph_recs, t_end)
    met_recs, bad_met = read_jsonl(run_dir / METRICS)
    metrics: dict[int, dict[str, float]] = defaultdict(dict)
    for m in met_recs:
        if isinstance(m.get("step"), int):
            metrics[m["step"]].update(m.get("metrics", {}))

    load = PhaseLoad()
    total = Peaks()
    by_phase: dict[str, Peaks] = defaultdict(Peaks)
    by_step: dict[int, Peaks] = defaultdict(Peaks)
    by_step_phase: dict[int, dict[str, Peaks]] = defaultdict(lambda: defaultdict(Peaks))
    for s in samples:
        name, step = _attribute(s["t"], intervals)
        total.add(s)
        by_phase[name].add(s)
        if step is not None and step >= STEADY_FROM:
            load.add(name, s)
        if step is not None:
            by_step[step].add(s)
            by_step_phase[step][name].add(s)
    watched = {int(g["index"]) for g in start.get("gpus", [])}
    for r in ph_recs:  # device memory read by the trainer at the end of each phase
        if r.get("event") != "end" or not isinstance(r.get("gpu_used"), dict) or not watched:
            continue
        gpus = [{"index": int(i), "used": int(u)} for i, u in r["gpu_used"].items() if int(i) in watched]
        end_sample = {"t": r.get("t"), "gpus": gpus}
        name = str(r.get("name"))
        total.add(end_sample)
        by_phase[name].add(end_sample)
        step_no = r.get("step")
        if isinstance(step_no, int):
            by_step[step_no].add(end_sample)
            by_step_phase[step_no][name].add(end_sample)

    # a phase still open when the samples end (a crash, a host gone) has no duration: the time to
    # the last sample is not the phase's, and a step time read from it would enter the medians
    durations: dict[int | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for iv in intervals:
        if not iv.open:
            durations[iv.step][iv.name] += iv.end - iv.begin
    step_wall: dict[int | None, float] = {}
    for st, per in durations.items():  # phase `step` is the step's time in no sub-phase, like its samples
        if "step" in per:
            step_wall[st] = per["step"]
            per["step"] = max(0.0, per["step"] - sum(d for n, d in per.items() if n != "step"))
    phase_total: dict[str, float] = defaultdict(float)
    for per in durations.values():
        for name, d in per.items():
            phase_total[name] += d
    for name, pk in by_phase.items():
        pk.duration_s = phase_total.get(name)

    steps_out = []
    for step in sorted(set(by_step) | {s for s in durations if s is not None} | set(metrics)):
        m = metrics.get(step, {})
        for name, d in durations.get(step, {}).items():
            by_step_phase[step][name].duration_s = d
        timing = {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/")}
        if not timing:
            timing = {k: round(v, 6) for k, v in durations.get(step, {}).items() if k != "step"}
            if step in step_wall:
                timing["step"] = round(step_wall[step], 6)
        verl_mem = {k: v for k, v in m.items() if k.endswith(("max_memory_allocated_gb", "max_memory_reserved_gb"))}
        reserved = [v for k, v in verl_mem.items() if k.endswith("max_memory_reserved_gb")]
        pk = by_step.get(step, Peaks())
        pk.duration_s = timing.get("step")
        nvml_peak = _gib(max(pk.gpu_used.values())) if pk.gpu_used else None
        verl_res = max(reserved) if reserved else None
        steps_out.append(
            {
                "step": step,
                "time_s": _r(timing.get("step")),
                "timing_s": {k: _r(v) for k, v in timing.items()},
                "throughput": m.get("perf/throughput"),
                "mfu": {k.rsplit("/", 1)[1]: v for k, v in m.items() if k.startswith("perf/mfu/")},
                "verl_memory_gib": verl_mem,
                "verl_max_reserved_gib": verl_res,
                "nvml_peak_gib": nvml_peak,
                "nvml_minus_verl_reserved_gib": (
                    round(nvml_peak - verl_res, 4) if nvml_peak is not None and verl_res is not None else None
                ),
                "peak": pk.to_json(),
                "phases": {n: p.to_json() for n, p in by_step_phase.get(step, {}).items()},
            }
        )

    t0 = start.get("t", samples[0]["t"])
    wall = (exit_ or samples[-1])["t"] - t0
    first_step = min((iv.begin for iv in intervals if iv.name == "step"), default=None)
    exit_code = exit_.get("rc") if exit_ else None
    cut = cut_of(run_dir / SAMPLES)
    if exit_code is None:  # the monitor's exit record is lost (cut off, or killed): the launcher's is kept
        exit_code = recorded_exit_code(run_dir)
    return {
        "schema": SUMMARY_SCHEMA,
        "run_dir": str(run_dir),
        "cmd": start.get("cmd"),
        "exit_code": exit_code,
        "ended": ending.describe(run_dir, exit_code, ph_recs),
        "wall_s": round(wall, 3),
        "startup": startup.summarize(run_dir, t0, first_step),
        "interval_s": start.get("interval_s"),
        "samples": len(samples),
        "samples_cut": (
            {
                "file": cut.file,
                "line": cut.line,
                "t": cut.t,
                "at_s": round(cut.t - t0, 3) if cut.t else None,
                "exit_record": exit_ is not None,
            }
            if cut
            else None
        ),
        "skipped_lines": bad + bad_ph + bad_met,
        "nvml_error": start.get("nvml_error"),
        "gpus": [
            {"index": g["index"], "name": g["name"], "total_gib": _gib(g["total_bytes"])} for g in start.get("gpus", [])
        ],
        "peak": total.to_json(),
        "phases": {n: by_phase[n].to_json() for n in _phase_order(by_phase, intervals)},
        "load": load.to_json(_phase_order(by_phase, intervals)),
        "steps": steps_out,
        "gen_split": gen_split.to_json(
            gen_split.split(
                [(iv.step, iv.begin, iv.end) for iv in intervals if iv.name == "gen" and not iv.open and iv.step],
                read_jsonl(run_dir / GEN_SPLIT)[0],
            )
        ),
        "monitor": _monitor_cost(exit_),
    }


class PhaseLoad:
    """How busy the GPUs and the host were in each phase of steps 2+ (step 1 carries compiles and
    warm-ups): NVML's utilization, SM clock and power, and the CPU cores each process class kept
    busy, and the whole host's cores busy and stolen by the hypervisor, from the 2 Hz readings of
    `monitor`. Two runs of one phase that differ in time differ here in why: a GPU half idle waits
    on the host (on a stolen core where steal is up), a GPU busy at a lower clock is held back."""

    def __init__(self) -> None:
        self.gpu: dict[str, dict[int, dict[str, list[float]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list))
        )
        self.cpu: dict[str, list[dict[str, float]]] = defaultdict(list)
        self.host: dict[str, list[dict[str, float]]] = defaultdict(list)

    def add(self, phase: str, sample: dict[str, Any]) -> None:
        for g in sample.get("gpus") or ():
            for key in ("util", "sm_mhz", "power_w"):
                if g.get(key) is not None:
                    self.gpu[phase][int(g["index"])][key].append(float(g[key]))
        cpu = (sample.get("host") or {}).get("cpu_by_class")
        if cpu is not None:
            self.cpu[phase].append(cpu)
        host = (sample.get("host") or {}).get("host_cpu")
        if host is not None:
            self.host[phase].append(host)

    def to_json(self, order: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for phase in [p for p in order if p in self.gpu or p in self.cpu]:
            gpus = {
                str(i): {
                    "readings": len(v.get("util", [])),
                    "util_pct": _mean(v.get("util")),
                    "sm_mhz": _median(v.get("sm_mhz")),
                    "power_w": _median(v.get("power_w")),
                }
                for i, v in sorted(self.gpu.get(phase, {}).items())
            }
            spans = self.cpu.get(phase, [])
            classes = sorted({c for sp in spans for c in sp})
            cores = {c: round(sum(sp.get(c, 0.0) for sp in spans) / len(spans), 2) for c in classes}
            hosts = self.host.get(phase, [])
            whole = {k: round(statistics.fmean(h[k] for h in hosts), 2) for k in ("busy", "steal")} if hosts else None
            out[phase] = {"gpus": gpus, "host_readings": len(spans), "cpu_cores": cores, "host_cpu": whole}
        return out


def _mean(xs: list[float] | None) -> float | None:
    return round(statistics.fmean(xs), 1) if xs else None


def _median(xs: list[float] | None) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def _monitor_cost(exit_: dict[str, Any] | None) -> dict[str, Any] | None:
    """The sampler's own CPU use from its exit record, as a share of one core (the budget is 1%)."""
    if not exit_ or not exit_.get("wall_s") or exit_.get("sampler_cpu_s") is None:
        return None
    wall = float(exit_["wall_s"])
    return {
        "sampler_cpu_s": exit_["sampler_cpu_s"],
        "core_share": round(float(exit_["sampler_cpu_s"]) / wall, 5),
        "parts_core_share": {k: round(float(v) / wall, 5) for k, v in (exit_.get("sampler_cpu_parts_s") or {}).items()},
        "members_max": exit_.get("members_max"),
    }


def _phase_order(by_phase: dict[str, Peaks], intervals: list[Interval]) -> list[str]:
    """Phases in the order they first began; `outside` first."""
    seen: list[str] = [OUTSIDE] if OUTSIDE in by_phase else []
    for iv in intervals:
        if iv.name not in seen:
            seen.append(iv.name)
    return [n for n in seen if n in by_phase] + sorted(n for n in by_phase if n not in seen)


def _f(v: float | None, nd: int = 2) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def _gpu_cells(pk: dict[str, Any], gpus: list[int]) -> list[str]:
    cells = []
    for i in gpus:
        g = pk["gpu"].get(str(i))
        if g is None:
            cells.append("–")
            continue
        by = ", ".join(f"{c} {v:.2f}" for c, v in g["by_class_gib"].items())
        cells.append(f"{g['used_gib']:.2f}" + (f" ({by})" if by else ""))
    return cells


def rank_line(rank: RankSpec) -> str:
    """What a rank rehearsal's figures are, and what they leave out, wherever they are shown."""
    r, n = rank.rank, rank.world
    return (
        f"**rank rehearsal ({r} of {n})**: one GPU ran rank {r} of a {n}-GPU job through PyTorch's fake "
        "process group, so the memory is that rank's; not measured: NCCL buffers, communication time, "
        "imbalance between ranks; step time and tokens/s are this rank's compute alone, not the job's speed"
    )


def render_markdown(summary: dict[str, Any], png: str | None, rank: RankSpec | None = None) -> str:
    gpus = [g["index"] for g in summary["gpus"]]
    gh = [f"GPU{i} used GiB (by process class)" for i in gpus]
    lines = [f"# Memory report: {summary['run_dir']}", ""]
    if rank:
        lines.append(f"- {rank_line(rank)}")
    cmd = " ".join(summary["cmd"] or ["?"])
    lines.append(f"- command: `{cmd[:300]}`")
    ec = summary["exit_code"]
    cut = summary.get("samples_cut")
    if cut:
        lines.append(f"- {cut_line(cut)}")
    if ec is not None:
        from_file = cut is not None and not cut.get("exit_record")
        lines.append(f"- exit code: {ec}" + (f" (as the launcher recorded it in {EXIT_CODE})" if from_file else ""))
    else:
        lines.append("- exit code: none: the monitor did not finish (killed?)")
    if summary.get("ended"):
        lines.append(f"- {ending.one_line(summary['ended'])}")
    lines.append(
        f"- {summary['samples']} samples every {summary['interval_s']} s over {summary['wall_s']:.1f} s"
        + (f"; {summary['skipped_lines']} unreadable lines skipped" if summary["skipped_lines"] else "")
    )
    cost = summary.get("monitor")
    if cost:
        parts = ", ".join(f"{k} {100 * v:.2f}%" for k, v in cost["parts_core_share"].items())
        lines.append(
            f"- monitor's own CPU: {100 * cost['core_share']:.2f}% of one core"
            + (f" ({parts})" if parts else "")
            + (f", up to {cost['members_max']} processes" if cost.get("members_max") else "")
        )
    if summary["gpus"]:
        lines.append(
            "- GPUs: " + "; ".join(f"{g['index']}: {g['name']} {g['total_gib']:.1f} GiB" for g in summary["gpus"])
        )
    else:
        lines.append(f"- no GPU fields: {summary['nvml_error']}")
    boot = summary.get("startup") or {}
    if boot.get("stages"):
        lines += ["", f"## Start-up: {_f(boot.get('to_first_step_s'), 1)} s from launch to step 1", ""]
        lines += [_row(["stage", "s", "at s"]), _row(["---"] * 3)]
        lines += [_row([st["stage"], _f(st["s"], 1), _f(st["at_s"], 1)]) for st in boot["stages"]]
        if boot.get("vllm_s"):
            lines += ["", "vLLM's own timings: " + "; ".join(f"{k} {v:.1f} s" for k, v in boot["vllm_s"].items())]
        picks = startup.picks_line(boot.get("vllm_picks") or {})
        if picks:
            lines += ["", picks]
    split_rows = summary.get("gen_split") or []
    if split_rows:
        lines += ["", "## Where gen goes, per step (s)", ""]
        lines += gen_split.markdown(split_rows)
    lines += ["", "## Peak per phase, all steps", ""]
    head = ["phase", "time s", "samples", *gh, "host RSS GiB", "host PSS GiB"]
    lines += [_row(head), _row(["---"] * len(head))]
    for name, pk in summary["phases"].items():
        h = pk["host"]
        lines.append(
            _row(
                [
                    name,
                    _f(pk["duration_s"]),
                    str(pk["samples"]),
                    *_gpu_cells(pk, gpus),
                    _f(h["rss_gib"]),
                    _f(h["pss_gib"]),
                ]
            )
        )
    lines += _load_lines(summary.get("load") or {}, gpus)
    lines += ["", "## Per step and phase", ""]
    head = ["step", "phase", "time s", "samples", *gh, "host RSS GiB"]
    lines += [_row(head), _row(["---"] * len(head))]
    for st in summary["steps"]:
        for name, pk in st["phases"].items():
            lines.append(
                _row(
                    [
                        str(st["step"]),
                        name,
                        _f(pk["duration_s"]),
                        str(pk["samples"]),
                        *_gpu_cells(pk, gpus),
                        _f(pk["host"]["rss_gib"]),
                    ]
                )
            )
    lines += [
        "",
        "## NVML device peak against verl's perf/max_memory_reserved_gb",
        "",
        "verl's number is the torch caching allocator's peak in one training worker (max over ranks);",
        "NVML's is the whole device: CUDA contexts, NCCL buffers, vLLM's KV cache and weights,",
        "every process.",
        "",
    ]
    head = [
        "step",
        "step s",
        "throughput",
        "MFU (verl)",
        "NVML peak GiB (max GPU)",
        "verl max reserved GiB",
        "NVML − verl GiB",
    ]
    lines += [_row(head), _row(["---"] * len(head))]
    for st in summary["steps"]:
        lines.append(
            _row(
                [
                    str(st["step"]),
                    _f(st["time_s"]),
                    _f(st["throughput"], 1),
                    ", ".join(f"{k} {100 * v:.1f}%" for k, v in (st.get("mfu") or {}).items()) or "-",
                    _f(st["nvml_peak_gib"]),
                    _f(st["verl_max_reserved_gib"]),
                    _f(st["nvml_minus_verl_reserved_gib"]),
                ]
            )
        )
    if png:
        lines += ["", f"![memory timeline]({png})"]
    return "\n".join(lines) + "\n"


def _load_lines(load: dict[str, Any], gpus: list[int]) -> list[str]:
    """The load table: absent for runs recorded before the monitor read it, or without readings."""
    if not any(v["gpus"] or v["cpu_cores"] for v in load.values()):
        return []
    lines = ["", "## Load per phase, steps 2+ (NVML and /proc, read at 2 Hz)", ""]
    head = ["phase", "readings"]
    for i in gpus:
        head += [f"GPU{i} busy %", f"GPU{i} SM MHz", f"GPU{i} W"]
    head.append("host cores busy (by process class)")
    whole = any(v.get("host_cpu") for v in load.values())
    if whole:
        head.append("host cores busy / stolen (all processes)")
    lines += [_row(head), _row(["---"] * len(head))]
    for name, v in load.items():
        cells = [name, str(max([g["readings"] for g in v["gpus"].values()] + [v["host_readings"]]))]
        for i in gpus:
            g = v["gpus"].get(str(i), {})
            cells += [_f(g.get("util_pct"), 0), _f(g.get("sm_mhz"), 0), _f(g.get("power_w"), 0)]
        cores = v["cpu_cores"]
        top = sorted(cores.items(), key=lambda kv: -kv[1])
        cells.append(
            f"{sum(cores.values()):.1f} (" + ", ".join(f"{c} {x:.1f}" for c, x in top if x >= 0.05) + ")"
            if cores
            else "–"
        )
        if whole:
            h = v.get("host_cpu")
            cells.append(f"{h['busy']:.1f} / {h['steal']:.2f}" if h else "–")
        lines.append(_row(cells))
    return lines


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


_COLORS = [
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#1f77b4",
    "#17becf",
]


def render_timeline(run_dir: Path, out_png: Path) -> None:
    """Memory per GPU (and host RSS) against time, with one coloured band per PPO phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    recs, _ = read_jsonl(run_dir / SAMPLES)
    samples = [r for r in recs if r.get("kind") == "sample"]
    start = next((r for r in recs if r.get("kind") == "start"), {})
    t0 = start.get("t", samples[0]["t"])
    ph, _ = read_jsonl(run_dir / PHASES)
    intervals = [iv for iv in load_intervals(ph, samples[-1]["t"]) if iv.name != "step"]
    gpus = sorted({g["index"] for s in samples for g in s.get("gpus", [])})
    rows = 2 if gpus else 1
    fig, axes = plt.subplots(rows, 1, figsize=(12, 3.2 * rows + 0.8), sharex=True, squeeze=False)
    ts = [s["t"] - t0 for s in samples]
    colors: dict[str, str] = {}
    for iv in intervals:
        colors.setdefault(iv.name, _COLORS[len(colors) % len(_COLORS)])
    if gpus:
        ax = axes[0][0]
        for i in gpus:
            ys = [next((g["used"] / GIB for g in s["gpus"] if g["index"] == i), math.nan) for s in samples]
            ax.plot(ts, ys, lw=1.2, label=f"GPU{i}")
        for g in start.get("gpus", []):
            ax.axhline(g["total_bytes"] / GIB, color="grey", lw=0.6, ls=":")
        ax.set_ylabel("device used, GiB (NVML)")
        ax.legend(loc="upper left", fontsize=8)
    hax = axes[-1][0]
    hosted = [(t, s["host"]) for t, s in zip(ts, samples, strict=True) if "host" in s]
    hax.plot([t for t, _ in hosted], [h["rss"] / GIB for _, h in hosted], lw=1.2, color="black", label="host RSS (sum)")
    pss = [(t, h["pss"] / GIB) for t, h in hosted if h.get("pss") is not None]
    if pss:
        hax.plot([p[0] for p in pss], [p[1] for p in pss], "o", ms=2.5, color="tab:purple", label="host PSS (sum)")
    hax.set_ylabel("host, GiB")
    hax.set_xlabel("seconds since start")
    hax.legend(loc="upper left", fontsize=8)
    for row in axes:
        for iv in intervals:
            row[0].axvspan(iv.begin - t0, iv.end - t0, color=colors[iv.name], alpha=0.18, lw=0)
    if colors:
        fig.legend(
            handles=[Patch(color=c, alpha=0.4, label=n) for n, c in colors.items()],
            loc="upper center",
            ncol=min(len(colors), 8),
            fontsize=8,
            frameon=False,
        )
    fig.tight_layout(rect=(0, 0, 1, 0.93 if colors else 1))
    fig.savefig(out_png, dpi=110, format="png")
    plt.close(fig)


def write_report(run_dir: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Write summary.json, report.md and timeline.png; return the summary."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        raise RecipeError(f"{run_dir}: no such folder; give the --out DIR of `verl-recipes monitor` (a run folder)")
    if not (run_dir / SAMPLES).is_file() and not (run_dir / (SAMPLES + ".gz")).is_file():
        raise RecipeError(f"{run_dir}: no {SAMPLES}; give the --out DIR of `verl-recipes monitor`")
    out = (out_dir or run_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(run_dir)
    # each file is renamed into place whole; summary.json last, so a report cut short is redone by
    # the next `report` and never read as complete (the tables read summary.json)
    with inflight.staged_file(out / TIMELINE, "the timeline") as tmp:
        render_timeline(run_dir, tmp)
    rank = read_provenance(run_dir).rank_rehearsal
    inflight.write_text(out / REPORT, render_markdown(summary, TIMELINE, rank), "the report")
    with inflight.writing("the summary", out / SUMMARY):
        write_summary(out, summary)
    return summary


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="tables and a timeline PNG from a monitored run",
        description="Write summary.json, report.md and timeline.png for a `verl-recipes monitor` run dir.",
    )
    p.add_argument("run_dir", type=Path, help="the --out DIR of verl-recipes monitor")
    p.add_argument("--out", type=Path, default=None, help="where to write (default: RUN_DIR)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = args.out or args.run_dir
    summary = write_report(args.run_dir, args.out)
    print(
        f"wrote {out}/summary.json, report.md, timeline.png ({summary['samples']} samples, "
        f"{len(summary['steps'])} steps)"
    )
    return 0
