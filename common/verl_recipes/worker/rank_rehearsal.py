"""Rank rehearsal: one local GPU runs verl's real trainer as rank R of an N-GPU job.

NCCL refuses two ranks on one GPU, so a job written for N GPUs cannot run on a host with fewer.
PyTorch's fake process group (backend ``fake``) lets one process be rank R of a world of N:
collectives return at once, but every buffer is allocated at its real size, so the rank's
shards, gathers and activations are real allocations on the GPU. The launcher asks for it with
`ENV_RANK` (``R/N``); the worker-side patches that act on it live here too.

What a rehearsal cannot measure is said wherever its numbers are shown: no NCCL buffers, no
communication time, no imbalance between ranks; its step time is a compute-only lower bound.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from verl_recipes import RecipeError

#: set by the launcher for every process of a rehearsed run: ``R/N`` (rank R of a world of N).
ENV_RANK = "VERL_RECIPES_RANK_REHEARSAL"


@dataclass(frozen=True)
class RankSpec:
    """Rank `rank` of a job of `world` GPUs, rehearsed on one local GPU."""

    rank: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1:
            raise RecipeError(f"a rank rehearsal needs a world of at least 1 GPU, not {self.world}")
        if not 0 <= self.rank < self.world:
            raise RecipeError(f"--rank {self.rank} is not a rank of this job's {self.world} GPU(s): use 0 to {self.world - 1}")

    @property
    def env_value(self) -> str:
        return f"{self.rank}/{self.world}"

    @property
    def label(self) -> str:
        """How reports, bounds files and tables name such a run."""
        return f"rank rehearsal ({self.rank} of {self.world})"

    @classmethod
    def parse(cls, value: str) -> RankSpec:
        try:
            rank, world = (int(x) for x in value.split("/"))
        except ValueError as e:
            raise RecipeError(f"{ENV_RANK}={value!r}: expected R/N, e.g. 0/2") from e
        return cls(rank, world)

    @classmethod
    def from_env(cls) -> RankSpec | None:
        value = os.environ.get(ENV_RANK)
        return cls.parse(value) if value else None
