"""The verl 0.9.1 fixes the recipes run with, as one table: what each is and what going without it changes.

Each row names a fix as `--verl-fix-off` takes it and provenance.json records it, its number in
recipes/7b-lora/README.md ("fix 5" there and everywhere; its 3 is a configuration, not a patch),
the verl module it patches, what a run without it measures wrongly, and which runs it reaches at
all. The patches themselves run inside verl's workers (`verl_recipes.worker.verl_fixes`, which
reads this table); everything that judges a run or plans a job reads the table alone.

A run records the fixes it applied in its provenance.json, and `recorded_off` reads back the ones
it went without, turned off or not written yet. Going without a fix makes a run wrong evidence only
for what the fix changes, in code the run executes (`concerns`): a run from before
replay-buffer-poll still holds the recipe's device memory, and its rate prices nothing
(`verl_recipes.plan.runs`).

Standard library only: verl's workers read it before anything else is imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

#: what a committed run measures, each the evidence for one of the planner's questions: the device's
#: memory (NVML peaks: whether a job fits), the step rate (verl's perf/throughput: what it costs),
#: the host's memory (RSS and PSS) and the start-up before the first step
Evidence = Literal["device memory", "rate", "host memory", "start-up"]

#: everything a run measures: what a fix changes unless its row names less
EVERYTHING: frozenset[Evidence] = frozenset(get_args(Evidence))

#: comma-separated fix names to leave out (`verl-recipes train --verl-fix-off NAME`): how a run
#: measures verl's own path beside the fixed one
ENV_FIXES_OFF = "VERL_RECIPES_FIXES_OFF"


@dataclass(frozen=True)
class Fix:
    """One fix: a row of the table."""

    name: str  # as `--verl-fix-off` takes it and provenance.json records it
    number: int  # its place in recipes/7b-lora/README.md's list ("fix 5")
    module: str  # the verl module it patches, when verl imports it
    what: str  # the bug, in a line
    # what a run without it measures wrongly; where less than everything, a run that went without
    # it is still evidence for the rest
    changes: frozenset[Evidence] = EVERYTHING
    # scope: the one engine whose code it patches (verl's `strategy`; None: both), whether only a
    # model on verl's padding-free path (`use_remove_padding`) runs it, whether only a job with a critic
    engine: str | None = None
    padding_free_only: bool = False
    critic_only: bool = False
    # whether only a LoRA adapter synced by verl's layered summon under FSDP1 runs it
    layered_fsdp1_only: bool = False


ATTN_FIX = "critic-attn-implementation"
CRITIC_LORA_FIX = "critic-lora-token-cls"
MERGE_FIX = "lora-merge-out-of-place"
LOGPROBS_FIX = "logprobs-chunked"
CRITIC_BATCHING_FIX = "critic-engine-batching"
RAY_START_FIX = "ray-local-start"
PACKED_ATTN_FIX = "packed-attention"
REPLAY_POLL_FIX = "replay-buffer-poll"
MEGATRON_PIN_FIX = "megatron-weights-exact-pinned"
MEGATRON_OPT_PIN_FIX = "megatron-optimizer-exact-pinned"
LAYERED_SUMMON_FIX = "lora-layered-summon-fsdp1"

_FSDP_ENGINE = "verl.workers.engine.fsdp.transformer_impl"
_MEGATRON_ENGINE = "verl.workers.engine.megatron.transformer_impl"

#: every fix by name, in the README's order (the order a run's provenance lists them in)
FIXES: dict[str, Fix] = {
    f.name: f
    for f in (
        Fix(ATTN_FIX, 1, "verl.utils.model", "the critic loads with flash-attn whatever its config asks"),
        Fix(CRITIC_LORA_FIX, 2, _FSDP_ENGINE, "a LoRA critic is wrapped as a causal LM, which PEFT refuses"),
        Fix(MERGE_FIX, 4, _FSDP_ENGINE, "the merged LoRA sync copies every base weight to the CPU and back"),
        Fix(LOGPROBS_FIX, 5, "verl.utils.torch_functional", "log-probs are taken one token at a time"),
        Fix(
            CRITIC_BATCHING_FIX,
            6,
            "verl.workers.config.critic",
            "the critic's engine never gets the critic's batching keys",
            critic_only=True,  # verl builds the critic's config only where the job has a critic
        ),
        Fix(
            RAY_START_FIX,
            7,
            "verl.trainer.main_ppo",
            "the job's actors wait for Ray workers of their own, and Ray's dashboard runs",
            # the start-up and the processes the host holds (`predict.host.host_fit`), nothing in a step
            changes=frozenset({"start-up", "host memory"}),
        ),
        Fix(
            PACKED_ATTN_FIX,
            8,
            "verl.workers.config.model",
            "padding-free training attends across sequences without flash-attn",
            # a transformers attention, which only the FSDP engine's models call, registered under
            # the name only the padding-free path's configuration uses (`torch_varlen`)
            engine="fsdp",
            padding_free_only=True,
        ),
        Fix(
            REPLAY_POLL_FIX,
            9,
            "verl.trainer.ppo.v1.replay_buffer",
            "the trainer notices a step's last answer up to 2 s late",
            changes=frozenset({"rate"}),  # the step's time, no allocation
        ),
        # page-locked host copies of their own size: the host's memory; the GPU's tensors stay
        # verl's, and the copies' time is not measured yet, so a run without them prices no run with them
        Fix(
            MEGATRON_PIN_FIX,
            10,
            _MEGATRON_ENGINE,
            "offloaded Megatron weights take pinned blocks rounded up to a power of two",
            changes=frozenset({"host memory", "rate"}),
            engine="megatron",
        ),
        Fix(
            MEGATRON_OPT_PIN_FIX,
            11,
            _MEGATRON_ENGINE,
            "offloaded Megatron optimizer states take pinned blocks rounded up to a power of two",
            changes=frozenset({"host memory", "rate"}),
            engine="megatron",
        ),
        Fix(
            LAYERED_SUMMON_FIX,
            12,
            "verl.utils.fsdp_utils",
            "an adapter sync under FSDP1 copies the whole model to every rank's host memory",
            # the sync's host copy and its time; the device gathers one unit at a time either way
            changes=frozenset({"host memory", "rate"}),
            layered_fsdp1_only=True,
        ),
    )
}


@dataclass(frozen=True)
class RunKind:
    """What of verl's code a run executes, as far as the fixes reach: its engine, whether a model
    took the padding-free path, whether it trained a critic, whether it synced a LoRA adapter
    through verl's layered summon under FSDP1."""

    backend: str  # verl's engine: "fsdp" | "megatron"
    padding_free: bool
    critic: bool
    layered_fsdp1: bool = False


def executes(name: str, kind: RunKind) -> bool:
    """Whether fix NAME changes the code a run of `kind` executes."""
    fix = FIXES[name]
    return (
        fix.engine in (None, kind.backend)
        and (kind.padding_free or not fix.padding_free_only)
        and (kind.critic or not fix.critic_only)
        and (kind.layered_fsdp1 or not fix.layered_fsdp1_only)
    )


def concerns(name: str, what: Evidence, kind: RunKind) -> bool:
    """Whether going without fix NAME makes a run of `kind` wrong evidence for `what`: only if the
    fix changes the code the run executes (`executes`) and that change reaches `what`."""
    return executes(name, kind) and what in FIXES[name].changes


def concerning(off: Iterable[str], what: Evidence, kind: RunKind) -> tuple[str, ...]:
    """The fixes of `off` (a run's `recorded_off`) that make a run of `kind` wrong evidence for `what`."""
    return tuple(f for f in off if concerns(f, what, kind))


class Recorded(Protocol):
    """What a run's record says of the fixes (`rundir.Provenance`): those it applied and those it
    turned off, each None where the record predates the key."""

    @property
    def verl_fixes(self) -> Sequence[str] | None: ...

    @property
    def verl_fixes_off(self) -> Sequence[str] | None: ...


#: the fixes written after the records that list no `verl_fixes` (7b-lora's first runs): each of
#: those runs predates logprobs-chunked (its commit is older than the fix's) and every fix after it
LISTED_FROM = tuple(FIXES)[tuple(FIXES).index(LOGPROBS_FIX) :]


def recorded_off(prov: Recorded) -> tuple[str, ...]:
    """The fixes a recorded run ran without, in `FIXES` order after those it names off. A record
    without `verl_fixes_off` predates the out-of-place merge, so it ran verl's merged sync; one
    without `verl_fixes` predates the fixes of `LISTED_FROM`; one that lists the fixes it applied
    ran without every fix it does not name, turned off or not written yet."""
    off = list(prov.verl_fixes_off) if prov.verl_fixes_off is not None else [MERGE_FIX]
    applied = prov.verl_fixes
    missing = LISTED_FROM if applied is None else tuple(f for f in FIXES if f not in applied)
    off += [f for f in missing if f not in off]
    return tuple(off)


def recorded_on(prov: Recorded, name: str) -> bool:
    """Whether a recorded run ran with fix NAME. Only a record that lists the fixes applied
    (`verl_fixes`) can say so: a fix it does not list was off or did not exist yet."""
    return prov.verl_fixes is not None and name in prov.verl_fixes and name not in (prov.verl_fixes_off or ())
