"""The FSDP communicator term (`verl_recipes.predict.fsdp_comm`) and its calibration (`plan.comm_fit`).

The buffer arithmetic is worked out here by hand from NCCL 2.28's constants; the communicators
from verl's real composed config; the calibration is regenerated from its two committed runs and
must be the committed data file; `plan` shows the term per communicator and the rehearsed part.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from verl_recipes import GIB
from verl_recipes.cli import main
from verl_recipes.plan.comm_fit import FIT_PATH, fit, render
from verl_recipes.plan.rank_check import _steady
from verl_recipes.predict import fsdp_comm
from verl_recipes.predict.fsdp_comm import Communicator, communicators, fsdp_group_bytes, fsdp_group_terms, load_fit
from verl_recipes.predict.gpus import parse_gpu
from verl_recipes.predict.phases import Constants, plan_gpu
from verl_recipes.predict.setup import load_setup

MIB = 1024**2


def test_a_communicators_buffers_by_hand() -> None:
    """LL 8 x 512 x 8 x 16 B = 512 KiB, LL128 120 x 640 x 8 x 8 B = 4,800 KiB, Simple 4 MiB: 9.1875
    MiB a connection; 32 channels, a ring and a tree connection's worth a rank at two ranks (588 MiB),
    a ring and two of the tree's in a chain of more (882 MiB); point-to-point 4 MiB each way per
    peer and channel; a group of one has no peer."""
    assert fsdp_comm.CONNECTION_BYTES == 512 * 1024 + 4800 * 1024 + 4 * MIB == round(9.1875 * MIB)
    assert Communicator("pair", 2).buffer_bytes() == 588 * MIB
    assert Communicator("node", 8).buffer_bytes() == 882 * MIB
    assert Communicator("sp", 4, collectives=False, p2p=True).buffer_bytes() == 3 * 2 * 2 * 4 * MIB
    assert Communicator("alone", 1).buffer_bytes() == 0


def test_the_communicators_of_an_fsdp_rank() -> None:
    """13b-fsdp on 2 GPUs: the default group alone (the 1-D FSDP mesh of the world is it); on 8 GPUs
    with Ulysses SP2 also the sp group (all-to-all) and the dp group of 4; at SP8 the dp group has
    no peer; on one GPU nothing."""
    _, s, _ = load_setup("13b-fsdp", [], [])
    assert (s.world, s.actor.ulysses_sp) == (2, 1)
    assert [(c.size, c.p2p) for c in communicators(s)] == [(2, False)]

    def on(gpus: int, sp: int) -> list[tuple[int, bool]]:
        x = dataclasses.replace(s, gpus_per_node=gpus, actor=dataclasses.replace(s.actor, ulysses_sp=sp))
        return [(c.size, c.p2p) for c in communicators(x)]

    assert on(8, 2) == [(8, False), (2, True), (4, False)]
    assert on(8, 8) == [(8, False), (8, True)]
    assert on(1, 1) == [] and fsdp_group_terms(dataclasses.replace(s, gpus_per_node=1)) == []


def test_the_calibration_is_what_its_runs_regenerate_and_closes_their_gap(root: Path) -> None:
    """The committed fit is the one its two runs give (the real two-GPU 13B job and its rank 0
    rehearsed), and the model's buffers plus NCCL's own make up the training process's memory
    beyond its allocator that the real run has and the rehearsal has not (1.51 against 0.78 GiB)."""
    got = fit(root)
    assert render(got) == (root / FIT_PATH).read_text()
    assert load_fit() == got
    real, reh = (_steady(root / r)["beyond_allocator_gib"] for r in (got.real, got.rehearsal))
    assert real is not None and reh is not None and (round(real, 2), round(reh, 2)) == (1.51, 0.78)
    gap = got.real_beyond_allocator_bytes - got.rehearsal_beyond_allocator_bytes
    assert abs(got.buffers_bytes + got.process_bytes - gap) <= MIB
    assert 0 < got.process_bytes < got.buffers_bytes


def test_a_real_fsdp_job_plans_its_group_and_a_rehearsal_none() -> None:
    """The same rank planned as the real job and as its rank rehearsal differ by the group's
    terms in every phase, and by nothing else."""
    _, s, _ = load_setup("13b-fsdp", [], [])
    h200, c = parse_gpu("h200-141g"), Constants()
    real, fake = plan_gpu(s, h200, c), plan_gpu(dataclasses.replace(s, fake_group=True), h200, c)
    group = fsdp_group_bytes(s)
    assert group == 588 * MIB + load_fit().process_bytes  # type: ignore[union-attr]
    for a, b in zip(real.phases, fake.phases, strict=True):
        assert a.total - b.total == group, a.phase
    assert fsdp_group_bytes(dataclasses.replace(s, fake_group=True)) == 0


def test_plan_names_what_a_rank_rehearsal_cannot_allocate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "13b-fsdp", "--gpu", "h200-141g"]) == 0
    out = capsys.readouterr().out
    assert "real process group, per rank, PREDICTED: 0.74 GiB in every phase; a rank rehearsal allocates" in out
    assert "NCCL buffers: default group of 2 (FSDP mesh, verl's collectives): 0.57 GiB" in out
    assert main(["plan", "13b-fsdp", "--gpu", "h200-141g", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    group = js["real_process_group"]
    assert group["rehearsal_allocates"] is False and len(group["terms"]) == 2
    assert abs(group["bytes"] / GIB - 0.74) < 0.01
