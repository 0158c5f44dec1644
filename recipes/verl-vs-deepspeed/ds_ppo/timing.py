"""Ranks and phase timing of the DeepSpeed loop.

Timing method (the seed says it used torch.cuda.Event): every phase starts after a barrier over
all ranks and a `torch.cuda.synchronize()`, so no earlier work is still queued and no rank is still
finishing the previous phase; a start event is recorded, the phase runs, the device is
synchronized again (all streams: DeepSpeed overlaps communication on side streams), an end event
is recorded and waited for. The elapsed time between the two events then covers all GPU work and
any host work in between (an idle stream timestamps an event when it is recorded). On
a CPU the same code uses time.perf_counter. Each rank times its own phases; the loop reports the
maximum over ranks, the time the slowest GPU needed. Wall-clock (time.time) intervals are kept too,
to attribute NVML samples to phases.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class Dist:
    """This process's place in the job; every collective is a no-op with one process."""

    world: int = 1
    rank: int = 0
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rehearsed: bool = False  # one process standing in for rank `rank` of `world` (fake process group)

    @classmethod
    def from_env(cls, device_type: str) -> Dist:
        """Read RANK/WORLD_SIZE/LOCAL_RANK (set by torchrun and by the deepspeed launcher).

        A rank rehearsal (`VERL_RECIPES_RANK_REHEARSAL=R/N`, one process standing in for rank R of
        N) starts PyTorch's fake process group here, before DeepSpeed wraps the default group, so
        ZeRO-3 partitions to 1/N and every gather allocates at its real size."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device_type == "cuda":
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        else:
            device = torch.device("cpu")
        from verl_recipes.layout import RankSpec
        from verl_recipes.worker.rank_rehearsal import init_fake_group

        spec = RankSpec.from_env()
        if spec is not None:
            if world != 1:
                raise SystemExit("a rank rehearsal is one process: start it without torchrun's --nproc_per_node")
            init_fake_group(spec)
            return cls(world=spec.world, rank=spec.rank, local_rank=local, device=device, rehearsed=True)
        return cls(world=world, rank=rank, local_rank=local, device=device)

    @property
    def rank_rehearsal(self) -> dict[str, int] | None:
        """{rank, world} of a rank rehearsal, as provenance.json records it; None for a real job."""
        return {"rank": self.rank, "world": self.world} if self.rehearsed else None

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files: rank 0, or the one rank a rehearsal runs."""
        return self.rank == 0 or self.rehearsed

    @property
    def active(self) -> bool:
        return self.world > 1 and dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def sum_int(self, value: int) -> int:
        """The sum over the ranks; a rehearsal's fake group returns this rank's value alone (its
        own tokens, as its step records count them)."""
        if not self.active:
            return int(value)
        t = torch.tensor([value], dtype=torch.long, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return int(t.item())

    def job_sum_int(self, value: int) -> int:
        """The job's sum of a count each rank holds its share of: the token count a loss is divided
        by. A rehearsal cannot ask the ranks that are not there, so it takes `world` ranks holding
        as many as this one; with that the rank's loss and gradients have the job's scale."""
        if self.rehearsed:
            return int(value) * self.world
        return self.sum_int(value)

    def max_floats(self, values: list[float]) -> list[float]:
        if not self.active or not values:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]

    def mean_floats(self, values: list[float]) -> list[float]:
        """The mean over the ranks. A rehearsal reports its one rank's values: the fake group's
        all_reduce returns them alone, and dividing by `world` would give 1/world of them."""
        if not self.active or self.rehearsed or not values:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(v) / self.world for v in t.tolist()]

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's rows in rank order (equal shapes on all ranks)."""
        if not self.active:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=0)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order. A rehearsal has one real process: the fake group
        answers a gather with copies of its object, one per rank of the fake world, so the one
        process's object is all there is to report."""
        if not self.active or self.rehearsed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


class PhaseClock:
    """Accumulates seconds per phase name for one step (see the module docstring)."""

    def __init__(self, d: Dist) -> None:
        self.dist = d
        self.cuda = d.device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self.intervals: list[tuple[str, float, float]] = []

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dist.device)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.dist.barrier()
        self.sync()
        w0 = time.time()
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            p0 = time.perf_counter()
        yield
        if self.cuda:
            self.sync()  # every stream: ZeRO-3 gathers and reduce-scatters run on side streams
            end.record()
            end.synchronize()
            dt = start.elapsed_time(end) / 1000.0
        else:
            dt = time.perf_counter() - p0
        self.seconds[name] = self.seconds.get(name, 0.0) + dt
        self.intervals.append((name, w0, time.time()))
