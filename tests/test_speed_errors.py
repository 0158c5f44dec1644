"""`plan --speed-errors` (verl_recipes.plan.speed_errors, .speed_fit): the step-time model
(verl_recipes.predict.speed) held to the committed runs, and its fitted priors regenerated from them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.plan.comm_fit import FIT_PATH as COMM_FIT
from verl_recipes.plan.errors import main_errors
from verl_recipes.plan.runs import judged_setup, read_run
from verl_recipes.plan.speed_errors import main_speed_errors, markdown, speed_rows
from verl_recipes.plan.speed_fit import FIT_PATH, Judged, fit, judged_runs, measured_phases, render
from verl_recipes.predict.gpus import catalogued
from verl_recipes.predict.speed import FITTED, SpeedPriors, load_priors, seconds, terms

QUICKSTART = "validation/verl-examples/results/gsm8k-quickstart/h100x1-ppo"


@pytest.fixture(scope="module")
def judged() -> list[Judged]:
    return judged_runs(repo_root())


@pytest.fixture(scope="module")
def fitted(judged: list[Judged]) -> dict[str, Any]:
    return fit(judged)


def test_the_committed_fit_and_table_are_what_the_command_writes_now(
    judged: list[Judged], fitted: dict[str, Any]
) -> None:
    root = repo_root()
    assert (root / FIT_PATH).read_text() == render(fitted), (
        "regenerate: verl-recipes plan --speed-errors --write validation/speed-errors.md"
    )
    assert load_priors(root / FIT_PATH) == FITTED
    text = markdown(speed_rows(judged, FITTED), FITTED)
    assert (root / "validation" / "speed-errors.md").read_text() == text, (
        "regenerate: verl-recipes plan --speed-errors --write validation/speed-errors.md"
    )


def test_measured_is_step_two_on_not_the_warm_up() -> None:
    """The quickstart logged two steps: its figure is step 2's alone, never step 1's warm-up."""
    run = read_run(repo_root() / QUICKSTART)
    measured, steps = measured_phases(run)
    first, second = (st["timing_s"] for st in run.raw["steps"][:2])
    assert steps == 1
    assert measured["update_actor"] == second["update_actor"] != first["update_actor"]
    assert measured["step"] == second["step"] < first["step"]


def test_rank_rehearsals_are_not_judged(judged: list[Judged]) -> None:
    labels = {j.label for j in judged}
    assert QUICKSTART in labels
    assert all(read_run(repo_root() / lab).provenance.rank_rehearsal is None for lab in labels)


def test_a_micro_batch_pays_each_layer_of_each_pass() -> None:
    """Qwen2.5-0.5B (24 layers), 256 sequences on one GPU: the update's 64 micro-batches of 4
    (verl's quickstart) each run four passes (forward, the recomputed forward, a backward twice
    a forward); old_log_prob's 32 micro-batches of 8 one."""
    run = read_run(repo_root() / QUICKSTART)
    s, gpu = judged_setup(run), catalogued(run.gpu_name)
    assert gpu is not None
    t = terms(s, gpu, 45, 511)
    assert t.train["update_actor"].layer_passes == 4 * 24 * 64
    assert t.train["old_log_prob"].layer_passes == 24 * 32
    assert t.logit_steps == 256 * 511 * s.arch.vocab
    bare, fitted = seconds(t, SpeedPriors()), seconds(t, replace(SpeedPriors(), layer_pass_s=0.002))
    assert fitted["update_actor"] - bare["update_actor"] == pytest.approx(4 * 24 * 64 * 0.002)
    # the roofline's own priors price no weight sync; the fitted ones do
    assert "update_weights" not in bare and FITTED.weight_sync_s > 0


def test_the_fit_reads_only_runs_with_every_rate_fix_on(judged: list[Judged], fitted: dict[str, Any]) -> None:
    clean = {j.label for j in judged if not j.rate_fixes_off}
    ev = fitted["evidence"]
    assert set(ev["runs"]) == clean and len(clean) < len(judged)
    assert ev["training_phases"]["n"] >= 2 * len(fitted["priors"])
    # one held-out figure per configuration, each named by one of the fit's own runs
    assert len(ev["step_error_held_out"]) == ev["configurations"] and set(ev["step_error_held_out"]) <= clean


def test_a_write_into_a_missing_folder_writes_no_fit_first(tmp_path: Path) -> None:
    """`--write` regenerates the fitted data files before the table; a table path in a folder that
    does not exist is refused in one line before any of them is written, for both error tables."""
    before = {p: p.stat().st_mtime_ns for p in (repo_root() / FIT_PATH, repo_root() / COMM_FIT)}
    for main in (main_speed_errors, main_errors):
        with pytest.raises(RecipeError, match="does not exist: create it"):
            main(write=tmp_path / "absent" / "table.md")  # type: ignore[operator]
    assert {p: p.stat().st_mtime_ns for p in before} == before
