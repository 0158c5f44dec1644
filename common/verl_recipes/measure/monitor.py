"""`verl-recipes monitor`: sample GPU (NVML) and host memory of a command, as JSONL.

Why device-level: verl reports the torch allocator's peak of one process (perf/max_memory_*),
but an OOM is decided by the device's total: the FSDP workers, the vLLM engine, CUDA contexts and
NCCL buffers together. NVML sees all of them, per process, so we sample it and name each process
from its command line (the Ray actor class is in the process title: `ray::WorkerDict`,
`VLLM::EngineCore`, ...).

What is sampled:
- every `interval` seconds (default 0.1 s = 10 Hz), each visible GPU (all NVML devices, narrowed by
  CUDA_VISIBLE_DEVICES when it lists indices or UUIDs): used = total - free memory. This is the
  number an OOM is decided by, so it is the one sampled fastest;
- every `procs_s` (default 0.5 s), per GPU: utilization, SM clock, power draw and NVML's clock
  event reasons (why the clock is below its maximum: power cap, heat, ...), and every compute
  process with its used memory (which process holds what; it changes at phase boundaries, not
  within 100 ms). A phase that runs slower than its twin with the GPU half idle is waiting on the
  host; one that runs slower at full utilization and a lower clock is the GPU held back;
- every `host_s` (default 0.5 s), host memory of the monitored process set: RSS of every member;
  USS and PSS (from /proc/PID/smaps_rollup, slower) every `full_mem_s` at most, and no more often
  than keeps their cost under `full_mem_share` of one core (see Overhead), and besides at each new
  RSS high more than 10% above the RSS of the highest USS/PSS read so far (`PEAK_RISE`, at most
  every `PEAK_GAP_S`), so that a host peak of seconds has its PSS read; and with each RSS reading
  the CPU cores each process class kept busy since the previous one (utime + stime from
  /proc/PID/stat), which names the process that competes with a phase for the host.

The monitored process set is the command's process tree, refreshed every `tree_s`, plus any process
whose environment carries VERL_RECIPES_RUN_DIR=<this run dir> (scanned every `env_scan_s`). verl's
launcher calls `ray.init()` without an address, so Ray's daemons and workers are descendants of the
command (checked on Ray 2.60); the environment scan is what finds Ray workers of an externally
started cluster (`ray start`, address=auto), because Ray starts workers with the runtime_env's
env_vars, where the launcher puts VERL_RECIPES_RUN_DIR. A process that lives shorter than `tree_s`
can be missed on the host side.

Output: DIR/samples.jsonl, one JSON object per line, each written with one write(2) on an O_APPEND
file, so an OOM kill or kill -9 of the monitor loses nothing already written (at most a torn last
line on a full disk; readers skip it). Records (`kind`):
- start: t, cmd, pid, interval_s, hostname, host_total_bytes, gpus [{index, uuid, name,
  total_bytes, driver}], nvml_error (why there are no GPU fields, e.g. on a CPU host);
- proc: t, pid, class, name, cmdline (a process joined the set or changed its title);
- sample: t, gpus [{index, used, and every `procs_s`: util, mem_util, sm_mhz, power_w,
  clock_events (NVML's bit mask; null where the driver has none), procs [{pid, used, class}]}],
  and every `host_s`: host {rss, uss, pss (bytes or null), n, by_class {class: rss}, pids {pid: rss},
  cpu_by_class {class: cores busy since the previous host reading; absent on the first},
  host_cpu {busy, steal: the whole host's cores busy and stolen by the hypervisor in that span},
  and read: "peak" on a USS/PSS read taken at an RSS high};
- exit: t, rc, samples, sampler_cpu_s (and per part, sampler_cpu_parts_s), members_max,
  full_reads and peak_reads (USS/PSS reads in all, and those taken at RSS highs), wall_s
  (absent when the monitor itself was killed).

Overhead: the sampler runs in a thread and accounts its own CPU time (time.thread_time) per part;
the exit record carries it (sampler_cpu_s, sampler_cpu_parts_s) and the report prints it as a share
of one core (`monitor` in summary.json). The budget is 1% of a core. Reading every member's RSS and
writing it as JSON dominates a sample (82% of one with 60 members), so host RSS and NVML's
per-process list are read at 2 Hz (`host_s`, `procs_s`) while the device total, which an OOM is
decided by, stays at 10 Hz: with 60 members the host path costs 0.69% of a core on the CI machine
(0.53% steady; tests/test_monitor.py::test_sampler_overhead prints and asserts < 1%) and 0.62% with
NVML on an H200 (2026-11-30, test_sampler_overhead_with_nvml). USS and PSS (smaps_rollup, which
walks every mapping of the CUDA processes) cost 0.32-0.37 s a read for the 51-68 processes of a 7B
verl run on the H200 (three runs, 2026-11-30): read every 60 s they add 0.59-0.64% of a core to the
rest's 0.64-0.70%, so after each read the next one waits that read's cost / `full_mem_share`
(default 0.1% of a core: ~6 minutes there), never less than `full_mem_s`. The reads at RSS highs
come on top, a few per run (each raises the mark by 10%; tests/test_monitor.py counts them). The tree refresh
(0.27-0.34% of a core in those runs) keeps every member's cmdline open and re-reads it with pread,
like statm; the `tree` part that test_sampler_overhead prints shows its cost.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import psutil

from verl_recipes import RecipeError, cli_types, inflight
from verl_recipes.procs import TreeGuard, all_pids, die_with_parent, end, has_marker, marked_pids, run_marker
from verl_recipes.rundir import RUN_DIR_ENV, SAMPLES, JsonlWriter

# USS/PSS reads may take at most this share of one core: on the H200 one read of 51-68 verl
# processes cost 0.32-0.37 s of CPU (smaps_rollup walks every mapping of the CUDA processes).
FULL_MEM_SHARE = 0.001
# A USS/PSS read is also taken when the host RSS climbs more than PEAK_RISE above the RSS of the
# highest USS/PSS read so far, at most every PEAK_GAP_S: the periodic reads, minutes apart, miss a
# host peak that lasts seconds (the load copy of an offloaded 7B recipe: 12 GiB for about 6 s,
# freed at once, so a read after the turn would see it gone). Each read raises the mark, so a run
# whose RSS climbs from 20 to 72 GiB takes at most 14 of them, about 5 s of CPU at the 0.35 s a
# read of a 7B run's processes costs (a bound, not a measurement).
PEAK_RISE = 0.10
PEAK_GAP_S = 5.0

# Process classes, in the order reports list them.
CLASSES = ("driver", "fsdp_worker", "vllm_engine", "ray_worker", "ray_system", "other")

_RAY_TITLE = re.compile(r"^ray::([A-Za-z_][\w]*)")
# verl 0.9.1 worker classes that hold the trained model: WorkerDict (colocated), ActorRolloutRefWorker,
# CriticWorker, TrainingWorker and their subclasses (DetachActorWorker, ...).
_FSDP_CLASS = re.compile(r"^(WorkerDict|.*(Actor|Critic|Ref|Rollout|RewardModel|Training)\w*Worker)$")
_RAY_SYSTEM = ("gcs_server", "raylet", "dashboard", "log_monitor", "autoscaler", "runtime_env", "ray_client")


def classify(cmdline: Sequence[str], *, is_root: bool = False) -> tuple[str, str]:
    """Return (class, short name) of a process from its command line (its title, for Ray actors).

    Ray rewrites a worker's argv to `ray::Class` or `ray::Class.method` (and `ray::IDLE` for a
    pooled worker); vLLM names its engine process `VLLM::EngineCore` (and workers `VLLM::Worker...`).
    """
    line = " ".join(a for a in cmdline if a).strip()
    first = line.split(" ", 1)[0] if line else ""
    if is_root:
        return "driver", _short(line)
    if "VLLM::" in line or "EngineCore" in first:
        return "vllm_engine", first
    m = _RAY_TITLE.match(line)
    if m:
        cls = m.group(1)
        if cls.lower().startswith("vllm") or "LLMServer" in cls:
            return "vllm_engine", first
        if _FSDP_CLASS.match(cls):
            return "fsdp_worker", first
        if cls in ("DashboardAgent", "RuntimeEnvAgent"):
            return "ray_system", first
        return "ray_worker", first
    if "/ray/" in line and any(s in line for s in _RAY_SYSTEM):
        return "ray_system", _short(line)
    return "other", _short(line)


def _short(line: str) -> str:
    """A readable name: the executable's basename and the script or module."""
    parts = line.split()
    if not parts:
        return "?"
    words = [os.path.basename(parts[0])]
    for i, a in enumerate(parts[1:], 1):
        if a == "-m" and i + 1 < len(parts):
            words.append(f"-m {parts[i + 1]}")
            break
        if not a.startswith("-"):
            words.append(os.path.basename(a))
            break
    return " ".join(words)[:80]


def _visible_filter() -> tuple[set[int], set[str]] | None:
    """CUDA_VISIBLE_DEVICES as (indices, uuid prefixes), or None for all devices."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None or cvd.strip() == "" or "MIG-" in cvd:
        return None
    idx: set[int] = set()
    uuids: set[str] = set()
    for tok in (t.strip() for t in cvd.split(",") if t.strip()):
        if tok.isdigit():
            idx.add(int(tok))
        elif tok.startswith("GPU-"):
            uuids.add(tok)
    return idx, uuids


class _Nvml:
    """The GPUs NVML sees; `error` says why there are none (no driver, no library, no GPU)."""

    def __init__(self) -> None:
        self.handles: list[tuple[int, Any]] = []
        self.static: list[dict[str, Any]] = []
        self.error: str | None = None
        try:
            import pynvml

            self._nv = pynvml
            pynvml.nvmlInit()
        except Exception as e:  # no nvidia-ml-py, no libnvidia-ml.so, no driver
            self.error = f"NVML unavailable: {e!s}"
            return
        nv = self._nv
        driver = _str(nv.nvmlSystemGetDriverVersion())
        keep = _visible_filter()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = _str(nv.nvmlDeviceGetUUID(h))
            if keep is not None and i not in keep[0] and not any(uuid.startswith(u) for u in keep[1]):
                continue
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            self.handles.append((i, h))
            self.static.append(
                {
                    "index": i,
                    "uuid": uuid,
                    "name": _str(nv.nvmlDeviceGetName(h)),
                    "total_bytes": int(mem.total),
                    "driver": driver,
                }
            )
        if not self.handles:
            self.error = "NVML found no GPU" + (" in CUDA_VISIBLE_DEVICES" if keep is not None else "")

    def sample(self, procs_too: bool = True) -> list[dict[str, Any]]:
        nv = self._nv
        out = []
        for i, h in self.handles:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            rec: dict[str, Any] = {"index": i, "used": int(mem.total - mem.free)}
            out.append(rec)
            if not procs_too:
                continue
            rec["util"] = rec["mem_util"] = None
            with contextlib.suppress(nv.NVMLError):
                u = nv.nvmlDeviceGetUtilizationRates(h)
                rec["util"], rec["mem_util"] = int(u.gpu), int(u.memory)
            rec["sm_mhz"] = rec["power_w"] = rec["clock_events"] = None
            with contextlib.suppress(nv.NVMLError):
                rec["sm_mhz"] = int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            with contextlib.suppress(nv.NVMLError):
                rec["power_w"] = round(nv.nvmlDeviceGetPowerUsage(h) / 1000, 1)  # NVML: milliwatts
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
                nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
            )
            if reasons is not None:
                with contextlib.suppress(nv.NVMLError):
                    rec["clock_events"] = int(reasons(h))
            procs: list[dict[str, Any]] = []
            with contextlib.suppress(nv.NVMLError):
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    used = p.usedGpuMemory
                    procs.append({"pid": int(p.pid), "used": None if used is None else int(used)})
            rec["procs"] = procs
        return out

    def close(self) -> None:
        if self.error is None or self.handles:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def host_cpu_ticks(stat: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, steal) clock ticks of all the host's cores since boot, from /proc/stat's `cpu` line.

    Busy is user + nice + system + irq + softirq (guest time is inside user); steal is the time a
    virtual machine's cores were ready but the hypervisor ran something else. A lent GPU host is a
    virtual machine: a phase whose worker is bound to one core runs slower when its core is
    stolen, which no process of the run shows, so the monitor reads it beside them.
    """
    raw = _read(stat)
    if not raw or not raw.startswith(b"cpu "):
        return None
    f = [int(x) for x in raw.split(b"\n", 1)[0].split()[1:9]]
    if len(f) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    return user + nice + system + irq + softirq, steal


class _ProcSet:
    """The monitored processes: the command's tree plus processes tagged with our run dir.

    Reads /proc directly (not psutil) because the sampler's budget is 1% of a core at 10 Hz: a parent
    map is kept across refreshes and only pids new since the last listing have their stat read (a pid
    reused within one refresh period would keep its old parent; Linux hands out pids in order, so that
    takes a wrap of pid_max).
    """

    def __init__(self, root_pid: int | None, marker: bytes | None) -> None:
        self.root_pid = root_pid
        self.marker = marker  # b"VERL_RECIPES_RUN_DIR=<dir>" looked for in /proc/PID/environ
        self.members: set[int] = set()
        self.tagged: set[int] = set()  # members found by the environment scan
        self.info: dict[int, tuple[str, str, str]] = {}  # pid -> (class, name, cmdline)
        self._ppid: dict[int, int] = {}
        self._env_checked: set[int] = set()
        self._statm: dict[int, int] = {}  # pid -> open fd of /proc/PID/statm, re-read with pread
        self._cmdline: dict[int, int] = {}  # pid -> open fd of /proc/PID/cmdline (titles change: Ray)
        self._stat: dict[int, int] = {}  # pid -> open fd of /proc/PID/stat (CPU time)
        self._cpu: dict[int, int] = {}  # pid -> utime + stime (clock ticks) at the previous host reading
        self._cpu_at: float | None = None  # when that reading was taken (time.monotonic)
        self._host_ticks: tuple[int, int] | None = None  # (busy, steal) of /proc/stat's cpu line then

    def _pids(self) -> set[int]:
        pids = all_pids()
        for pid in pids - self._ppid.keys():
            stat = _read(f"/proc/{pid}/stat")
            if stat:
                self._ppid[pid] = int(stat[stat.rfind(b")") + 2 :].split(b" ", 2)[1])
        for gone in self._ppid.keys() - pids:
            del self._ppid[gone]
        self._env_checked &= pids
        return pids

    def refresh(self, scan_env: bool) -> list[int]:
        """Update membership; return pids that are new or whose title changed."""
        pids = self._pids()
        found: set[int] = set()
        if self.root_pid is not None and self.root_pid in pids:
            children: dict[int, list[int]] = {}
            for pid, ppid in self._ppid.items():
                children.setdefault(ppid, []).append(pid)
            todo = [self.root_pid]
            while todo:
                pid = todo.pop()
                found.add(pid)
                todo.extend(c for c in children.get(pid, ()) if c not in found)
        self.tagged &= pids
        if scan_env and self.marker:
            for pid in pids - found - self._env_checked - self.tagged:
                self._env_checked.add(pid)
                if self._has_marker(pid):
                    self.tagged.add(pid)
        found |= self.tagged
        self.members = found
        for fds in (self._statm, self._cmdline, self._stat):
            for pid in fds.keys() - found:
                os.close(fds.pop(pid))
        changed = []
        for pid in found:
            raw = self._pread(self._cmdline, pid, "cmdline", 1 << 16)
            if raw is None:
                continue
            joined = raw.replace(b"\0", b" ").decode(errors="replace").strip()
            if pid in self.info and self.info[pid][2] == joined:
                continue
            cls, name = classify(joined.split(" "), is_root=pid == self.root_pid)
            self.info[pid] = (cls, name, joined)
            changed.append(pid)
        return changed

    def _has_marker(self, pid: int) -> bool:
        return bool(self.marker) and has_marker(pid, self.marker or b"")

    def host(self, full: bool) -> dict[str, Any]:
        """Memory of the members: RSS always; USS and PSS (smaps_rollup, slower) when `full`."""
        rss_total = uss_total = pss_total = 0
        by_class: dict[str, int] = {}
        pids: dict[str, int] = {}
        mono = time.monotonic()
        dt = mono - self._cpu_at if self._cpu_at is not None else None
        cpu_by_class: dict[str, float] = {}
        cpu_now: dict[int, int] = {}
        for pid in self.members:
            ticks = self._cpu_ticks(pid)
            if ticks is not None:
                cpu_now[pid] = ticks
                # a process first seen now has no previous reading: its CPU before it is not this span's
                if dt and pid in self._cpu:
                    cls = self.info.get(pid, ("other", "", ""))[0]
                    cpu_by_class[cls] = cpu_by_class.get(cls, 0.0) + max(0, ticks - self._cpu[pid]) / _TICKS / dt
        self._cpu, self._cpu_at = cpu_now, mono
        host_ticks = host_cpu_ticks()
        host_cpu = None
        if dt and host_ticks and self._host_ticks:
            pairs = zip(host_ticks, self._host_ticks, strict=True)
            busy, steal = (max(0, now - then) / _TICKS / dt for now, then in pairs)
            host_cpu = {"busy": round(busy, 3), "steal": round(steal, 3)}
        self._host_ticks = host_ticks
        for pid in self.members:
            statm = self._read_statm(pid)
            if not statm:
                continue
            rss = int(statm.split(b" ", 2)[1]) * _PAGE
            if full:
                uss, pss = _smaps(pid)
                uss_total += uss
                pss_total += pss
            rss_total += rss
            cls = self.info.get(pid, ("other", "", ""))[0]
            by_class[cls] = by_class.get(cls, 0) + rss
            pids[str(pid)] = rss
        out: dict[str, Any] = {
            "rss": rss_total,
            "uss": uss_total if full else None,
            "pss": pss_total if full else None,
            "n": len(pids),
            "by_class": by_class,
            "pids": pids,
        }
        if dt:
            out["cpu_by_class"] = {c: round(v, 3) for c, v in cpu_by_class.items()}
        if host_cpu:
            out["host_cpu"] = host_cpu
        return out

    def _cpu_ticks(self, pid: int) -> int | None:
        """utime + stime of a member, in clock ticks (fields 14 and 15 of /proc/PID/stat)."""
        stat = self._pread(self._stat, pid, "stat", 1024)
        if not stat:
            return None
        fields = stat[stat.rfind(b")") + 2 :].split(b" ")
        try:
            return int(fields[11]) + int(fields[12])  # fields after the name start at field 3
        except (IndexError, ValueError):
            return None

    def _read_statm(self, pid: int) -> bytes | None:
        return self._pread(self._statm, pid, "statm", 256)

    @staticmethod
    def _pread(fds: dict[int, int], pid: int, name: str, size: int) -> bytes | None:
        """/proc/PID/<name> through a kept fd: pread costs ~2 us where open+read costs ~15 us, and
        the tree refresh reads every member's cmdline each second (profiled: 60% of its time)."""
        fd = fds.get(pid)
        try:
            if fd is None:
                fd = fds[pid] = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
            data = os.pread(fd, size, 0)
        except OSError:  # the process is gone (a reused pid reads as an error, not as the new process)
            data = b""
        if not data and fd is not None:
            os.close(fds.pop(pid))
        return data or None

    def close(self) -> None:
        for fds in (self._statm, self._cmdline, self._stat):
            for fd in fds.values():
                os.close(fd)
            fds.clear()

    def classify_pid(self, pid: int) -> str:
        """Class of a GPU process, also when it is outside the monitored set."""
        if pid in self.info:
            return self.info[pid][0]
        raw = _read(f"/proc/{pid}/cmdline")
        if raw is None:  # another pid namespace (a container without --pid=host) or gone
            self.info[pid] = ("other", f"pid {pid} (not visible here)", "")
            return "other"
        joined = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        cls, name = classify(joined.split(" "))
        self.info[pid] = (cls, name, joined)
        return cls


def _smaps(pid: int) -> tuple[int, int]:
    """(USS, PSS) in bytes from /proc/PID/smaps_rollup; USS = private clean + private dirty."""
    raw = _read(f"/proc/{pid}/smaps_rollup")
    if raw is None:
        return 0, 0
    uss = pss = 0
    for line in raw.split(b"\n"):
        if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
            uss += int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
    return uss, pss


def _due(mono: float, due_at: float, period: float) -> tuple[bool, float]:
    """Whether a periodic reading is due at `mono`, and when the next one is due.

    The next reading is due one period after this one was due, not after the tick that took it:
    the sampling loop's ticks land a little late, and counting the period from a late tick let a
    0.5 s reading slip to every 0.6 s. After a stall longer than a period the cadence restarts from
    now rather than catching up in a burst.
    """
    if mono < due_at:
        return False, due_at
    nxt = due_at + period
    return True, nxt if nxt > mono else mono + period


class Monitor:
    """Sample GPUs and the host into DIR/samples.jsonl from a background thread.

    Use as a context manager around a running process (`Monitor(dir, root_pid=proc.pid)`), or call
    `sample_once()` yourself (the thread is started by `__enter__` only).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        interval: float = 0.1,
        root_pid: int | None = None,
        cmd: Sequence[str] | None = None,
        tree_s: float = 1.0,
        full_mem_s: float = 2.0,
        full_mem_share: float = FULL_MEM_SHARE,
        env_scan_s: float = 5.0,
        host_s: float = 0.5,
        procs_s: float = 0.5,
        peak_gap_s: float = PEAK_GAP_S,
    ) -> None:
        if interval <= 0:
            raise RecipeError(f"--interval must be > 0 seconds, got {interval}")
        if not 0 < full_mem_share <= 1:
            raise RecipeError(f"--full-mem-share must be a share of one core in (0, 1], got {full_mem_share}")
        self.out_dir = Path(out_dir).resolve()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.interval = interval
        self.tree_s, self.full_mem_s, self.env_scan_s = tree_s, full_mem_s, env_scan_s
        self.full_mem_share = full_mem_share
        self._full_gap = full_mem_s  # grows with the measured cost of a USS/PSS read
        self.full_reads = 0
        self.peak_reads = 0  # USS/PSS reads taken at an RSS peak (PEAK_*), counted in full_reads too
        self._rss_read_high = 0  # the highest RSS at which USS/PSS was read
        self._last_peak_read = -1e18
        self.peak_gap_s = peak_gap_s
        self.host_s, self.procs_s = host_s, procs_s
        self._host_due = self._procs_due = -1e18
        marker = run_marker(self.out_dir)
        self.procs = _ProcSet(root_pid, marker)
        self.nvml = _Nvml()
        self.writer = JsonlWriter(self.out_dir / SAMPLES)
        self.samples = 0
        self.sampler_cpu_s = 0.0
        self.sampler_cpu_parts_s: dict[str, float] = {}
        self.members_max = 0  # the largest monitored process set: the overhead scales with it
        self._t0 = time.time()
        self._last_tree = self._last_full = self._last_env = -1e18
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rc: int | None = None
        self.write_fault: str | None = None  # why sampling stopped early (a full or read-only disk)
        self.writer.write(
            {
                "kind": "start",
                "t": self._t0,
                "cmd": list(cmd) if cmd else None,
                "pid": root_pid,
                "interval_s": interval,
                "hostname": socket.gethostname(),
                "host_total_bytes": int(psutil.virtual_memory().total),
                "gpus": self.nvml.static,
                "nvml_error": self.nvml.error,
            }
        )

    def sample_once(self) -> dict[str, Any]:
        """Take one sample, append it to samples.jsonl and return it."""
        c0 = time.thread_time()
        now = time.time()
        mono = time.monotonic()
        if mono - self._last_tree >= self.tree_s:
            scan = mono - self._last_env >= self.env_scan_s
            for pid in self.procs.refresh(scan_env=scan):
                cls, name, cmdline = self.procs.info[pid]
                self.writer.write(
                    {
                        "kind": "proc",
                        "t": now,
                        "pid": pid,
                        "class": cls,
                        "name": name,
                        "cmdline": cmdline[:500],
                    }
                )
            self._last_tree = mono
            self.members_max = max(self.members_max, len(self.procs.members))
            if scan:
                self._last_env = mono
        c1 = time.thread_time()
        self._charge("tree", c1 - c0)
        procs_too, self._procs_due = _due(mono, self._procs_due, self.procs_s)
        gpus = self.nvml.sample(procs_too) if self.nvml.handles else []
        for g in gpus:
            for p in g.get("procs", ()):
                p["class"] = self.procs.classify_pid(p["pid"])
        c2 = time.thread_time()
        self._charge("nvml_procs" if procs_too else "nvml_total", c2 - c1)
        rec: dict[str, Any] = {"kind": "sample", "t": now, "gpus": gpus}
        host_too, self._host_due = _due(mono, self._host_due, self.host_s)
        if host_too:
            full = mono - self._last_full >= self._full_gap
            if full:
                self._last_full = mono
            host = self.procs.host(full)
            c3 = time.thread_time()
            self._charge("host_full" if full else "host_rss", c3 - c2)
            if full:
                self.full_reads += 1
                # space the next USS/PSS read so that these reads stay within their share of a core
                self._full_gap = max(self.full_mem_s, (c3 - c2) / self.full_mem_share)
            elif self._at_peak(host["rss"], mono):
                host = self.procs.host(True)
                host["read"] = "peak"
                self._last_peak_read = mono
                self.full_reads += 1
                self.peak_reads += 1
                c3b = time.thread_time()
                self._charge("host_full", c3b - c3)
                c3 = c3b
            if host["pss"] is not None:
                self._rss_read_high = max(self._rss_read_high, host["rss"])
            rec["host"] = host
            c2 = c3
        self.writer.write(rec)
        self.samples += 1
        c4 = time.thread_time()
        self._charge("write", c4 - c2)
        self.sampler_cpu_s += c4 - c0
        return rec

    def _at_peak(self, rss: int, mono: float) -> bool:
        """Whether this RSS reading is a new high that no USS/PSS read has seen: more than
        PEAK_RISE above the RSS of the highest USS/PSS read so far, PEAK_GAP_S after the last such read."""
        return mono - self._last_peak_read >= self.peak_gap_s and rss > self._rss_read_high * (1 + PEAK_RISE)

    def _charge(self, part: str, cpu_s: float) -> None:
        """Account the sampler's CPU time per part, so an overhead above budget names its cause
        (the exit record's sampler_cpu_parts_s: tree = process-tree refresh, nvml_total = device
        totals alone, nvml_procs = samples that also read NVML's per-process list and utilization,
        host_rss / host_full = host memory without / with USS+PSS, write = JSON and write(2))."""
        self.sampler_cpu_parts_s[part] = self.sampler_cpu_parts_s.get(part, 0.0) + cpu_s

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except OSError as e:
                if e.errno in inflight.FAULTS:
                    self._stop_sampling(e)
                    return
                self.writer.write({"kind": "error", "t": time.time(), "error": repr(e)[:500]})
            except Exception as e:  # keep sampling; record why one sample failed
                self.writer.write({"kind": "error", "t": time.time(), "error": repr(e)[:500]})
            next_t += self.interval
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a slow NVML call): skip the missed ticks
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def _stop_sampling(self, e: OSError) -> None:
        """The disk is full or read-only: the command goes on unmeasured from here, undisturbed, and
        the report says where the samples end (`samples cut at line N`)."""
        self.write_fault = f"{self.writer.path}: {inflight.FAULTS[e.errno or 0][0]}"
        print(f"monitor: {self.write_fault}; sampling stops here, the command goes on", file=sys.stderr, flush=True)

    def start(self) -> Monitor:
        self._thread = threading.Thread(target=self._loop, name="verl-recipes-monitor", daemon=True)
        self._thread.start()
        return self

    def set_exit(self, rc: int) -> None:
        self._rc = rc

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.write_fault:  # the exit record would not fit either; the launcher records the exit code
            return
        self.writer.write(
            {
                "kind": "exit",
                "t": time.time(),
                "rc": self._rc,
                "samples": self.samples,
                "sampler_cpu_s": round(self.sampler_cpu_s, 6),
                "sampler_cpu_parts_s": {k: round(v, 6) for k, v in sorted(self.sampler_cpu_parts_s.items())},
                "members_max": self.members_max,
                "full_reads": self.full_reads,
                "peak_reads": self.peak_reads,
                "wall_s": round(time.time() - self._t0, 6),
            }
        )
        self.writer.close()
        self.nvml.close()
        self.procs.close()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def monitor_command(
    cmd: Sequence[str],
    out_dir: str | os.PathLike[str],
    interval: float = 0.1,
    full_mem_s: float = 2.0,
    detail_s: float = 0.5,
    full_mem_share: float = FULL_MEM_SHARE,
) -> int:
    """Run `cmd` under the monitor; return its exit code (128+N when killed by signal N).

    SIGTERM and SIGHUP sent to the monitor are forwarded to the command; SIGINT is not (see below).
    Stopped by any of them, the monitor ends the whole tree it started once the command has exited
    (every process carrying the run's marker, grandchildren under a wrapper shell included). A
    monitor that dies of a signal it cannot catch (SIGKILL) takes the command with it
    (`procs.die_with_parent`) and its guard (`procs.TreeGuard`) ends the rest.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, RUN_DIR_ENV: str(out)}
    try:
        # preexec_fn runs before the sampler's thread exists: nothing else is running to fork under
        proc = subprocess.Popen(list(cmd), env=env, preexec_fn=die_with_parent())
    except OSError as e:
        raise RecipeError(f"cannot start {cmd[0]!r}: {e.strerror}; give a runnable command after --") from None

    stopped: list[int] = []  # the signals that asked the monitor to stop

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    def keep_sampling(signum: int, _frame: FrameType | None) -> None:
        """Ctrl-C reaches the child directly (same process group); a second copy would make Ray and
        torchrun treat it as a forced kill. Keep sampling until the child exits."""
        stopped.append(signum)

    # A SIGKILLed monitor runs no handler: its guard ends the tree. A stopped one (SIGTERM, SIGHUP,
    # Ctrl-C) ends it itself once the child has exited: a wrapper shell dies of the signal and
    # leaves its own children (a background job ignores SIGINT) running, holding the GPU.
    guard = TreeGuard(out)
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    old[signal.SIGINT] = signal.signal(signal.SIGINT, keep_sampling)
    try:
        with Monitor(
            out,
            interval=interval,
            root_pid=proc.pid,
            cmd=cmd,
            full_mem_s=full_mem_s,
            full_mem_share=full_mem_share,
            host_s=detail_s,
            procs_s=detail_s,
        ) as mon:
            rc = proc.wait()
            if stopped:
                end(lambda: marked_pids(out), grace_s=5.0)
            mon.set_exit(rc)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        guard.disarm()
    return rc if rc >= 0 else 128 - rc


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "monitor",
        help="sample GPU (NVML) and host memory of a command, per PPO phase",
        description="Run CMD with VERL_RECIPES_RUN_DIR=DIR and write DIR/samples.jsonl; "
        "exit with CMD's exit code. "
        "Example: verl-recipes monitor --out runs/a -- python -m verl.trainer.main_ppo ...",
    )
    p.add_argument("--out", required=True, help="run directory (created); samples.jsonl goes here")
    p.add_argument("--interval", type=cli_types.positive, default=0.1, help="seconds between samples (default 0.1)")
    p.add_argument(
        "--full-mem-interval",
        type=cli_types.positive,
        default=2.0,
        help="seconds between USS/PSS reads (smaps_rollup, costly for large CUDA processes; default 2)",
    )
    p.add_argument(
        "--detail-interval",
        type=cli_types.positive,
        default=0.5,
        help="seconds between host RSS and NVML per-process reads (default 0.5; the device total is read every "
        "--interval)",
    )
    p.add_argument(
        "--full-mem-share",
        type=float,
        default=FULL_MEM_SHARE,
        help="most of one core the USS/PSS reads may use; each read's measured cost spaces the next "
        f"(default {FULL_MEM_SHARE})",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise RecipeError("give the command to monitor after --: verl-recipes monitor --out DIR -- CMD ARGS...")
    return monitor_command(
        cmd,
        args.out,
        args.interval,
        full_mem_s=args.full_mem_interval,
        detail_s=args.detail_interval,
        full_mem_share=args.full_mem_share,
    )
