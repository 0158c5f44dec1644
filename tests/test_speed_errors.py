"""`plan --speed-errors` (verl_recipes.plan.speed_errors): the step-time model held to the runs."""

from __future__ import annotations

from verl_recipes.paths import repo_root
from verl_recipes.plan.runs import read_run
from verl_recipes.plan.speed_errors import judged_runs, markdown, measured_phases, speed_rows
from verl_recipes.predict.speed import load_priors

QUICKSTART = "validation/verl-examples/results/gsm8k-quickstart/h100x1-ppo"


def test_the_committed_table_is_what_the_command_writes_now() -> None:
    root = repo_root()
    priors = load_priors()
    text = markdown(speed_rows(judged_runs(root, priors)), priors)
    committed = (root / "validation" / "speed-errors.md").read_text()
    assert committed == text, "regenerate: verl-recipes plan --speed-errors --write validation/speed-errors.md"


def test_measured_is_step_two_on_not_the_warm_up() -> None:
    """The quickstart logged two steps: its figure is step 2's alone, never step 1's warm-up."""
    run = read_run(repo_root() / QUICKSTART)
    measured, steps = measured_phases(run)
    first, second = (st["timing_s"] for st in run.raw["steps"][:2])
    assert steps == 1
    assert measured["update_actor"] == second["update_actor"] != first["update_actor"]
    assert measured["step"] == second["step"] < first["step"]


def test_rank_rehearsals_are_not_judged() -> None:
    labels = {j.label for j in judged_runs(repo_root(), load_priors())}
    assert QUICKSTART in labels
    assert not any("rank" in lab and "of" in lab.rsplit("/", 1)[-1] for lab in labels)
