"""How a run ended: a real Ray worker that aborts, its last words found in Ray's own logs.

The driver here is a real Ray program on this CPU host (Ray runs here as on the GPU host): one
actor prints an error and calls os.abort(), as a C++ assertion inside a CUDA call does. Ray
writes the worker's stderr to its session's worker-*.err, not to the driver's output; the
launcher's collection must find that line by the driver's pid and the report must say it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from verl_recipes import rundir
from verl_recipes.measure import ending

pytest.importorskip("ray")

DRIVER = textwrap.dedent(
    """
    import os, sys, time, ray
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[1])

    @ray.remote
    class Worker:
        def crash(self):
            print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
            os.abort()

    w = Worker.remote()
    try:
        ray.get(w.crash.remote())
    except Exception as e:
        print("driver saw", type(e).__name__, flush=True)
    time.sleep(2)  # let Ray flush the worker's log files
    ray.shutdown()
    os.abort()  # the driver dies as verl's did: SIGABRT, nothing in its own log
    """
)


def test_a_worker_abort_is_found_in_rays_logs_and_named_in_the_ending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # short: Ray's socket paths have a length limit; .../ray is where train looks (RAY_TMPDIR/ray)
    ray_tmp = Path("/tmp") / f"vr-{os.getpid()}" / "ray"
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp.parent))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, str(script), str(ray_tmp)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=240)
        _check(run_dir, proc, out, ray_tmp)
    finally:
        proc.kill()
        shutil.rmtree(ray_tmp.parent, ignore_errors=True)


def _check(run_dir: Path, proc: subprocess.Popen[str], out: str, ray_tmp: Path) -> None:
    assert proc.returncode == -6, out
    _train_keeps_the_ray_logs_of_a_run_that_did_not_exit_0_only(run_dir.parent, proc.pid)
    found = ending.collect_ray_logs(run_dir, proc.pid, root=ray_tmp)
    errors = json.loads((run_dir / rundir.RAY_ERRORS).read_text())["errors"]
    assert found == errors and found
    worker = [e for e in found if "worker" in e["file"]]
    assert worker, found
    assert any("illegal memory access" in e["last_error"] or "Aborted" in e["last_error"] for e in worker), worker
    # a run that died in step 1's old_log_prob
    phases = [
        {"t": 1.0, "event": "begin", "name": "step", "step": 1, "pid": 7},
        {"t": 2.0, "event": "begin", "name": "gen", "step": 1, "pid": 7},
        {"t": 3.0, "event": "end", "name": "gen", "step": 1, "pid": 7},
        {"t": 3.1, "event": "begin", "name": "old_log_prob", "step": 1, "pid": 7},
    ]
    (run_dir / "train.log").write_text("INFO step 1 started\n")
    ended = ending.describe(run_dir, -6, phases)
    assert (ended["step"], ended["phase"], ended["signal"]) == (1, "old_log_prob", "SIGABRT")
    assert ended["error_file"].startswith("ray-logs/worker-")
    line = ending.one_line(ended)
    assert line.startswith("ended: step 1, phase old_log_prob, SIGABRT (exit -6), last error (ray-logs/worker-")


def test_another_drivers_session_is_not_taken(tmp_path: Path) -> None:
    root = tmp_path / "ray"
    (root / "session_a" / "logs").mkdir(parents=True)
    (root / "session_a" / "logs" / "python-core-driver-01000000_111.log").write_text("")
    (root / "session_a" / "logs" / "worker-x.err").write_text("ValueError: not this run\n")
    assert ending.session_of(222, root) is None
    assert ending.collect_ray_logs(tmp_path, 222, root=root) == []
    assert ending.session_of(111, root) == root / "session_a"


def test_exit_codes_name_their_signals() -> None:
    assert ending.signal_of(-6) == "SIGABRT"
    assert ending.signal_of(137) == "SIGKILL"
    assert ending.signal_of(1) is None and ending.signal_of(0) is None


def _train_keeps_the_ray_logs_of_a_run_that_did_not_exit_0_only(base: Path, driver_pid: int) -> None:
    """The same Ray session (the run's driver pid in its samples) gives a failed run its worker's
    last error and leaves a clean run's folder without Ray's teardown lines."""
    from verl_recipes.measure.outcome import worker_errors

    for rc in (0, -6):
        run = base / f"train-rc{rc}"
        run.mkdir()
        (run / rundir.SAMPLES).write_text(json.dumps({"kind": "start", "pid": driver_pid}) + "\n")
        found = worker_errors(run, rc)
        if rc == 0:
            assert found == [] and not (run / rundir.RAY_LOGS).exists()
        else:
            assert any("illegal memory access" in e["last_error"] or "Aborted" in e["last_error"] for e in found)


def test_rays_teardown_is_not_taken_for_the_cause(tmp_path: Path) -> None:
    """A committed H200 run that died of a Python import error: every Ray core log's last line is
    the teardown that followed (intended exits, SIGTERM), and the cause is in the driver's log."""
    src = Path(__file__).resolve().parents[1] / "recipes/70b-3d/results/failed/h200x1-ppo-tp1pp1-l2-no-energon"
    run = tmp_path / "run"
    shutil.copytree(src, run)
    errors = json.loads((run / rundir.RAY_ERRORS).read_text())["errors"]
    assert errors and all(ending._TEARDOWN.search(e["last_error"]) for e in errors if "core-worker" in e["file"])
    ended = ending.describe(run, 1, [])
    assert ended["error_file"] == rundir.LOG
    assert ended["last_error"] == "ModuleNotFoundError: No module named 'megatron.energon'"
    assert "exit 1" in ending.one_line(ended)
