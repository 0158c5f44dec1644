"""On a GPU host: one rank of a small Megatron TP2 x PP2 layout, end to end, on one GPU.

The rank rehearsal of recipe 70b-3d (`verl-recipes train 70b-3d --rank R`, PyTorch's fake process
group with the Megatron fixes of `verl_recipes.worker.megatron_rehearsal`) at a layout small
enough for minutes of one H200: Llama-2-70B widths at 4 layers, TP2 x PP2 over 8 GPUs (DP2), the
colocated rollout as one TP1 replica of a TP2 rank, 3 steps, as rank 4, the first rank of the last
pipeline stage (output layer, loss, and activations received from a stage that is not there). A
verl or Megatron upgrade that breaks the rehearsal fails here before a 30-minute full-depth run
does. The run is the `70b-3d/h200x1-ppo-l4-rank4of8-tp2pp2` line of gpu/campaigns/70b-rank-small.txt, read from that
file so the test and the campaign cannot drift apart; CPU CI checks that line only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_gpu_megatron import campaign_line, train_line

CAMPAIGN = Path(__file__).resolve().parents[1] / "gpu" / "campaigns" / "70b-rank-small.txt"
LINE = "70b-3d/h200x1-ppo-l4-rank4of8-tp2pp2"


def test_the_line_is_one_rank_of_a_tp2_pp2_layout_on_the_last_stage() -> None:
    """Runs on CPU too: the line is TP2 x PP2 for every Megatron model and the rollout, and its rank
    is the first of the last pipeline stage in megatron-core's rank order."""
    import argparse

    from verl_recipes import train
    from verl_recipes.layout import MegatronLayout

    limit, args = campaign_line(LINE, CAMPAIGN)
    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    a = parser.parse_args(["train", *args])
    assert a.recipe == "70b-3d" and limit <= 900
    assert (a.gpus, a.rank, a.layers, a.steps) == (8, 4, 4, 3)
    sets = dict(s.split("=", 1) for s in a.sets)
    for key in ("actor_rollout_ref.actor.megatron", "critic.megatron"):
        assert sets[f"{key}.tensor_model_parallel_size"] == "2", key
    assert sets["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    layout = MegatronLayout(8, tp=2, pp=2)  # PP2 is the recipe's own
    assert layout.dp == 2 and layout.first_rank(1) == a.rank


@pytest.mark.gpu
def test_a_tp2_pp2_rank_runs_three_steps(root: Path, tmp_path: Path) -> None:
    limit, args = campaign_line(LINE, CAMPAIGN)
    run = train_line(root, tmp_path, LINE, limit, args)
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["rank_rehearsal"] == {"rank": 4, "world": 8, "pools": "rank share"}
