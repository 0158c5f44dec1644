"""`verl-recipes reap`: ends one run's leftovers (also those that left its process tree) and no others."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from verl_recipes.procs import marked_pids, reap
from verl_recipes.rundir import RUN_DIR_ENV

# A parent that starts a detached grandchild (new session, like Ray's raylet) and exits.
SPAWN = (
    "import subprocess, sys, time;"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True);"
    "time.sleep(300)"
)


def _start(run: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, RUN_DIR_ENV: str(run.resolve())}
    return subprocess.Popen([sys.executable, "-c", SPAWN], env=env)


def _wait_for(run: Path, n: int) -> list[int]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = marked_pids(run)
        if len(pids) >= n:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"expected {n} marked processes for {run}, saw {marked_pids(run)}")


def test_reap_ends_this_run_and_spares_another(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    a, _b = _start(mine), _start(other)
    try:
        mine_pids = _wait_for(mine, 2)
        other_pids = _wait_for(other, 2)
        assert a.pid in mine_pids and len(set(mine_pids) & set(other_pids)) == 0
        reaped = reap(mine, grace_s=2)
        assert set(reaped) == set(mine_pids)
        assert marked_pids(mine) == []
        a.wait(timeout=10)
        assert sorted(marked_pids(other)) == sorted(other_pids), "another run's processes were touched"
    finally:
        reap(other, grace_s=1)
    assert marked_pids(other) == []


def test_reap_cli_on_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "reap", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such run folder" in proc.stderr


def test_reap_under_takes_runs_in_subfolders(tmp_path: Path) -> None:
    test_run = tmp_path / "campaign" / "test_grpo"
    test_run.mkdir(parents=True)
    a = _start(test_run)
    pids = _wait_for(test_run, 2)
    assert marked_pids(tmp_path / "campaign") == []
    assert set(reap(tmp_path / "campaign", grace_s=2, under=True)) == set(pids)
    a.wait(timeout=10)
    assert marked_pids(test_run) == []
