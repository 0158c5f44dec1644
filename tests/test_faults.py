"""When the machine fails, not the user: real faults, each one line, nothing half-written left.

A 2 MiB tmpfs filled to the byte where each write of a run folder happens (the claim, the
incomplete marker, command.sh, the composed config); every case is one `error:` line naming the
path, what was kept and what to do, exit 2, no hidden lock or partial left, and the same command
proceeds once there is space. Needs root for `mount`; skipped with that reason where it is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "recipes" / "7b-lora" / "results" / "h200x1-ppo-packed" / "verl_config.yaml"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "common"), env.get("PYTHONPATH", "")])
    env["VERL_RECIPES_CACHE"] = str(tmp / "cache")
    env["VERL_RECIPES_ROOT"] = str(ROOT)
    env.update(extra)
    return env


def _mount(args: list[str], what: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{what} needs `mount` (root): it was refused ({r.stderr.strip() or r.returncode})")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    _mount(["-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], "a full-disk test")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(fs: Path, leave: int) -> Path:
    """Fill `fs` so exactly `leave` bytes stay free (tmpfs hands out whole pages); returns the filler."""
    filler = fs / "filler"
    filler.unlink(missing_ok=True)
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    assert leave <= free and leave % st.f_frsize == 0
    with open(filler, "wb") as f:
        f.write(b"\0" * (free - leave))
    st = os.statvfs(fs)
    assert st.f_bavail * st.f_frsize == leave, (st.f_bavail, leave)
    return filler


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from omegaconf import OmegaConf
    from verl_recipes import cli, train
    from verl_recipes.job import decide

    def body():
        args = cli.build_parser().parse_args(["train", "7b-lora", "--rehearse", "--run-dir", sys.argv[1]])
        job = decide(args)
        train.write_run(job, OmegaConf.load(sys.argv[2]))
        print("written", flush=True)

    sys.exit(cli.run_guarded("train", body))
    """
)


def _write_run(run: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`train`'s own decide and write_run (the claim, the marker, command.sh, the config) into `run`."""
    return subprocess.run(
        [sys.executable, "-c", _WRITER, str(run), str(CONFIG)],
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=120,
    )


PAGE = 4096


@pytest.mark.parametrize(
    ("pages", "fails_at", "marked"),
    [
        (0, "", False),  # the claim's lock file
        (1, "incomplete.json", False),  # the marker
        (2, "command.sh", True),
        (3, "verl_config.yaml", True),  # 11 kB: it used to be left cut at 8192 bytes
    ],
)
def test_a_full_disk_at_each_write_of_a_run_folder_is_one_line_and_leaves_nothing_half_written(
    small_fs: Path, tmp_path: Path, pages: int, fails_at: str, marked: bool
) -> None:
    run = small_fs / "run"
    filler = fill(small_fs, pages * PAGE)
    r = _write_run(run, tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: verl-recipes train: no space left on the filesystem: "), (
        r.stderr
    )
    assert f"{run / fails_at}".rstrip("/") in lines[0] and "df -h" in lines[0], lines[0]
    assert ("kept " + str(run) + ": marked incomplete") in lines[0] if marked else "marked incomplete" not in lines[0]
    left = sorted(p.name for p in small_fs.rglob("*"))
    assert not [n for n in left if n.startswith(".")], left  # no lock, no partial
    if marked:  # what is there is whole: the marker, and command.sh when the config failed
        assert (run / "incomplete.json").is_file() and not (run / fails_at).exists()
    # the same command proceeds once there is space: a marked attempt is set aside, never a bar
    filler.unlink()
    again = _write_run(run, tmp_path)
    assert again.returncode == 0 and again.stdout.strip().endswith("written"), again.stderr[-3000:]
    assert (run / "verl_config.yaml").read_text() == CONFIG.read_text()


def test_train_into_a_full_disk_says_so_in_one_line(small_fs: Path, tmp_path: Path) -> None:
    """The command a user types: exit 2, one line naming the folder, no lock file left behind."""
    fill(small_fs, 0)
    run = small_fs / "runs" / "r1"
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "train", "7b-lora", "--rehearse", "--run-dir", str(run)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no space left on the filesystem: {run} (the run folder)" in lines[0], r.stderr
    assert sorted(p.name for p in small_fs.rglob("*")) == ["filler", "runs"]
