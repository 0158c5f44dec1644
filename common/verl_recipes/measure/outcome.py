"""What a finished run leaves behind, and the one line it ends with.

After verl exits, `train` hands the run folder here: its exit code, the Ray worker errors of a
run that failed (`ending`), the report, the profiler's summary, and the verdict (a failure names
its cause; a `--cap-gib` run whose device total went over the cap is refused). Each step reads
the run folder only, so a run measured on one host can be concluded on another, and a step that
cannot be done (a missing log, a full disk) says so without hiding the run's own outcome.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, inflight, rundir
from verl_recipes.measure import ending, report, trace


def conclude(run_dir: Path, rc: int, cap_gib: float | None) -> int:
    """Everything measured about a run that exited `rc`; raises the one line a failed or over-cap
    run ends with, returns 0 for a run that did what it was asked."""
    inflight.write_text(run_dir / rundir.EXIT_CODE, f"{rc}\n", "the run's exit code")
    worker_errors(run_dir, rc)
    write_report(run_dir)
    try:
        summarize_traces(run_dir)
    except (OSError, MemoryError) as e:  # the run's own outcome below still has to be said
        print(f"profile summary not written: {e}", file=sys.stderr)
    if rc != 0:
        why = failure_reason(run_dir, rc)
        raise RecipeError(f"verl exited {rc}{why}; the log and everything measured up to then are in {run_dir}")
    if cap_gib:
        over = cap_overrun(run_dir, cap_gib)
        if over:
            inflight.write_text(run_dir / rundir.CAP_EXCEEDED, over + "\n", "the cap's overrun")
            raise RecipeError(over)
    print(f"run folder: {run_dir}")
    return 0


def write_report(run_dir: Path) -> None:
    """summary.json, report.md and the timeline (`report`); a run that left too little to report
    on is said in one line, and its outcome is still given."""

    try:
        summary = report.write_report(run_dir)
    except Exception as e:  # the report is evidence about the run, never a reason to hide its end
        print(f"report not written: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return
    print(
        f"wrote {run_dir}/{rundir.SUMMARY}, {rundir.REPORT}, {rundir.TIMELINE} ({summary['samples']} samples, "
        f"{len(summary['steps'])} steps)"
    )


def failure_reason(run_dir: Path, rc: int) -> str:
    """`; FILE: LAST ERROR` for the line a failed run ends with: the same cause the report's
    `ended` names (`ending.describe`), so Ray's teardown lines are never given as the reason."""

    phases, _ = rundir.read_jsonl(run_dir / rundir.PHASES)
    ended = ending.describe(run_dir, rc, phases)
    return f"; {ended['error_file']}: {ended['last_error']}" if ended.get("last_error") else ""


def worker_errors(run_dir: Path, rc: int) -> list[dict[str, Any]]:
    """The Ray worker errors of a run that did not exit 0, kept in its folder. Ray's logs of a
    clean exit hold only its teardown (intended exits, force-killed actors, a SIGTERM to the
    dashboard), which reads like errors and says nothing: 42 files of them per 7B run."""
    return collect_worker_errors(run_dir) if rc != 0 else []


def collect_worker_errors(run_dir: Path) -> list[dict[str, Any]]:
    """The run's Ray worker logs that carry an error, copied into RUN_DIR/ray-logs/ (`ending`)."""

    recs, _ = rundir.read_jsonl(run_dir / rundir.SAMPLES)
    start = next((r for r in recs if r.get("kind") == "start"), {})
    pid = start.get("pid")
    try:
        return ending.collect_ray_logs(run_dir, int(pid) if pid else None)
    except OSError as e:
        print(f"ray logs: not collected: {e}", file=sys.stderr)
        return []


def summarize_traces(run_dir: Path) -> Path | None:
    """RUN_DIR/profile/summary.md from the torch profiler's traces, when the run was profiled: a
    7B stage's trace is tens of MB of events, and the table is what a reader (or a host whose
    results travel with a size limit) keeps."""
    prof = run_dir / rundir.PROFILE
    summary = prof / rundir.PROFILE_SUMMARY
    if not prof.is_dir() or summary.exists():
        return None

    if not trace.traces_in(prof):
        return None
    summary.write_text(trace.folder_markdown(prof))
    return summary


def cap_overrun(run_dir: Path, cap_gib: float) -> str | None:
    """The first phase whose device total (NVML, every process on the GPU) went over the cap.

    The cap is enforced per process (torch's memory fraction, vLLM's share), but the question a
    24 GiB card asks is the device total, so that is what decides whether the run fitted.
    """
    summary = rundir.read_summary(run_dir)
    worst: tuple[float, str, str] | None = None
    for phase, rec in (summary.get("phases") or {}).items():
        for gpu, g in (rec.get("gpu") or {}).items():
            used = float(g.get("used_gib") or 0.0)
            if used > cap_gib and (worst is None or used > worst[0]):
                worst = (used, phase, gpu)
    if worst is None:
        return None
    used, phase, gpu = worst
    return (
        f"device total {used:.2f} GiB in phase {phase} on GPU {gpu} is over the --cap-gib {cap_gib:g} budget "
        f"(NVML, all processes); the run is in {run_dir}: raise the cap or change the knobs `verl-recipes plan` names"
    )
