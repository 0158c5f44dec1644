"""On an H100 80GB: recipe 70b-3d's settings for 80 GB cards keep their margin, rank by rank.

`--variant 80gib` (TP8 x PP2 x DP2) is predicted at 53.8 GiB a GPU with a 2.9 GiB margin
(`verl-recipes plan 70b-3d --variant 80gib --gpu h100-80g`). The lines of
gpu/campaigns/70b-80gib-h100.txt rehearse its ranks 16 and 0 at full depth; read from that file so
the test and the campaign cannot drift apart. On a GPU host each rank runs 3 steps and its peak
phase, with what the rehearsal cannot hold (the job's process group, as the planner plans it),
leaves at least the margin `plan` states below the card, and the planner is within 5% of it.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from test_gpu_megatron import campaign_line, train_line

CAMPAIGN = Path(__file__).resolve().parents[1] / "gpu" / "campaigns" / "70b-80gib-h100.txt"
RANKS = {"70b-3d/h100x1-ppo-80gib-rank16of32": 16, "70b-3d/h100x1-ppo-80gib-rank0of32": 0}


@pytest.mark.parametrize("line", sorted(RANKS))
def test_the_lines_are_the_first_rank_of_each_stage_of_the_80gib_layout(line: str) -> None:
    """Runs on CPU too: each line is the 80gib variant at full depth, 3 steps, inside one host's
    30 minutes, and its rank is the first of a pipeline stage in megatron-core's rank order."""
    from verl_recipes import train
    from verl_recipes.layout import MegatronLayout
    from verl_recipes.predict.setup import load_setup

    limit, args = campaign_line(line, CAMPAIGN)
    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    a = parser.parse_args(["train", *args])
    assert (a.recipe, a.variant, a.rank, a.steps, a.layers) == ("70b-3d", ["80gib"], RANKS[line], 3, None)
    assert limit <= 900
    s = load_setup("70b-3d", ["80gib"], [])[1]
    assert (s.actor.tp, s.actor.pp, s.world) == (8, 2, 32)
    assert MegatronLayout(32, tp=8, pp=2).first_rank(RANKS[line] // 16) == a.rank


@pytest.mark.gpu
@pytest.mark.parametrize("line", sorted(RANKS))
def test_an_80gib_rank_keeps_its_margin_on_the_card(root: Path, tmp_path: Path, line: str) -> None:
    from verl_recipes.plan.runs import judged_setup, read_run
    from verl_recipes.predict.gpus import GPU
    from verl_recipes.predict.margin import FITS, margin
    from verl_recipes.predict.phases import Constants, plan_gpu
    from verl_recipes.predict.setup import load_setup

    limit, args = campaign_line(line, CAMPAIGN)
    run = read_run(train_line(root, tmp_path, line, limit, args))
    peaks = {ph: max(per.values()) for ph, per in run.phases.items() if ph != "step"}
    phase = max(peaks, key=lambda k: peaks[k])
    total = next(iter(run.gpu_totals.values()))
    gpu = GPU(id="measured", name=run.gpu_name, memory_bytes=total, visible_bytes=total)
    c = Constants()
    # the rank's planned peak phase, as the rehearsal ran it (no process group) and as the job runs
    rehearsed = plan_gpu(judged_setup(run), gpu, c).phase(phase)
    assert rehearsed is not None and abs(rehearsed.total - peaks[phase]) <= 0.05 * peaks[phase], (phase, peaks)
    job = load_setup("70b-3d", ["80gib"], [])[1]
    real, fake = (plan_gpu(x, gpu, c).phase(phase) for x in (job, dataclasses.replace(job, fake_group=True)))
    assert real is not None and fake is not None
    group = real.total - fake.total
    m = margin(job, phase, peaks[phase] + group, total, c.nccl_bytes_per_communicator)
    assert m.word == FITS, (phase, peaks[phase], m)
