"""Interrupted, concurrent and truncated work never poisons the next command.

Real processes, real signals, real files: a synth-model write stopped by SIGINT to its process
group, two processes racing for one run folder, a claim whose holder was SIGKILLed, a gzip cut
in half by a copy.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest
from verl_recipes import inflight

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "monitor"


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "common"), env.get("PYTHONPATH", "")])
    env["VERL_RECIPES_CACHE"] = str(cache)
    return env


def _cli(*args: str, cache: Path, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "verl_recipes.cli", *args],
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches it
        **kw,  # type: ignore[arg-type]
    )


def _wait_for(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --- interruption -------------------------------------------------------------------------------


def test_ctrl_c_during_a_synthetic_model_write_leaves_the_cache_usable(tmp_path: Path) -> None:
    """SIGINT to the process group while the weights stream: exit 130, one line, nothing half there,
    and the same command then writes the model (the cache entry never blocks a later run)."""
    cache = tmp_path / "cache"
    out = cache / "models" / "qwen2-0.5b-full-width-L2"
    args = ("synth-model", "--arch", "qwen2-0.5b", "--layers", "2", "--out", str(out))
    p = _cli(*args, cache=cache)
    partial = out.parent / f".{out.name}.partial-{p.pid}"
    _wait_for(lambda: (partial / "model.safetensors").exists(), 120, "the weights to start streaming")
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted: verl-recipes synth-model"), err
    assert str(out) in lines[0] and "nothing of it was kept" in lines[0]
    assert not out.exists() and not partial.exists()
    assert not any(out.parent.glob(f".{out.name}.*")), list(out.parent.iterdir())  # no lock, no partial

    again = _cli(*args[:-4], "--scale", "tiny", "--layers", "2", "--out", str(out), cache=cache)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert json.loads((out / "synth.json").read_text())["scale"] == "tiny"


def test_a_cache_entry_an_older_writer_left_half_written_is_written_again(tmp_path: Path) -> None:
    """A model folder in the cache without its synth.json (a writer stopped before its last file) is
    the cache's own incomplete entry: replaced, not refused. A user's folder is still refused."""
    cache = tmp_path / "cache"
    out = cache / "models" / "llama-2-7b-tiny-L2"
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"model_type": "llama"}')
    (out / "model.safetensors").write_bytes(b"\0" * 100)  # cut short
    p = _cli("synth-model", "--arch", "llama-2-7b", "--scale", "tiny", "--out", str(out), cache=cache)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert (out / "synth.json").is_file() and (out / "model.safetensors").stat().st_size > 100

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    p = _cli("synth-model", "--arch", "llama-2-7b", "--scale", "tiny", "--out", str(mine), cache=cache)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "not empty and not a synth-model output" in err
    assert [f.name for f in mine.iterdir()] == ["notes.txt"]


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from verl_recipes import cli
    from verl_recipes.workload import userpaths

    def body():
        run = Path(sys.argv[1])
        userpaths.claim_run_dir(run, False)
        userpaths.mark_incomplete(run)
        (run / "command.sh").write_text("train\\n")
        print("holding", flush=True)
        time.sleep(float(sys.argv[2]))
        userpaths.mark_complete(run)
        print("done", flush=True)

    sys.exit(cli.run_guarded("train", body))
    """
)


def _holder(run: Path, hold_s: float, cache: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(run), str(hold_s)],
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_an_interrupted_run_folder_is_marked_incomplete_and_a_retry_proceeds(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    p = _holder(run, 60, tmp_path)
    assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: verl-recipes train"), err
    assert str(run) in lines[0] and "marked incomplete" in lines[0]
    assert json.loads((run / "incomplete.json").read_text())["pid"] == p.pid

    again = _holder(run, 0, tmp_path)
    out, err = again.communicate(timeout=30)
    assert again.returncode == 0, err
    assert "kept in" in out and out.strip().endswith("done")
    assert sorted(f.name for f in run.iterdir()) == ["attempt-1", "command.sh"]
    assert sorted(f.name for f in (run / "attempt-1").iterdir()) == ["command.sh", "incomplete.json"]


def test_ctrl_c_during_a_rehearsal_marks_its_run_folder_and_the_same_command_runs_again(tmp_path: Path) -> None:
    """`verl-recipes train 7b-lora --preview` stopped by SIGINT to its process group once it works in
    its run folder: exit 130, one `interrupted:` line naming the folder, which stays marked
    incomplete; the same command then sets that attempt aside and previews to the end."""
    cache, run = tmp_path / "cache", tmp_path / "runs" / "r1"
    args = ("train", "7b-lora", "--preview", "--run-dir", str(run))
    p = _cli(*args, cache=cache)
    _wait_for(lambda: (run / "incomplete.json").exists() or p.poll() is not None, 600, "the run folder's marker")
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, (out + err)[-3000:]
    said = [ln for ln in err.splitlines() if ln.startswith("interrupted:")]
    assert len(said) == 1 and said[0] == err.strip().splitlines()[-1], err
    assert said[0].startswith("interrupted: verl-recipes train") and f"{run}: marked incomplete" in said[0]
    assert json.loads((run / "incomplete.json").read_text())["pid"] == p.pid

    again = _cli(*args, cache=cache)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, (out + err)[-3000:]
    assert "an earlier attempt was stopped before it finished; it is kept in" in out
    assert "training needs an NVIDIA GPU" in out.strip().splitlines()[-1]
    assert (run / "attempt-1" / "incomplete.json").is_file() and not (run / "incomplete.json").exists()
    assert (run / "verl_config.yaml").is_file() and not inflight.lock_path(run).exists()


# --- concurrency --------------------------------------------------------------------------------


def test_two_launches_into_one_run_folder_exactly_one_proceeds(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "race"
    procs = [_holder(run, 3, tmp_path) for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], results
    loser = next(r for p, r in zip(procs, results, strict=True) if p.returncode == 2)
    winner = next(p for p in procs if p.returncode == 0)
    lines = loser[1].strip().splitlines()
    assert len(lines) == 1 and f"claimed by pid {winner.pid} (" in lines[0], loser
    assert not (run / "attempt-1").exists()  # the loser touched nothing


def test_a_dead_holders_claim_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "stale"
    p = _holder(run, 60, tmp_path)
    assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    os.killpg(p.pid, signal.SIGKILL)  # no handler runs: the lock file and the marker stay
    p.wait(timeout=10)
    assert inflight.lock_path(run).exists()
    again = _holder(run, 0, tmp_path)
    _, err = again.communicate(timeout=30)
    assert again.returncode == 0, err
    assert (run / "attempt-1" / "incomplete.json").is_file()
    assert not inflight.lock_path(run).exists()


def test_two_dataset_writers_at_once_one_proceeds(tmp_path: Path) -> None:
    out = tmp_path / "data"
    procs = [_cli("dataset", "--out", str(out), "--train", "60000", cache=tmp_path) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], results
    err = next(r[1] for p, r in zip(procs, results, strict=True) if p.returncode == 2)
    assert "claimed by pid" in err and len(err.strip().splitlines()) == 1
    import pyarrow.parquet as pq

    assert pq.read_metadata(out / "train.parquet").num_rows == 60000


# --- truncated records --------------------------------------------------------------------------


def test_report_reads_a_gzip_cut_short_and_says_where(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "cpu-run", run)
    raw = (run / "samples.jsonl").read_bytes()
    packed = gzip.compress(raw)
    (run / "samples.jsonl").unlink()
    (run / "samples.jsonl.gz").write_bytes(packed[: len(packed) // 2])  # a copy that stopped halfway
    (run / "exit_code").write_text("0\n")  # what the launcher recorded: the run ended well
    whole = zlib.decompressobj(wbits=31).decompress(packed[: len(packed) // 2]).count(b"\n")
    r = subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "report", str(run)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "samples.jsonl.gz" in ln]
    assert len(warn) == 1 and "ends early after line" in warn[0], r.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["samples"] < raw.count(b'"kind":"sample"')
    assert (run / "report.md").is_file() and not list(run.glob(".*partial*"))
    # both files say where the samples end, and keep the exit code the run recorded
    cut = summary["samples_cut"]
    assert cut["line"] == whole + 1 and cut["file"] == "samples.jsonl.gz" and not cut["exit_record"], cut
    assert summary["exit_code"] == 0 and summary["ended"]["ok"] and summary["ended"]["last_error"] is None
    report = (run / "report.md").read_text()
    assert f"samples cut at line {whole + 1} (time 20" in report and "s after the start) of samples.jsonl.gz" in report
    assert "exit code: 0 (as the launcher recorded it in exit_code)" in report and "killed?" not in report


def test_a_summary_cut_short_is_named_and_left_out_of_the_tables(tmp_path: Path) -> None:
    from verl_recipes import rundir

    good, bad = tmp_path / "results" / "a", tmp_path / "results" / "b"
    for d in (good, bad):
        d.mkdir(parents=True)
    rundir.write_summary(good, {"schema": rundir.SUMMARY_SCHEMA, "steps": []})
    text = json.dumps({"schema": rundir.SUMMARY_SCHEMA, "steps": []}, indent=1)
    (bad / rundir.SUMMARY).write_text(text[: len(text) // 2])
    (bad / rundir.PROVENANCE).write_text('{"date_utc": "2026-')
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from verl_recipes import rundir;"
            "print([p.name for p in rundir.measured_runs(Path(sys.argv[1]))]);"
            "print(rundir.read_provenance(Path(sys.argv[2])).raw)",
            str(tmp_path / "results"),
            str(bad),
        ],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["['a']", "{}"]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and all("ends early" in ln for ln in lines), r.stderr


@pytest.mark.parametrize("cut", ["torn", "whole"])
def test_jsonl_with_a_torn_last_line_says_so(tmp_path: Path, cut: str, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_recipes import rundir

    path = tmp_path / f"{cut}.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n' + ('{"a": ' if cut == "torn" else ""))
    recs, _ = rundir.read_jsonl(path)
    assert recs == [{"a": 1}, {"a": 2}]
    err = capsys.readouterr().err
    assert ("line 3 is cut short" in err) == (cut == "torn"), err


def test_a_dataset_cut_short_by_an_older_writer_is_not_complete(tmp_path: Path) -> None:
    from verl_recipes.workload import dataset

    out = tmp_path / "arith"
    dataset.write(out, 64, 8)
    assert dataset.complete(out)
    raw = (out / "test.parquet").read_bytes()
    (out / "test.parquet").write_bytes(raw[: len(raw) // 2])  # as a writer killed mid-file left it
    assert not dataset.complete(out)
    dataset.write(out, 64, 8)  # the cache's own folder (its marker is there): written again, whole
    assert dataset.complete(out)


def test_an_out_path_in_a_folder_that_does_not_exist_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """`--out comparisons/x.md` where `comparisons/` is missing: one line naming the folder, exit 2."""
    runs = ROOT / "recipes" / "13b-fsdp" / "results"
    out = tmp_path / "missing" / "cmp.md"
    p = _cli(
        "compare-ranks", str(runs / "h200x1-ppo"), str(runs / "h200x1-ppo-rank0of1"), "--out", str(out), cache=tmp_path
    )
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 2, stderr
    assert stderr.strip().splitlines() == [
        f"error: the comparison goes to {out}, but the folder {out.parent} does not exist: "
        "create it or give a path in an existing folder"
    ]
    assert not out.parent.exists()
