"""How a run ended, in one line: the step and phase it was in, the signal or exit code, and the
last error any of its processes wrote, with the Ray worker logs that say so kept in the run folder.

verl runs its trainer and workers as Ray actors. When one of them dies by a signal (a C++ abort in
a CUDA or NCCL call, the OOM killer), its last words go to Ray's own log folder
(``<ray tmp>/session_*/logs/worker-*.err``, ``python-core-worker-*.log``, ``raylet.out``), not to
the driver's output, and the driver dies soon after with nothing in train.log. So after every run
the launcher copies the tails of the logs of that run's Ray session that carry an error into
``RUN_DIR/ray-logs/`` (`collect_ray_logs`), and the report states the ending (`describe`).

The session is found by the driver's pid (the monitored command, the monitor's start record):
Ray names the driver's core log ``python-core-driver-<job>_<pid>.log``, so a second run on the
same host (another GPU) is never mistaken for this one.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from verl_recipes import rundir

RAY_LOGS_DIR = rundir.RAY_LOGS
TAIL_LINES = 200

#: a line that says something went wrong (Python, C++, CUDA, NCCL, the kernel, Ray).
ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(Error|Exception)\b:|terminate called|Aborted|"
    r"\bSIG(ABRT|SEGV|KILL|BUS|FPE|TERM)\b|Fatal Python error|Check failed|CUDA error|NCCL (error|WARN .*failed)|"
    r"out of memory|core dumped|exit_type=|killed by|has died|Worker exit|ActorDiedError|RayTaskError"
)
_NOISE = re.compile(
    r"UserWarning|warnings\.warn|DeprecationWarning|FutureWarning|is not available: ModuleNotFoundError"
)


#: Ray's own teardown, which every process writes once the driver gives up: an intended exit, a
#: shutdown, a SIGTERM or SIGKILL the cluster sends its own processes. It follows the error that
#: ended the run; it never is it.
_TEARDOWN = re.compile(
    r"exit_type=INTENDED_|Shutdown by ray\.shutdown|received SIGTERM|Exiting with SIGTERM|"
    r"Failed to disconnect from the local raylet|Stop: sending SIGKILL"
)


def ray_temp_root() -> Path:
    return Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray"


def session_of(driver_pid: int, root: Path | None = None) -> Path | None:
    """The Ray session folder whose driver had this pid (the newest, if pids were reused)."""
    root = root or ray_temp_root()
    hits = sorted(root.glob(f"session_*/logs/python-core-driver-*_{driver_pid}.log"), key=lambda p: p.stat().st_mtime)
    return hits[-1].parent.parent if hits else None


def last_error(lines: list[str]) -> str | None:
    """The last line that reads as an error (tracebacks: the exception line after them)."""
    for line in reversed(lines):
        text = line.strip()
        if text and ERROR_LINE.search(text) and not _NOISE.search(text) and not text.startswith("Traceback"):
            return text[:500]
    return None


def _tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    if not path.is_file():  # a committed run keeps its log gzipped (PATH.gz), or there is none
        return rundir.read_log(path).splitlines()[-n:]
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-n:]


def collect_ray_logs(run_dir: Path, driver_pid: int | None, root: Path | None = None) -> list[dict[str, Any]]:
    """Copy the tails of this run's Ray logs that carry an error (and raylet.out, where Ray records
    worker deaths) into RUN_DIR/ray-logs/; return [{file, last_error}] and write it as errors.json."""
    session = session_of(driver_pid, root) if driver_pid else None
    if session is None:
        return []
    out = run_dir / RAY_LOGS_DIR
    found: list[dict[str, Any]] = []
    for path in sorted((session / "logs").glob("*")):
        if not path.is_file() or not path.name.endswith((".err", ".out", ".log")):
            continue
        lines = _tail(path)
        err = last_error(lines)
        if err is None and path.name != "raylet.out":
            continue
        out.mkdir(parents=True, exist_ok=True)
        (out / path.name).write_text("\n".join(lines) + "\n")
        if err is not None:
            found.append({"file": f"{RAY_LOGS_DIR}/{path.name}", "last_error": err})
    if found or out.is_dir():
        out.mkdir(parents=True, exist_ok=True)
        (run_dir / rundir.RAY_ERRORS).write_text(
            json.dumps({"session": session.name, "errors": found}, indent=1) + "\n"
        )
    return found


def signal_of(rc: int | None) -> str | None:
    """The signal behind an exit code: negative (Python's subprocess) or 128+N (the monitor, shells)."""
    if rc is None or rc == 0:
        return None
    num = -rc if rc < 0 else rc - 128 if 128 < rc < 128 + 65 else None
    if num is None:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _where(phases: list[dict[str, Any]]) -> tuple[int | None, str | None]:
    """The step and innermost phase open at the end of phases.jsonl (None: between phases)."""
    open_: list[dict[str, Any]] = []
    step = None
    for r in phases:
        if isinstance(r.get("step"), int):
            step = r["step"]
        if r.get("event") == "begin":
            open_.append(r)
        elif r.get("event") == "end":
            for i in range(len(open_) - 1, -1, -1):
                if open_[i].get("name") == r.get("name") and open_[i].get("pid") == r.get("pid"):
                    del open_[i]
                    break
    if open_:
        inner = open_[-1]
        return inner.get("step") if isinstance(inner.get("step"), int) else step, str(inner.get("name"))
    return step, None


def describe(run_dir: Path, exit_code: int | None, phases: list[dict[str, Any]], log_name: str = rundir.LOG) -> dict:
    """summary.json's "ended": how the run ended, where and why."""
    step, phase = _where(phases)
    errors: list[dict[str, Any]] = []
    idx = run_dir / rundir.RAY_ERRORS
    if idx.is_file():
        try:
            errors = list(json.loads(idx.read_text()).get("errors") or [])
        except ValueError:
            errors = []
    log_err = last_error(_tail(run_dir / log_name))
    # a worker's own stderr says why; Ray's core log of it, then the driver's log, say less; Ray's
    # teardown says nothing (a Python exception ends the run with every core log's last line an
    # intended exit, and the exception in the driver's log)
    causes = [e for e in errors if not _TEARDOWN.search(str(e.get("last_error") or ""))]
    worker = next(
        (e for e in causes if Path(e["file"]).name.startswith("worker-") and e["file"].endswith(".err")), None
    )
    worker = worker or next((e for e in causes if "core-worker" in e["file"]), None)
    driver = {"file": log_name, "last_error": log_err} if log_err else None
    source = worker or driver or (errors[0] if errors else None)
    ok = exit_code == 0
    return {
        "ok": ok,
        "exit_code": exit_code,
        "signal": signal_of(exit_code),
        "step": step,
        "phase": None if ok else phase,
        "last_error": None if ok or source is None else source["last_error"],
        "error_file": None if ok or source is None else source["file"],
    }


def one_line(ended: dict[str, Any]) -> str:
    """`ended: step 1, phase old_log_prob, SIGABRT (exit -6), last error: ...` for report.md."""
    if ended.get("ok"):
        return f"ended: finished, exit 0 after step {ended.get('step')}"
    if ended.get("exit_code") is None:
        how = "the monitor did not finish (killed?)"
    else:
        sig = ended.get("signal")
        how = f"{sig} (exit {ended['exit_code']})" if sig else f"exit {ended['exit_code']}"
    where = f"step {ended.get('step')}" + (f", phase {ended['phase']}" if ended.get("phase") else ", between phases")
    err = ended.get("last_error")
    return f"ended: {where}, {how}" + (f", last error ({ended['error_file']}): {err}" if err else ", no error line")
