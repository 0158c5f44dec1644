"""Where a committed run differs from its recipe as it stands: the label a bounds file's row gets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from verl_recipes.docs import results_table
from verl_recipes.recipe.drift import drift, drift_label
from verl_recipes.recipe.metadata import get_recipe
from verl_recipes.rundir import read_provenance

RESULTS = Path("recipes/7b-lora/results")
MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
EXECUTOR = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"


def test_the_default_run_matches_the_recipe_and_older_runs_name_what_moved(root: Path) -> None:
    recipe = get_recipe("7b-lora")
    assert drift(recipe, root / RESULTS / "h200x1-ppo-start") == []
    # the previous default, before vLLM's worker moved into its engine process (verl's "mp")
    assert drift(recipe, root / RESULTS / "h200x1-ppo-mb8") == [(EXECUTOR, "uni", None)]
    # a run that set the executor itself (`--set ...distributed_executor_backend=mp`) is named by
    # that --set wherever it stands, not a second time as drift; so is a 70B rank of another TP
    assert any(s.startswith(f"{EXECUTOR}=mp") for s in read_provenance(root / RESULTS / "h200x1-ppo-start-base").sets)
    assert drift(recipe, root / RESULTS / "h200x1-ppo-start-base") == []
    tp2 = Path("recipes/70b-3d/results/h200x1-ppo-l4-rank4of8-tp2pp2")
    assert drift(get_recipe("70b-3d"), root / tp2) == []
    moved = {k: (want, got) for k, want, got in drift(recipe, root / RESULTS / "h200x1-ppo-chunked")}
    assert moved == {
        MICRO: (8, 2),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": (8, 4),
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": (8, 4),
        EXECUTOR: ("uni", None),
    }
    # the GRPO variant keeps the micro-batches it was measured with: only the executor moved since
    assert drift(recipe, root / RESULTS / "h200x1-grpo-chunked") == [(EXECUTOR, "uni", None)]


def test_what_did_not_change_what_ran_is_not_named(root: Path) -> None:
    """A cap's scaled vLLM fraction is the cap's; critic keys of a run without a critic, or ones
    verl 0.9.1 ignored (a run before the critic-engine-batching fix), changed nothing."""
    recipe = get_recipe("7b-lora")
    keys = {k for k, _, _ in drift(recipe, root / RESULTS / "h200x1-grpo-24gib-cap32")}
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" not in keys
    assert not any(k.startswith("critic.") for k in keys)
    assert "actor_rollout_ref.rollout.max_model_len" in keys  # that run predates max_model_len: 1024
    fast = {k for k, _, _ in drift(recipe, root / RESULTS / "h200x1-ppo-fast")}
    assert MICRO in fast and "critic.ppo_micro_batch_size_per_gpu" not in fast


def test_a_changed_key_in_a_copied_run_is_named_with_the_runs_value(root: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(root / RESULTS / "h200x1-ppo-start", run)
    cfg = OmegaConf.load(run / "verl_config.yaml")
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.gpu_memory_utilization", 0.5)
    OmegaConf.save(cfg, run / "verl_config.yaml")
    assert drift_label(get_recipe("7b-lora"), run) == "rollout.gpu_memory_utilization=0.5"


@pytest.fixture(scope="module")
def results() -> str:
    return results_table()  # reads every row's runs back through verl's config: ~4 s


def test_the_results_table_labels_each_row_by_what_ran(results: str) -> None:
    """Each row says what ran: its overrides, and the fixes its runs went without (micro2 came
    before replay-buffer-poll, after logprobs-chunked; its loop twin ran without the latter)."""
    rows = {r.split("](")[1].split(")")[0]: r for r in results.splitlines() if r.startswith("| 7b-lora")}
    assert "[default" in rows["recipes/7b-lora/expected/h200x1-ppo.yaml"]
    micro2 = rows["recipes/7b-lora/expected/h200x1-ppo-micro2.yaml"]
    assert "actor.ppo_micro_batch_size_per_gpu=2" in micro2 and "--verl-fix-off logprobs-chunked" not in micro2
    assert "--verl-fix-off replay-buffer-poll" in micro2
    assert "--verl-fix-off logprobs-chunked" in rows["recipes/7b-lora/expected/h200x1-ppo-micro2-loop.yaml"]


def test_a_row_measured_on_a_truncated_model_says_how_many_layers(results: str) -> None:
    """The 70B rows come from runs of 1 and 2 of its 80 layers on one of its 32 GPUs: the row's
    label names `--layers N` and `--gpus 1` from the run's own command line, so the figures cannot
    be read as the full model's or the full layout's."""
    rows = {r.split("](")[1].split(")")[0]: r for r in results.splitlines() if r.startswith("| 70b-3d")}
    assert "[tp1pp1, --layers 2, --gpus 1," in rows["recipes/70b-3d/expected/h200x1-ppo-tp1pp1-l2.yaml"]
    assert "[tp1pp1, --layers 1, --gpus 1," in rows["recipes/70b-3d/expected/h200x1-ppo-tp1pp1-l1.yaml"]
    assert not any("--layers" in r for r in results.splitlines() if r.startswith("| 7b-lora"))
