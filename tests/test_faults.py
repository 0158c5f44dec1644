"""When the machine fails, not the user: real faults, each one line, nothing half-written left.

A 2 MiB tmpfs filled to the byte where each write of a run folder happens (the claim, the
incomplete marker, command.sh, the composed config); every case is one `error:` line naming the
path, what was kept and what to do, exit 2, no hidden lock or partial left, and the same command
proceeds once there is space. Needs root for `mount`; skipped with that reason where it is refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
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
        args = cli.build_parser().parse_args(["train", "7b-lora", "--preview", "--run-dir", sys.argv[1]])
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
    if not marked:
        return
    # what is there is whole (the marker, and command.sh when the config failed), and the same
    # command proceeds once there is space: the marked attempt is set aside, never a bar
    assert (run / "incomplete.json").is_file() and not (run / fails_at).exists()
    filler.unlink()
    again = _write_run(run, tmp_path)
    assert again.returncode == 0 and again.stdout.strip().endswith("written"), again.stderr[-3000:]
    assert (run / "verl_config.yaml").read_text() == CONFIG.read_text()


def test_train_into_a_full_disk_says_so_in_one_line(small_fs: Path, tmp_path: Path) -> None:
    """The command a user types: exit 2, one line naming the folder, no lock file left behind."""
    fill(small_fs, 0)
    run = small_fs / "runs" / "r1"
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "train", "7b-lora", "--preview", "--run-dir", str(run)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no space left on the filesystem: {run} (the run folder)" in lines[0], r.stderr
    assert sorted(p.name for p in small_fs.rglob("*")) == ["filler", "runs"]


# --- what an interrupted run says, and folders that never collide -----------------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from omegaconf import OmegaConf
    from verl_recipes import cli, train
    from verl_recipes.job import decide

    def body():
        at, config, moment, *argv = sys.argv[1:]
        while time.time() < float(at):  # start two of these in the same second
            time.sleep(0.001)
        job = decide(cli.build_parser().parse_args(["train", "7b-lora", "--preview", *argv]))
        print(job.run_dir, flush=True)
        if moment == "decided":
            time.sleep(60)
        train.write_run(job, OmegaConf.load(config))
        if moment == "checkpointed":
            (job.run_dir / "checkpoints" / "global_step_1").mkdir(parents=True)
        print("holding", flush=True)
        time.sleep(60 if moment != "none" else 0)

    sys.exit(cli.run_guarded("train", body))
    """
)


def _holder(tmp: Path, moment: str, *argv: str, at: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(at), str(CONFIG), moment, *argv],
        env=_env(tmp),
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    ("moment", "named", "says", "not_said"),
    [
        ("decided", True, None, "marked incomplete"),  # claimed, nothing written yet
        ("written", True, "marked incomplete: the same command starts it over", "--resume"),
        (
            "written",
            False,
            "marked incomplete: the same command makes a new folder; --run-dir {run} starts",
            "--resume",
        ),
        ("checkpointed", True, ", --resume --run-dir {run} continues it from its checkpoints", None),
    ],
)
def test_the_interrupted_line_says_only_what_is_true_for_that_invocation(
    tmp_path: Path, moment: str, named: bool, says: str | None, not_said: str | None
) -> None:
    """A real SIGINT to the process group at each moment: one line, exit 130, and the ways on it
    names are the ones this command has (a folder it named, checkpoints that exist)."""
    argv = ["--run-dir", str(tmp_path / "runs" / "mine")] if named else []
    p = _holder(tmp_path, moment, *argv)
    assert p.stdout is not None
    run = Path(p.stdout.readline().strip())
    if moment != "decided":
        assert p.stdout.readline().strip() == "holding"
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: verl-recipes train"), err
    if says:
        assert says.format(run=run) in lines[0], lines[0]
    if not_said:
        assert not_said not in lines[0], lines[0]
    assert not any(p.name.startswith(".") for p in run.parent.iterdir())  # the claim released


def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path: Path) -> None:
    """Two real processes, no --run-dir, deciding in the same second: both proceed, each in a folder
    of its own (the second takes the rule's `-2`), neither refused."""
    at = float(int(time.time()) + 3)
    procs = [_holder(tmp_path, "none", at=at) for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    dirs = sorted(Path(out.splitlines()[0]) for out, _ in results)
    assert dirs[0] != dirs[1] and dirs[1].name == dirs[0].name + "-2", dirs
    # named by the rule (`job.run_name`): a preview here, judged for the recipe's 24 GiB card
    assert dirs[0].name == "a10gx1-ppo-preview" and all(d.parent == tmp_path / "runs" / "7b-lora" for d in dirs)
    assert all((d / "verl_config.yaml").is_file() for d in dirs)


# --- a read-only home ---------------------------------------------------------------------------


@pytest.fixture
def readonly_home(tmp_path: Path) -> Iterator[Path]:
    """A home folder bind-mounted read-only onto itself, unmounted afterwards."""
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    _mount(["--bind", str(home), str(home)], "a read-only home test")
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(home)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"remounting the home read-only was refused ({r.stderr.strip()})")
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


_LOAD = textwrap.dedent(
    """
    import sys
    from verl_recipes import cli
    if sys.argv[2] == "cli":
        assert cli.main(["list"]) == 0  # any command: it points the caches before a library reads them
    import datasets  # what verl's RLHFDataset loads a parquet file with
    rows = datasets.load_dataset("parquet", data_files=sys.argv[1])["train"]
    print("rows", len(rows))
    """
)


def test_a_read_only_home_sends_the_library_caches_to_a_writable_place_it_names(
    readonly_home: Path, tmp_path: Path
) -> None:
    """Hugging Face datasets locks a file in its cache to read verl's parquet; under a read-only
    home that is Errno 30 without the project, and with it the caches go to a place it names."""
    import pandas as pd

    data = tmp_path / "train.parquet"
    pd.DataFrame({"a": [1, 2, 3]}).to_parquet(data)
    (tmp_path / "tmp").mkdir()
    env = _env(tmp_path, HOME=str(readonly_home), TMPDIR=str(tmp_path / "tmp"))
    for var in ("HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        env.pop(var, None)
    env["VERL_RECIPES_CACHE"] = str(readonly_home / ".cache" / "verl-recipes")  # the default, in the home

    def load(how: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _LOAD, str(data), how], env=env, capture_output=True, text=True, timeout=120
        )

    bare = load("bare")
    assert bare.returncode != 0 and "Read-only file system" in bare.stderr, bare.stderr[-2000:]
    ours = load("cli")
    assert ours.returncode == 0 and ours.stdout.strip().endswith("rows 3"), ours.stderr[-2000:]
    base = tmp_path / "tmp" / f"verl-recipes-{os.getuid()}"
    note = [ln for ln in ours.stderr.splitlines() if ln.startswith("note: ")]
    assert len(note) == 1 and f"the library caches go to {base} (HF_HOME={base / 'huggingface'}" in note[0], note
    assert (base / "huggingface" / "datasets").is_dir()
    assert not any((readonly_home / ".cache").iterdir())


def test_a_run_folder_on_a_read_only_filesystem_is_one_line(readonly_home: Path, tmp_path: Path) -> None:
    """EROFS at the claim: one line naming the folder and what to do, exit 2, nothing written."""
    run = readonly_home / "runs" / "r1"
    r = _write_run(run, tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines == [
        f"error: verl-recipes train: the filesystem is read-only: {run} (the run folder); nothing half-written "
        "was kept there; write to a writable place, then run the command again"
    ], lines
    assert not (readonly_home / "runs").exists()


def test_a_cache_entry_on_a_full_disk_is_one_line_and_leaves_no_partial(small_fs: Path, tmp_path: Path) -> None:
    """A synthetic model written into a disk with 64 KiB free: the tokenizer library's own error
    (Rust's "No space left on device (os error 28)", not an OSError) is the same one line, and
    neither the entry, its partial nor its claim is left for the next command to trip on."""
    fill(small_fs, 16 * PAGE)
    out = small_fs / "models" / "m"
    args = ["synth-model", "--arch", "qwen2-0.5b", "--scale", "tiny", "--layers", "2", "--out", str(out)]
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", *args],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: verl-recipes synth-model: no space left on the filesystem: {out} ("
    ), lines
    assert sorted(p.name for p in small_fs.rglob("*")) == ["filler", "models"]


def test_a_disk_that_fills_under_the_monitor_stops_sampling_not_the_command(small_fs: Path, tmp_path: Path) -> None:
    """One page free: the monitor's samples fill it, it says so in one line and stops sampling,
    the command runs to its end and its exit code is the monitor's; the report reads what there is."""
    fill(small_fs, PAGE)
    run = small_fs / "run"
    child = [sys.executable, "-c", "import time, sys; time.sleep(2); sys.exit(3)"]
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "monitor", "--out", str(run), "--interval", "0.02", "--", *child],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"monitor: {run / 'samples.jsonl'}: no space left on the filesystem; sampling stops here, the command goes on"
    ]
    (tmp_path / "report").mkdir()
    rep = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "report", str(run), "--out", str(tmp_path / "report")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0 and (tmp_path / "report" / "summary.json").is_file(), rep.stderr[-3000:]
