"""Numbers and keys a user types: numeric options that mean nothing, Hydra's override prefixes in
`--set`, and what `show` warns about. The numbers through the real CLI in its own process (argparse
ends it); `show` through the same `main` in this process, where verl is imported and composed once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from verl_recipes.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "common"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _here(capsys: pytest.CaptureFixture[str], *calls: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Each call through `main` in this process: its exit status and what it printed, in the order asked."""
    done = []
    capsys.readouterr()
    for args in calls:
        code = main(args)
        out = capsys.readouterr()
        done.append(subprocess.CompletedProcess(["verl-recipes", *args], code, out.out, out.err))
    return done


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["plan", "7b-lora", "--gpus", "0"], "argument --gpus: 0 is below 1"),
        (["plan", "7b-lora", "--layers", "-2"], "argument --layers: -2 is below 1"),
        (["plan", "7b-lora", "--tokens-per-s", "0"], "argument --tokens-per-s: 0 is not above 0"),
        (["dataset", "--out", "OUT", "--train", "0"], "argument --train: 0 is below 1"),
        (["synth-model", "--arch", "llama-2-7b", "--out", "OUT", "--layers", "0"], "argument --layers: 0 is below 1"),
        (["monitor", "--out", "OUT", "--interval", "nan", "--", "true"], "argument --interval: 'nan' is not a finite"),
    ],
)
def test_numbers_that_mean_nothing_are_one_line(args: list[str], want: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = _cli(*[str(out) if a == "OUT" else a for a in args])
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and want in r.stderr, r.stderr
    assert not out.exists()  # nothing made


def test_a_worker_pool_of_none_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    """verl splits every batch over the agent-loop and reward-loop workers and TransferQueue its
    storage over its units: a pool of none would start the job and fail at its first step, so the
    planner (which `train`'s pre-flight runs) refuses it in one line; one worker is a pool."""
    keys = [
        "actor_rollout_ref.rollout.agent.num_workers",
        "reward.num_workers",
        "reward_model.num_workers",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units",
    ]
    runs = _here(capsys, *[["plan", "13b-fsdp", "--gpu", "h200-141g", "--set", f"{k}=0"] for k in keys])
    for key, r in zip(keys, runs, strict=True):
        line = r.stderr.strip()
        assert r.returncode == 2 and len(line.splitlines()) == 1, r.stderr
        assert line.startswith(f"error: {key}=0: ") and line.endswith("give 1 or more"), line
    (one,) = _here(capsys, ["plan", "13b-fsdp", "--gpu", "h200-141g", "--set", f"{keys[0]}=1"])
    assert one.returncode == 0, one.stderr


def test_hydra_prefixes_in_set_are_answered_for_the_key_meant(capsys: pytest.CaptureFixture[str]) -> None:
    plus2, plus, tilde, typo = _here(
        capsys,
        ["show", "7b-lora", "--set", "++data.train_batch_size=16", "--only", "data.train_batch_size"],
        ["show", "7b-lora", "--set", "+data.train_batch_size=16"],
        ["show", "7b-lora", "--set", "~data.max_prompt_length"],
        ["show", "7b-lora", "--set", "+data.train_batch_sise=16"],
    )
    assert plus2.returncode == 0 and plus2.stdout.strip() == "16", plus2.stderr
    assert plus.returncode == 2
    assert (
        "'data.train_batch_size' is already in verl's config" in plus.stderr
        and "--set data.train_batch_size=16" in plus.stderr
    )
    assert tilde.returncode == 2 and "Hydra's ~ deletes 'data.max_prompt_length'" in tilde.stderr
    assert typo.returncode == 2 and "unknown verl config key 'data.train_batch_sise'" in typo.stderr
    # the answer names the line as given and the form that works: + only adds, so it is dropped
    assert "--set +data.train_batch_sise=16: unknown verl config key" in typo.stderr
    assert "did you mean --set data.train_batch_size=16?" in typo.stderr
    assert all(len(x.stderr.strip().splitlines()) == 1 for x in [typo])


def test_show_warns_about_what_train_would_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    small, plain = _here(
        capsys,
        ["show", "7b-lora", "--set", "data.train_batch_size=4", "--only", "data.train_batch_size"],
        ["show", "7b-lora", "--only", "data.train_batch_size"],
    )
    assert small.returncode == 0 and small.stdout.strip() == "4"
    assert small.stderr.startswith("warning: train refuses this job: data.train_batch_size=4 is below"), small.stderr
    assert plain.returncode == 0 and plain.stderr == ""
