"""What `train` does after verl exits (`measure.outcome`), on committed H200 run folders and a
real torch profiler trace made here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from verl_recipes import RecipeError, rundir
from verl_recipes.measure import outcome

RESULTS = Path(__file__).resolve().parents[1] / "recipes"


def test_cap_overrun_names_the_worst_phase_of_a_real_run() -> None:
    """A measured run (7B PPO, uncapped, 70.9 GiB device peak) judged against two caps."""
    run = RESULTS / "7b-lora" / "results" / "h200x1-ppo"
    msg = outcome.cap_overrun(run, 24)
    assert msg is not None and "70.87 GiB" in msg and "GPU 0" in msg and "--cap-gib 24" in msg
    assert "phase gen" in msg or "phase update_weights" in msg or "phase step" in msg
    assert outcome.cap_overrun(run, 80) is None


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("h200x1-ppo-tp1pp1-l2-no-energon", "ModuleNotFoundError: No module named 'megatron.energon'"),
        (
            "h200x1-ppo-tp1pp1-l2-grad-accum-fusion",
            "RuntimeError: ColumnParallelLinear was called with gradient_accumulation_fusion",
        ),
    ],
)
def test_a_failed_trains_last_line_names_the_cause_not_rays_teardown(name: str, cause: str) -> None:
    """The line `verl-recipes train` ends a failed run with gives the report's cause. On the H200
    these two runs' lines named `ray-logs/dashboard.log: ... Exiting with SIGTERM immediately`,
    the first Ray log with an error line, while the report named the exception."""
    run = RESULTS / "70b-3d" / "results" / "failed" / name
    why = outcome.failure_reason(run, 1)
    assert why.startswith(f"; {rundir.LOG}: {cause}"), why
    assert "dashboard" not in why and "SIGTERM" not in why


def test_a_failed_run_is_reported_and_ends_with_its_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole conclusion of a run verl left with exit 1 (a committed H200 run, its report
    removed): exit_code written, the report made again in this process, and one line naming the
    exception the driver died of, with the folder."""
    run = tmp_path / "run"
    shutil.copytree(RESULTS / "70b-3d" / "results" / "failed" / "h200x1-ppo-tp1pp1-l2-no-energon", run)
    for name in (rundir.EXIT_CODE, rundir.REPORT, rundir.SUMMARY, rundir.TIMELINE):
        (run / name).unlink()
    with pytest.raises(RecipeError) as e:
        outcome.conclude(run, 1, None)
    assert str(e.value) == (
        f"verl exited 1; {rundir.LOG}: ModuleNotFoundError: No module named 'megatron.energon'; "
        f"the log and everything measured up to then are in {run}"
    )
    assert (run / rundir.EXIT_CODE).read_text() == "1\n"
    assert (run / rundir.REPORT).is_file() and (run / rundir.TIMELINE).is_file()
    assert f"wrote {run}/{rundir.SUMMARY}" in capsys.readouterr().out


def test_a_run_over_its_cap_is_refused_after_it_is_reported(tmp_path: Path) -> None:
    """A run that exited 0 but whose device total passed --cap-gib: cap_exceeded.txt and the line."""
    run = tmp_path / "run"
    shutil.copytree(RESULTS / "7b-lora" / "results" / "h200x1-ppo", run)
    with pytest.raises(RecipeError, match="over the --cap-gib 24 budget"):
        outcome.conclude(run, 0, 24)
    assert "70.87 GiB" in (run / rundir.CAP_EXCEEDED).read_text()
    assert outcome.conclude(run, 0, 80) == 0


def test_a_run_folder_with_nothing_measured_still_ends_with_its_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl died before the monitor wrote a sample: the report cannot be made, and says so in one
    line; the run's own line still comes."""
    with pytest.raises(RecipeError, match=r"^verl exited 3; the log and everything measured"):
        outcome.conclude(tmp_path, 3, None)
    assert capsys.readouterr().err.startswith("report not written: ")


def _trace(where: Path) -> Path:
    import torch

    out = where / "t.json"
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            torch.log_softmax(a @ b, dim=-1)
    prof.export_chrome_trace(str(out))
    return out


def test_a_folder_of_stage_traces_gets_one_section_each_and_a_bad_one_says_so(tmp_path: Path) -> None:
    """verl's discrete profiler writes one trace per stage; the run's profile/summary.md (written by
    `train` after a profiled run) puts them side by side, and one unreadable trace does not hide
    the others."""
    run_dir = tmp_path / "run"
    prof = run_dir / "profile"
    prof.mkdir(parents=True)
    _trace(tmp_path).rename(prof / "actor_update_step2.json")
    (prof / "critic_update_step2.json.gz").write_bytes(b"not gzip")
    summary = outcome.summarize_traces(run_dir)
    assert summary == prof / "summary.md"
    text = summary.read_text()
    assert "# Trace: actor_update_step2.json" in text and "matrix multiply" in text
    assert "# Trace: critic_update_step2.json.gz" in text and "unreadable" in text
    assert outcome.summarize_traces(run_dir) is None  # an existing summary is never overwritten
    assert outcome.summarize_traces(tmp_path / "unprofiled") is None
