"""On a GPU host: the last rank of a small FSDP PPO job, end to end, on one GPU.

A non-zero FSDP rank receives its weights from rank 0's broadcast (verl's
`fsdp2_load_full_state_dict`, FSDP1's `sync_module_states`), which the fake process group never
sends; `verl_recipes.worker.rank_rehearsal` gives such a rank rank 0's key list and finite shards.
This runs recipe 13b-fsdp (LoRA actor and critic, the reference as the actor without its adapter,
FSDP2) at Llama-2-13B widths and 2 layers as rank 1 of its 2 GPUs, 3 steps: a verl or torch
upgrade that breaks a non-zero rank fails here in minutes, before a full-depth rank does. The
arguments are the line of gpu/campaigns/rank-fsdp-small.txt, read from it (gpu/campaigns/rank-fsdp.txt
runs this test); the run folder is named by the rule for the card it ran on. CPU CI checks the
line only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_gpu_megatron import campaign_line, train_line

CAMPAIGNS = Path(__file__).resolve().parents[1] / "gpu" / "campaigns"
CAMPAIGN = CAMPAIGNS / "rank-fsdp-small.txt"
LINE = "13b-fsdp/h100x1-ppo-l2-rank1of2"
#: what every step of a rank with a critic must compute from finite weights
LOSSES = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "critic/values/mean")


def test_the_line_is_the_last_rank_of_a_small_fsdp_ppo_job() -> None:
    """Runs on CPU too: the line rehearses the last rank of 13b-fsdp (PPO with a critic, FSDP2,
    LoRA) at 2 layers, and the campaign runs this test file."""
    import argparse

    from verl_recipes import train
    from verl_recipes.recipe.metadata import get_recipe

    limit, args = campaign_line(LINE, CAMPAIGN)
    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    a = parser.parse_args(["train", *args])
    recipe = get_recipe(a.recipe)
    assert a.recipe == "13b-fsdp" and recipe.algorithm == "ppo" and recipe.backend == "fsdp"
    assert (a.rank, a.gpus or recipe.gpus.count, a.layers, a.steps) == (recipe.gpus.count - 1, 2, 2, 3)
    assert limit <= 900
    assert "|pytest tests/test_gpu_fsdp_rank.py" in (CAMPAIGNS / "rank-fsdp.txt").read_text()


@pytest.mark.gpu
def test_the_last_rank_of_a_small_fsdp_job_runs_three_steps(root: Path, tmp_path: Path) -> None:
    import torch
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_names import gpu_family, parse_run_name

    limit, args = campaign_line(LINE, CAMPAIGN)
    name = f"{gpu_family(torch.cuda.get_device_name(0))}x1-ppo-l2-rank1of2"
    parse_run_name(name, get_recipe("13b-fsdp").variants)
    run = train_line(root, tmp_path, name, limit, args)
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["rank_rehearsal"]["rank"] == 1 and prov["rank_rehearsal"]["world"] == 2
    for raw in (run / "verl_metrics.jsonl").read_text().splitlines():
        data = json.loads(raw)["data"]
        bad = {k: data.get(k) for k in LOSSES if not math.isfinite(float(data.get(k, math.nan)))}
        assert not bad, f"step {json.loads(raw)['step']}: {bad} (rank 1's shards are not finite?)"
