"""The run folder: its file names, its JSON-lines records and the schema of summary.json.

One folder holds everything one run leaves: what the launcher wrote before verl started (the
composed config, the command, provenance), what the monitor and the phase markers recorded while
it ran (samples, phases, metrics, the log) and what the report derived afterwards (summary,
Markdown, timeline). Every module that writes or reads one of these goes through the names and
readers here, so a file is renamed or its schema moved in one place.

Every process of a run finds the folder through RUN_DIR_ENV, which the launcher and the monitor set
and Ray passes on to its workers. Standard library only: the phase markers write through this
module inside Ray workers.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypedDict

from verl_recipes import RecipeError
from verl_recipes.inflight import write_text
from verl_recipes.layout import POOLS_SHARED, RankSpec

#: set by the monitor and the launcher for every process of a run: where phases and metrics go.
RUN_DIR_ENV = "VERL_RECIPES_RUN_DIR"

# Written before verl starts (`verl-recipes train`).
CONFIG = "verl_config.yaml"  # the composed config verl starts on (--config-path RUN_DIR)
COMMAND = "command.sh"  # the exact command, for a GPU host to run again
PROVENANCE = "provenance.json"  # versions, GPUs, git commit, the launcher's inputs
MODEL_CONFIG = "model_config.json"  # the model's config.json, when it is not a bundled architecture
# Written while it runs.
SAMPLES = "samples.jsonl"  # the monitor: NVML and host memory (committed runs keep SAMPLES + ".gz")
PHASES = "phases.jsonl"  # the phase markers: begin/end of each of verl's marked_timer phases
METRICS = "metrics.jsonl"  # the phase markers: what verl's Tracking.log logged, per step
GEN_SPLIT = "gen_split.jsonl"  # the parts of verl's gen phase (verl_recipes.worker.gen_split)
VERL_METRICS = "verl_metrics.jsonl"  # verl's own file logger (VERL_FILE_LOGGER_PATH)
LOG = "train.log"  # stdout and stderr of the monitored trainer (committed runs keep LOG + ".gz")
EXIT_CODE = "exit_code"
INCOMPLETE = "incomplete.json"  # while the launcher works in the folder (pid, command): gone when it finishes
RAY_LOGS = "ray-logs"  # tails of the run's Ray worker logs that carry an error (measure.ending)
RAY_ERRORS = "ray-logs/errors.json"  # their last error lines: {"session", "errors": [{file, last_error}]}
PROFILE = "profile"  # verl's torch profiler traces, when global_profiler.tool is set
PROFILE_SUMMARY = "summary.md"  # in PROFILE: `verl-recipes trace` of every trace there
CAP_EXCEEDED = "cap_exceeded.txt"  # why a --cap-gib run did not fit its budget
CHECKPOINTS = "checkpoints"  # verl's trainer.default_local_dir: what a resumed run continues from
# Derived afterwards (`verl-recipes report`).
SUMMARY = "summary.json"
REPORT = "report.md"
TIMELINE = "timeline.png"

SUMMARY_SCHEMA = "verl-recipes/monitor-summary/1"


# --- summary.json -------------------------------------------------------------------------------
# Sizes in GiB (1024**3 bytes), times in seconds, None where not measured; on a host without NVML
# "gpus" is [] and every "gpu" map is {}. GPU maps are keyed by the NVML index as a string.


class HostPeaks(TypedDict):
    rss_gib: float | None  # summed over the monitored processes (shared pages once per process)
    pss_gib: float | None  # sampled every few seconds; counts shared pages once
    uss_gib: float | None


class GpuPeak(TypedDict):
    used_gib: float  # NVML device total: every process on the GPU
    by_class_gib: dict[str, float]  # per process class (measure.monitor.CLASSES), maximised apart


class Peaks(TypedDict):
    samples: int
    duration_s: float | None
    gpu: dict[str, GpuPeak]
    host: HostPeaks


class GpuInfo(TypedDict):
    index: int
    name: str
    total_gib: float


class MonitorCost(TypedDict):
    """The sampler's own CPU, from the monitor's exit record."""

    sampler_cpu_s: float
    core_share: float
    parts_core_share: dict[str, float]
    members_max: int | None


class Ended(TypedDict):
    """How the run ended (measure.ending): the step and innermost phase open at the end, the signal
    or exit code, and the last error line any of its processes wrote, with the file it is in."""

    ok: bool
    exit_code: int | None
    signal: str | None
    step: int | None
    phase: str | None
    last_error: str | None
    error_file: str | None


class StartupStage(TypedDict):
    stage: str
    s: float
    at_s: float  # from the monitor's start


class Startup(TypedDict):
    """The time before step 1, stage by stage from verl's log stamps (measure.startup)."""

    to_first_step_s: float | None
    stages: list[StartupStage]
    vllm_s: dict[str, float]  # vLLM's own start-up timings


class StepSummary(TypedDict):
    step: int
    time_s: float | None  # metrics timing_s/step, else the step interval
    timing_s: dict[str, float | None]  # metrics timing_s/*, else from the phase intervals
    throughput: float | None  # metrics perf/throughput
    mfu: dict[str, float]  # metrics perf/mfu/* by role (verl's FLOP count over the phase time)
    verl_memory_gib: dict[str, float]  # every */max_memory_{allocated,reserved}_gb metric
    verl_max_reserved_gib: float | None
    nvml_peak_gib: float | None  # max over GPUs of the device peak during the step
    nvml_minus_verl_reserved_gib: float | None
    peak: Peaks  # the whole step
    phases: dict[str, Peaks]


class Summary(TypedDict, total=False):
    """summary.json, schema SUMMARY_SCHEMA (written by measure.report, read through read_summary)."""

    schema: str
    run_dir: str
    cmd: list[str] | None
    exit_code: int | None  # None: the monitor did not finish (killed, OOM)
    ended: Ended
    wall_s: float
    startup: Startup
    interval_s: float
    samples: int
    #: where samples.jsonl(.gz) ends early, None when read whole: {file, line (the first not read
    #: whole), t (epoch s of the last record before it), at_s (from the start), exit_record (the
    #: monitor's exit record was read; else exit_code is the launcher's `exit_code` file)}
    samples_cut: dict[str, Any] | None
    skipped_lines: int
    nvml_error: str | None  # why there are no GPU fields
    gpus: list[GpuInfo]
    peak: Peaks  # over the whole run
    phases: dict[str, Peaks]  # over all steps, by verl's marked_timer names (`outside`: no step)
    monitor: MonitorCost | None
    steps: list[StepSummary]


#: the first step counted in a run's step time and throughput: step 1 carries one-off costs (vLLM's
#: CUDA graphs and torch.compile, the allocator's warm-up, the first weight sync's buffers).
STEADY_FROM = 2


def steady_steps(steps: list[StepSummary]) -> list[StepSummary]:
    """The steps a run's speed is read from: step 2 onwards, or every step of a one-step run."""
    later = [s for s in steps if int(s.get("step") or 0) >= STEADY_FROM]
    return later or steps


def read_summary(run_dir: Path) -> Summary:
    """A run's summary.json, checked against the schema; one line says what to do when it is not there."""
    path = run_dir / SUMMARY
    if not run_dir.is_dir():
        raise RecipeError(f"{run_dir}: no such folder; give a run folder (the --run-dir of `verl-recipes train`)")
    if not path.is_file():
        raise RecipeError(f"{run_dir}: no {SUMMARY}; run `verl-recipes report {run_dir}` first")
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise RecipeError(
            f"{path}: not whole JSON (it ends early: {e.msg} at line {e.lineno}); rerun `verl-recipes report {run_dir}`"
        ) from None
    except OSError as e:
        raise RecipeError(f"{path}: not readable: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else None
        raise RecipeError(f"{path}: schema {found!r}, expected {SUMMARY_SCHEMA!r}; rerun `verl-recipes report`")
    summary: Summary = data  # type: ignore[assignment]
    return summary


def write_summary(out_dir: Path, summary: Mapping[str, Any]) -> Path:
    """summary.json, written under a temporary name and renamed: a reader sees all of it or none."""
    path = out_dir / SUMMARY
    write_text(path, json.dumps(summary, indent=1) + "\n", "the run's summary")
    return path


def measured_runs(base: Path) -> list[Path]:
    """The run folders under `base` that have a readable summary (committed results nest them:
    run/verl/). A summary that is cut short or not this schema is named in one line and left out,
    so every table is still written from the others."""
    runs = []
    for p in sorted(base.glob(f"**/{SUMMARY}")):
        try:
            read_summary(p.parent)
        except RecipeError as e:
            warn_once(p, f"{e}; left out of the tables")
            continue
        runs.append(p.parent)
    return runs


# --- provenance.json ----------------------------------------------------------------------------
# Written once by `verl-recipes train` (measure.provenance.record plus the launcher's inputs), before
# verl starts; a run of recipe verl-vs-deepspeed's DeepSpeed loop gets one copied from its run.json
# (`backend: deepspeed`). Records written before a key existed lack it: each field says what its
# absence means.


@dataclass(frozen=True)
class Provenance:
    """A run's provenance.json as every reader sees it; `raw` is the record as written."""

    date_utc: str | None  # when the launcher started the run, ISO 8601 UTC
    command: list[str]  # the trainer's command line as the monitor started it
    argv: list[str]  # the `verl-recipes train ...` command line that made the run
    recipe: str | None  # the recipe id
    variants: list[str]  # the recipe's variants, in the order they composed
    sets: list[str]  # the KEY=VALUE overrides given with --set
    steps: int | None  # --steps
    cap_gib: float | None  # --cap-gib: the per-GPU budget a larger GPU stood in for (None: no cap)
    gpu_names: list[str]  # NVML's name of every GPU of the host ([] without NVML)
    #: the verl fixes turned off with --verl-fix-off; None: recorded before the key existed
    verl_fixes_off: list[str] | None
    #: the verl fixes the run applied; None: recorded before the key existed
    verl_fixes: list[str] | None
    #: rank R of a job of N GPUs when one GPU ran it (`train --rank`); None: a full run
    rank_rehearsal: RankSpec | None = None
    #: the training loop when it is not verl's trainer: `deepspeed` for recipe verl-vs-deepspeed's
    #: ZeRO-3 loop (its compare.py writes the record from run.json); None: verl, which every
    #: `verl-recipes train` run is (its engine, FSDP or Megatron, is in verl_config.yaml)
    backend: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_record(cls, raw: dict[str, Any]) -> Provenance:
        def strs(key: str) -> list[str]:
            return [str(x) for x in raw.get(key) or ()]

        def listed(key: str) -> list[str] | None:
            return strs(key) if key in raw else None

        cap, steps, rank = raw.get("cap_gib"), raw.get("steps"), raw.get("rank_rehearsal")
        return cls(
            date_utc=str(raw["date_utc"]) if raw.get("date_utc") else None,
            command=strs("command"),
            argv=strs("argv"),
            recipe=str(raw["recipe"]) if raw.get("recipe") else None,
            variants=strs("variants"),
            sets=strs("sets"),
            steps=int(steps) if steps is not None else None,
            cap_gib=float(cap) if cap is not None else None,
            gpu_names=[str(g.get("name", "")) for g in (raw.get("gpu") or {}).get("gpus") or ()],
            verl_fixes_off=listed("verl_fixes_off"),
            verl_fixes=listed("verl_fixes"),
            rank_rehearsal=RankSpec.from_record(rank),
            backend=str(raw["backend"]) if raw.get("backend") else None,
            raw=raw,
        )

    @property
    def verl(self) -> bool:
        """Whether verl's trainer made the run: the planner re-plans only such runs (from the
        verl_config.yaml beside them), and only their names carry no backend label."""
        return self.backend is None

    @property
    def rank_pools_shared(self) -> bool:
        """Whether a rank rehearsal ran only its share of the job's CPU worker pools
        (`layout.JOB_POOLS`); a rehearsal recorded without the key ran them whole."""
        rank = self.raw.get("rank_rehearsal")
        return bool(isinstance(rank, dict) and rank.get("pools") == POOLS_SHARED)

    @property
    def user_sets(self) -> tuple[str, ...]:
        """The `--set` lines the command that made the run gave, in order (`sets` holds them
        after everything a recipe or a verl script composed before them)."""
        return tuple(v for k, v in zip(self.argv[:-1], self.argv[1:], strict=True) if k == "--set")

    def argv_value(self, flag: str) -> str | None:
        """The value given to `flag` on the command line that made the run (None: not given)."""
        return self.argv[self.argv.index(flag) + 1] if flag in self.argv[:-1] else None


def read_provenance(run_dir: Path) -> Provenance:
    """The run's provenance record (every field empty for a run folder without one, or one cut
    short: a line says where it ends, and the run's tables are still written; `raw` is then {})."""
    path = run_dir / PROVENANCE
    if not path.is_file():
        return Provenance.from_record({})
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        warn_once(path, f"not whole JSON (it ends early: {e.msg} at line {e.lineno}); read as no provenance")
        return Provenance.from_record({})
    return Provenance.from_record(raw if isinstance(raw, dict) else {})


def write_provenance(run_dir: Path, record: dict[str, Any]) -> Path:
    """provenance.json, written under a temporary name and renamed (as `write_summary`)."""
    path = run_dir / PROVENANCE
    write_text(path, json.dumps(record, indent=2) + "\n", "the run's provenance")
    return path


# --- JSON lines ---------------------------------------------------------------------------------
# Each record is one write(2) to an O_APPEND file: several processes may append to one file, and a
# kill (OOM, kill -9) loses nothing already written, at most a torn last line that readers skip.


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class JsonlWriter:
    """Append JSON lines to a file, one write(2) per line, nothing buffered in this process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        data = _encode(record)
        with self._lock:
            _write_all(self._fd, data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


_append_lock = threading.Lock()
_append_fds: dict[str, tuple[int, int]] = {}  # path -> (pid that opened it, fd); reopened after fork


def append(name: str, record: dict[str, Any]) -> None:
    """Append a record to file `name` of the run folder RUN_DIR_ENV names; nothing without one.

    For processes that know their run only by the environment (Ray workers): the file is opened
    once per process and again after a fork.
    """
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    path = os.path.join(run_dir, name)
    data = _encode(record)
    with _append_lock:
        pid = os.getpid()
        entry = _append_fds.get(path)
        if entry is None or entry[0] != pid:
            os.makedirs(run_dir, exist_ok=True)
            entry = (pid, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
            _append_fds[path] = entry
        _write_all(entry[1], data)


def _open_either(path: Path) -> tuple[Path, IO[str]] | None:
    """PATH, or its gzipped form PATH.gz where the plain one is absent (committed results keep
    their large files gzipped), opened as text; None when neither is there."""
    gz = path.with_name(path.name + ".gz")
    if path.is_file():
        return path, open(path, encoding="utf-8", errors="replace")  # the caller closes it
    if gz.is_file():
        return gz, gzip.open(gz, "rt", encoding="utf-8", errors="replace")
    return None


def read_log(path: Path) -> str:
    """A run's text log (`LOG`), or its gzipped form: committed results keep their logs gzipped as
    they keep their samples (a ninth of the size; the repository travels to a GPU host beside a
    wheelhouse piece, so its size is taken from each piece). "" when neither is there; a gzip cut
    short is read up to where it ends, and one line on stderr says so."""
    opened = _open_either(path)
    if opened is None:
        return ""
    src, text = opened
    out: list[str] = []
    with text as f:
        try:
            for line in f:
                out.append(line)
        except (EOFError, OSError, zlib.error) as e:
            warn_once(src, f"ends early after line {len(out)} ({type(e).__name__}: {e}); read up to there")
    return "".join(out)


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Parse a JSONL file; return (records, number of unparseable lines skipped).

    Committed results keep their samples gzipped (PATH.gz, a tenth of the size, so the repository
    still travels to a GPU host beside a wheelhouse chunk); either form is read.

    A file that ends early (a killed writer's torn last line, a gzip cut short by a copy) is read
    up to where it ends, and one line on stderr says where; the callers' tables are still written.
    """
    records: list[dict[str, Any]] = []
    bad = 0
    opened = _open_either(path)
    if opened is None:
        return records, bad
    src, text = opened
    _cut.pop(str(path), None)
    n = 0
    last = ""
    with text as f:
        try:
            for line in f:
                n += 1
                last = line
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    bad += 1
        except (EOFError, OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            _cut[str(path)] = Cut(src.name, n if last and not last.endswith("\n") else n + 1, _last_t(records))
            warn_once(
                src,
                f"ends early after line {n} ({type(e).__name__}: {e}); read the {len(records)} records before it",
            )
            return records, bad
    if last and not last.endswith("\n") and last.strip():
        try:
            json.loads(last)
        except json.JSONDecodeError:
            _cut[str(path)] = Cut(src.name, n, _last_t(records))
            warn_once(src, f"ends early: line {n} is cut short; read the {len(records)} records before it")
    return records, bad


@dataclass(frozen=True)
class Cut:
    """Where a JSON-lines file read by `read_jsonl` ends early: its name as read (PATH or PATH.gz),
    the first line not read whole, and the time ("t", epoch seconds) of the last record before it."""

    file: str
    line: int
    t: float | None


_cut: dict[str, Cut] = {}


def cut_of(path: Path) -> Cut | None:
    """Where `path` (or PATH.gz) ended early when `read_jsonl` last read it in this process; None
    when it was read whole."""
    return _cut.get(str(path))


def _last_t(records: list[dict[str, Any]]) -> float | None:
    return next((float(r["t"]) for r in reversed(records) if isinstance(r.get("t"), int | float)), None)


_warned: set[str] = set()


def warn_once(path: Path, text: str) -> None:
    """One line on stderr about a run file that is cut short or unreadable, once per file and process."""
    if str(path) in _warned:
        return
    _warned.add(str(path))
    print(f"warning: {path}: {text}", file=sys.stderr)
