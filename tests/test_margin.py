"""The verdict's margin (verl_recipes.predict.margin), the spread data it reads
(verl_recipes.plan.spread, predict/spread.yaml) and the Megatron communicators it counts
(verl_recipes.predict.megatron_groups), against the committed reruns and verl's real config."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml
from verl_recipes import GIB
from verl_recipes.plan.runs import read_run
from verl_recipes.plan.spread import document, rerun_groups, write_spread
from verl_recipes.predict.margin import EXIT, FITS, NO, SPREAD_PATH, TIGHT, load_spread, margin
from verl_recipes.predict.megatron_groups import communicators, share_uncertainty
from verl_recipes.predict.phases import Constants
from verl_recipes.predict.setup import load_setup

MIB = 1024**2


@pytest.fixture(scope="module")
def job() -> object:
    return load_setup("70b-3d", [], [])[1]  # TP4 x PP2 x DP4 on 32 GPUs, composed against verl's config


def test_a_configuration_inside_its_band_is_tight_not_fits(job: object) -> None:
    """70b-3d's seed layout at its calibrated update_actor on an H100's 79.65 GiB: 0.4 GiB under
    the card is inside the band that moves it, so the verdict is tight (exit 3); the same figure
    with the band's room is fits (0), over the card does not fit (1)."""
    c = Constants()
    visible = round(79.65 * GIB)
    m = margin(job, "update_actor", round(79.23 * GIB), visible, c.nccl_bytes_per_communicator)  # type: ignore[arg-type]
    assert m.word == TIGHT and EXIT[m.word] == 3
    assert 0 < m.headroom < m.band
    parts = {p.name: p.bytes for p in m.parts}
    # the spread: the widest fraction Megatron's reruns measured in update_actor, times the peak
    runs = [
        read_run(Path("recipes/70b-3d/results") / n)
        for n in ("h200x1-ppo-l4-rank4of8-tp2pp2", "h200x1-ppo-l4-rank4of8-tp2pp2-2")
    ]
    peaks = [max(r.phases["update_actor"].values()) for r in runs]
    frac = (max(peaks) - min(peaks)) / min(peaks)
    filed = float(load_spread()["engines"]["megatron"]["update_actor"]["fraction"])
    assert filed == pytest.approx(frac, abs=5e-5)  # the data file keeps four digits
    assert parts["run-to-run spread"] == round(filed * round(79.23 * GIB))
    assert parts["process group share"] == share_uncertainty(4, 2, 1, 4, c.nccl_bytes_per_communicator)
    assert parts["what a fake group cannot allocate"] == 40_000_000 * 4
    roomy = margin(job, "update_actor", visible - m.band, visible, c.nccl_bytes_per_communicator)  # type: ignore[arg-type]
    assert roomy.word == FITS and EXIT[FITS] == 0
    over = margin(job, "update_actor", visible + 1, visible, c.nccl_bytes_per_communicator)  # type: ignore[arg-type]
    assert over.word == NO and EXIT[NO] == 1
    # a rank rehearsal's own plan has no real group, so no share of one
    fake = margin(dataclasses.replace(job, fake_group=True), "update_actor", visible, visible, 128 * MIB)  # type: ignore[type-var]
    assert "process group share" not in {p.name for p in fake.parts}


def test_megatron_communicators_follow_the_groups_a_step_touches() -> None:
    """TP4 x PP2 x DP4: TP, PP, DP with CP and without (two groups at CP1), TP x PP and the default
    group; a group of one makes no communicator (TP1 x PP1 on one GPU: none)."""
    names = [(c.group, c.size) for c in communicators(4, 2, 1, 4)]
    assert names == [
        ("tensor parallel", 4),
        ("pipeline parallel", 2),
        ("data parallel with context parallel", 4),
        ("data parallel", 4),
        ("model parallel (TP x PP)", 8),
        ("default (every rank)", 32),
    ]
    assert communicators(1, 1, 1, 1) == []
    assert share_uncertainty(1, 1, 1, 1, 128 * MIB) == 0
    # six at twice the prior, and a pipeline peer's own, less the six the planner holds
    assert share_uncertainty(4, 2, 1, 4, 128 * MIB) == (7 * 256 - 6 * 128) * MIB


def test_the_spread_file_is_what_the_committed_reruns_say(root: Path, tmp_path: Path) -> None:
    """predict/spread.yaml is regenerated from the committed reruns as committed; a rerun group
    holds runs of one configuration with the same device-memory fixes, so the older 7B runs that
    recorded none are no one's reruns."""
    assert document(root) == load_spread()
    groups = rerun_groups(root)
    assert [r.run_dir.name for r in groups["7b-lora/h200x1-ppo"][1]] == ["h200x1-ppo-4", "h200x1-ppo-5"]
    assert groups["70b-3d/h200x1-ppo-tp1pp1-l2"][0] == "megatron" and groups["7b-lora/h200x1-ppo"][0] == "fsdp"
    assert {"70b-3d/h200x1-ppo-tp1pp1-l2", "70b-3d/h200x1-ppo-l4-rank4of8-tp2pp2"} <= groups.keys()
    # written where a checkout keeps it, as the whole file
    (tmp_path / SPREAD_PATH).parent.mkdir(parents=True)
    for rid in ("70b-3d",):
        shutil.copytree(
            root / "recipes" / rid, tmp_path / "recipes" / rid, ignore=shutil.ignore_patterns("*.gz", "*.png")
        )
    out = write_spread(tmp_path)
    doc = yaml.safe_load(out.read_text())
    assert set(doc["engines"]) == {"megatron"} and doc["engines"]["megatron"]["update_actor"]["fraction"] > 0.03
