"""The GPU layout rules (`verl_recipes.layout`), and that the planner and the Slurm launcher's check
refuse a layout with the same line: the rules live in one place."""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_recipes import RecipeError, layout
from verl_recipes.cluster import settings as rc
from verl_recipes.predict.inputs import setup_from_config
from verl_recipes.predict.model import Arch
from verl_recipes.recipe.compose import compose_recipe
from verl_recipes.recipe.metadata import get_recipe
from verl_recipes.workload.arch import ARCHS_DIR

MEGATRON = "actor_rollout_ref.actor.megatron"


def _msg(fn: object, *args: object, **kw: object) -> str:
    with pytest.raises(RecipeError) as e:
        fn(*args, **kw)  # type: ignore[operator]
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_each_rule() -> None:
    assert layout.data_parallel(4, 8, (4, 2), "TP x PP", "fix") == 4
    assert _msg(layout.data_parallel, 3, 2, (2, 4), "TP x PP", "fix").startswith(
        "6 GPUs (3 nodes x 2) do not divide by TP x PP = 2 x 4 = 8; fix"
    )
    layout.tp_in_node(8, 4)
    assert "exceeds the 2 GPUs of a node" in _msg(layout.tp_in_node, 2, 4)
    assert "would span two nodes" in _msg(layout.tp_in_node, 6, 4)
    layout.heads_over_tp(8, 32, 4, "TP", kv_replicated=True)  # vLLM replicates KV heads
    assert "num_key_value_heads=4" in _msg(layout.heads_over_tp, 8, 32, 4, "TP", kv_replicated=False)
    assert "num_attention_heads=32" in _msg(layout.heads_over_tp, 3, 32, 32, "TP", kv_replicated=False)
    assert "num_hidden_layers=80" in _msg(layout.layers_over_pp, 3, 80, "PP")
    assert "not a multiple of 8" in _msg(layout.batch_over_ranks, 12, 8, 12, 12)
    assert "ppo_mini_batch_size" in _msg(layout.batch_over_ranks, 8, 8, 8, 16)
    assert "at least 1" in _msg(layout.positive, "TP", 0)


def _slurm(nodes: int, gpus: int, tp: int, pp: int, model: Path | None = None) -> str:
    env = {
        "SLURM_JOB_NODELIST": ",".join(f"n{i}" for i in range(nodes)),
        "SLURM_JOB_ID": "42",
        "SLURM_GPUS_ON_NODE": str(gpus),
        "TP": str(tp),
        "PP": str(pp),
        "MODEL_PATH": str(model or "meta-llama/Llama-2-70b-hf"),
        "TRAIN_CMD": "true",
    }
    return _msg(rc.check, env, "bare")


def _planner(nodes: int, gpus: int, tp: int, pp: int) -> str:
    recipe = get_recipe("70b-3d")
    sets = [
        f"trainer.nnodes={nodes}",
        f"trainer.n_gpus_per_node={gpus}",
        f"{MEGATRON}.tensor_model_parallel_size={tp}",
        f"{MEGATRON}.pipeline_model_parallel_size={pp}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]
    cfg = compose_recipe(recipe, [], sets)
    return _msg(setup_from_config, cfg, Arch.from_file(ARCHS_DIR / "llama-2-70b" / "config.json"))


def test_tensor_parallel_stays_inside_a_node_for_planner_and_launcher() -> None:
    """2 nodes x 6 GPUs = TP4 x DP3: the GPUs divide, but a TP group of 4 spans two 6-GPU nodes."""
    slurm, plan = _slurm(2, 6, 4, 1), _planner(2, 6, 4, 1)
    assert slurm == "TP=4 does not divide the 6 GPUs of a node, so a tensor-parallel group would span two nodes; " + (
        "use a TP that divides the GPUs per node"
    )
    assert plan == slurm.replace("TP", f"{MEGATRON}.tensor_model_parallel_size")


def test_gpus_that_do_not_divide_by_tp_pp_for_planner_and_launcher() -> None:
    slurm, plan = _slurm(3, 2, 2, 4), _planner(3, 2, 2, 4)
    assert slurm.startswith("6 GPUs (3 nodes x 2) do not divide by TP x PP = 2 x 4 = 8")
    assert plan.startswith("6 GPUs (3 nodes x 2) do not divide by actor TP x PP x CP = 2 x 4 x 1 = 8")


def test_launcher_divides_heads_by_tp_from_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((ARCHS_DIR / "llama-2-7b" / "config.json").read_text())
    assert _slurm(1, 6, 3, 1, tmp_path) == "TP=3 does not divide num_attention_heads=32"
    assert _planner(1, 6, 3, 2).endswith("tensor_model_parallel_size=3 does not divide num_attention_heads=64")
