"""The margin a verdict needs: what is known to move a job's peak, and by how much.

A peak that fits by less than what moves it from run to run is not a "yes" anyone should rent
32 GPUs on. The verdict has three words (`WORDS`), each with its exit status for `plan --gpu`:

* fits (0): the peak leaves at least the band below the card's visible memory;
* tight (3): the peak is under the card, by less than the band;
* does not fit (1): over the card, or vLLM cannot start (2 stays bad input, as everywhere).

The band is the sum of its parts, each stated with its source (summed, not combined as
independent errors: a rented job meets the worst of them together):

* the run-to-run spread of the phase that peaks, for the job's engine: the widest fraction any
  committed configuration's reruns measured for that phase (`predict/spread.yaml`, written by
  `plan.spread`), times the peak. A fraction, not GiB: it was measured on phases of 12-95 GiB
  and what moves (the lengths random weights sample, the allocator's cache around them) grows
  with the phase; on the phase of a 78 GiB job it is the conservative reading;
* the allocator's fragmentation: inside the spread, counted once. On the Megatron reruns what
  PyTorch allocated agrees to 0.01 GiB and all of the spread is the cache beyond it;
* the Megatron process group's share: how far the planner's communicator term can be off
  (`megatron_groups.share_uncertainty`), for a job of real groups;
* what a fake group cannot allocate: a rank rehearsal's collectives return at once, so the
  buffer a real reduce-scatter keeps until NCCL's stream is done is never held. On Megatron one
  gradient bucket of the distributed data-parallel optimizer: megatron-core's DDP bucket,
  max(40 M, 1 M x DP) parameters, in fp32 (verl sets `grad_reduce_in_fp32`).

Reads the data file only; `plan.spread` regenerates it from the committed reruns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import GIB, RecipeError
from verl_recipes.predict.inputs import Setup
from verl_recipes.predict.megatron_groups import share_uncertainty

SPREAD_SCHEMA = "verl-recipes/spread/1"
SPREAD_FILE = Path(__file__).resolve().parent / "spread.yaml"
#: where the data file sits in a checkout (`plan.spread` writes it there)
SPREAD_PATH = Path("common/verl_recipes/predict/spread.yaml")

FITS, TIGHT, NO = "fits", "tight", "does not fit"
WORDS = (FITS, TIGHT, NO)
#: `plan --gpu`'s exit status per verdict, the worst GPU named deciding (2 is bad input)
EXIT = {FITS: 0, TIGHT: 3, NO: 1}


@dataclass(frozen=True)
class Part:
    """One part of the band: its bytes and where they come from."""

    name: str
    bytes: int
    why: str


@dataclass(frozen=True)
class Margin:
    """A verdict's figure against its card, with the band that moves it."""

    peak_phase: str
    peak_bytes: int
    visible_bytes: int
    parts: tuple[Part, ...]
    starts: bool = True  # False where vLLM cannot start whatever the peak (the planner's problems)

    @property
    def band(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def headroom(self) -> int:
        return self.visible_bytes - self.peak_bytes

    @property
    def word(self) -> str:
        if not self.starts or self.headroom < 0:
            return NO
        return FITS if self.headroom >= self.band else TIGHT


def load_spread(path: Path = SPREAD_FILE) -> dict[str, Any]:
    """The spread data file."""

    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("schema") != SPREAD_SCHEMA:
        raise RecipeError(f"{path}: not a {SPREAD_SCHEMA} file")
    return doc


def _spread_part(doc: dict[str, Any], engine: str, phase: str, peak: int) -> tuple[Part, Part]:
    """The spread of `phase` on `engine` (the engine's widest phase where this one was never
    rerun; every engine's where the engine never was), and the fragmentation inside it."""
    engines: dict[str, dict[str, Any]] = doc.get("engines") or {}
    rows = engines.get(engine) or {k: v for e in engines.values() for k, v in e.items()}
    row = rows.get(phase) or max(rows.values(), key=lambda r: float(r["fraction"]))
    frac = float(row["fraction"])
    runs = [str(r) for r in row["runs"]]
    src = f"{runs[0]} and {len(runs) - 1} rerun(s)" if len(runs) > 1 else runs[0]
    same = "" if phase in rows else f" (not rerun in {phase}: the engine's widest phase)"
    spread = Part(
        "run-to-run spread",
        round(frac * peak),
        f"{phase} on {engine} moved {frac:.1%} between reruns of one configuration ({src}){same}",
    )
    groups: dict[str, dict[str, Any]] = doc.get("groups") or {}
    group: dict[str, Any] = next((g for g in groups.values() if list(g.get("runs") or []) == runs), {})
    if "allocated_spread_gib" in group:
        how = (
            f"inside the spread: those reruns' allocated memory agrees to {group['allocated_spread_gib']:.2f} GiB, "
            f"the allocator's reserved cache moved {group['reserved_spread_gib']:.2f}"
        )
    else:
        how = "inside the spread (its reruns did not log the allocator)"
    return spread, Part("allocator fragmentation", 0, how)


def margin(
    s: Setup,
    peak_phase: str,
    peak_bytes: int,
    visible_bytes: int,
    per_communicator: int,
    *,
    starts: bool = True,
    doc: dict[str, Any] | None = None,
) -> Margin:
    """The band around a verdict's figure for job `s` (module docstring)."""
    doc = doc if doc is not None else load_spread()
    a = s.actor
    parts = list(_spread_part(doc, a.backend, peak_phase, peak_bytes))
    if a.backend == "megatron" and s.world > 1:
        dp = s.world // (a.tp * a.pp * a.cp)
        if not s.fake_group:
            parts.append(
                Part(
                    "process group share",
                    share_uncertainty(a.tp, a.pp, a.cp, dp, per_communicator),
                    "the planner's Megatron communicators at twice NCCL's buffer prior, plus a pipeline peer's own "
                    "(megatron_groups.py, validation/megatron-process-group.md)",
                )
            )
        bucket = max(40_000_000, 1_000_000 * dp) * 4
        parts.append(
            Part(
                "what a fake group cannot allocate",
                bucket,
                f"one fp32 gradient bucket ({bucket / 4e6:.0f} M parameters) a real reduce-scatter holds "
                "on NCCL's stream",
            )
        )
    return Margin(peak_phase, peak_bytes, visible_bytes, tuple(parts), starts)


def margin_lines(m: Margin, gpu_id: str) -> list[str]:
    """The verdict in one line and the band's parts under it, for `plan`'s text."""

    def g(b: float) -> str:
        return f"{b / GIB:.1f}"

    head = (
        f"{gpu_id}: {m.word}: {m.peak_phase} {g(m.peak_bytes)} of {g(m.visible_bytes)} GiB leaves "
        f"{g(m.headroom)} GiB; the margin it needs is {g(m.band)} GiB"
    )
    return [head, *(f"  {p.name}: {p.bytes / GIB:.2f} GiB ({p.why})" for p in m.parts)]
