"""A run's processes: the marker they carry, the one scan of /proc, and ending them.

A verl run that times out or dies leaves Ray's GCS and raylet, Ray workers and vLLM's engine
core behind, holding GPU memory. `ray stop --force` or `pkill ray::` would end them, but also
every other run on the host: on a machine with several GPUs one recipe runs per GPU at once.
Every process of a run inherits ``VERL_RECIPES_RUN_DIR=<run dir>`` from the launcher (Ray starts
its GCS, raylet and workers with the driver's environment), so that marker names exactly the
run's processes, whichever session or parent they ended up under. A Ray node that the Slurm
launcher starts carries ``VERL_RECIPES_RAY_JOB=<job id>`` the same way.

`verl-recipes reap RUN_DIR` ends every process one run left behind, and only those.

Standard library only: the Slurm launcher's in-step cleanup runs this on a node's bare python3.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes  # loaded here, in the parent: the forked child only calls into it
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from verl_recipes import RecipeError
from verl_recipes.rundir import RUN_DIR_ENV

#: set on every Ray process a Slurm job's launcher starts (its job id); `cluster` reaps by it.
RAY_JOB_ENV = "VERL_RECIPES_RAY_JOB"


def all_pids() -> set[int]:
    """Every process id on this host (the one listing of /proc)."""
    return {int(n) for n in os.listdir("/proc") if n.isdigit()}


def read(pid: int, name: str) -> bytes | None:
    """/proc/PID/<name>, or None when the process is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return None


def session_id(pid: int) -> int | None:
    stat = read(pid, "stat")
    try:
        return int(stat[stat.rfind(b")") + 2 :].split(b" ")[3]) if stat else None
    except (IndexError, ValueError):
        return None


def command_line(pid: int) -> str:
    raw = read(pid, "cmdline") or b""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when the process that started it
    dies, however it dies (SIGKILL and the OOM killer included, which no handler sees).

    The monitor forwards the signals it can catch; this covers the ones it cannot, so a killed
    monitor never leaves a trainer running and holding the GPU. verl's driver exits on SIGTERM and
    Ray then ends the workers it started. Linux only (prctl PR_SET_PDEATHSIG); elsewhere a no-op.
    """

    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def arm() -> None:
        prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), sig)

    return arm


def run_marker(run_dir: str | os.PathLike[str]) -> bytes:
    """The environment entry every process of a run carries (RUN_DIR_ENV=<resolved run dir>)."""
    return f"{RUN_DIR_ENV}={Path(run_dir).resolve()}".encode()


def job_marker(job: str) -> bytes:
    """The environment entry every Ray process of a Slurm job's launcher carries."""
    return f"{RAY_JOB_ENV}={job}".encode()


def has_marker(pid: int, marker: bytes, under: bool = False) -> bool:
    """Whether /proc/PID/environ carries `marker` (with `under`: also a run folder below it)."""
    env = read(pid, "environ")
    if not env:
        return False
    entries = env.split(b"\0")
    return marker in entries or (under and any(e.startswith(marker + b"/") for e in entries))


def marked_pids(run_dir: Path, under: bool = False) -> list[int]:
    """Pids whose environment carries this run's marker (this process excluded).

    With `under`, runs in folders below `run_dir` count too (a GPU test keeps one run per test).
    """
    marker = run_marker(run_dir)
    me = os.getpid()
    return sorted(pid for pid in all_pids() if pid != me and has_marker(pid, marker, under))


def end(
    find: Callable[[], Iterable[int]], grace_s: float = 5.0, kill_wait_s: float = 2.0
) -> tuple[list[int], list[int]]:
    """SIGTERM what `find` names, SIGKILL what it still names after `grace_s`; (found, left).

    `find` is asked again while waiting, so a process that exits counts as ended whatever its pid
    is reused for, and one the run started meanwhile is signalled too.
    """
    found = sorted(set(find()))
    left = found
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        left = sorted(set(find()))
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = sorted(set(find()))
        if not left:
            break
    return found, left


def reap(run_dir: Path, grace_s: float = 5.0, under: bool = False) -> list[int]:
    """End the run's processes (SIGTERM, then SIGKILL after `grace_s`); return the pids found."""
    found, _ = end(lambda: marked_pids(run_dir, under), grace_s)
    return found


# The guard: a small process that outlives a SIGKILLed monitor by exactly as long as it takes to end
# the run's tree. It reads its stdin, a pipe only the monitor holds: "done" means the monitor ended
# on its own; end-of-file without it means the monitor died, and the run's processes are reaped.
_GUARD_SRC = (
    "import sys\n"
    "from pathlib import Path\n"
    "if sys.stdin.buffer.read() != b'done':\n"
    "    from verl_recipes.procs import reap\n"
    "    reap(Path(sys.argv[1]), grace_s=float(sys.argv[2]))\n"
)


class TreeGuard:
    """Ends every process of a run (`reap`) if the process that started the guard dies first."""

    def __init__(self, run_dir: Path, grace_s: float = 5.0) -> None:

        env = {k: v for k, v in os.environ.items() if k not in (RUN_DIR_ENV,)}  # the guard is not the run's
        pkg = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _GUARD_SRC, str(run_dir), str(grace_s)],
            stdin=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C at the terminal is for the run, not for its guard
        )

    def disarm(self) -> None:
        """The starter ends normally: the guard exits without touching anything."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.write(b"done")
                self._proc.stdin.close()
        with contextlib.suppress(Exception):
            self._proc.wait(timeout=10)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reap",
        help="end the processes one run left behind (Ray, vLLM), leaving other runs alone",
        description="End every process left behind by one run, and only those.",
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--under", action="store_true", help="also runs in folders below RUN_DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        raise RecipeError(f"{args.run_dir}: no such run folder")
    pids_found = reap(args.run_dir, args.grace, args.under)
    left = marked_pids(args.run_dir, args.under)
    print(f"reap {args.run_dir}: {len(pids_found)} process(es) signalled, {len(left)} left")
    return 1 if left else 0
