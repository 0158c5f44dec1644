"""What stands behind a multi-GPU prediction: a full run, a rank rehearsal, or nothing yet.

A recipe written for N GPUs can be measured three ways here: the whole job on its N GPUs (a full
run), one GPU standing in for one of its ranks (`train --rank R`: PyTorch's fake process group,
the rank's real allocations, no NCCL buffers or communication), or not at all. `plan` and the
generated tables name which one stands behind every multi-GPU row, from the committed bounds
files (`expected/*.yaml`, which carry `rank_rehearsal` when their runs were rehearsals), so a
reader never takes a prediction or a rehearsed rank for a measured job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError
from verl_recipes.layout import RankSpec
from verl_recipes.rundir import read_provenance


def sets_words(sets: Sequence[str]) -> str:
    """How a run's `--set` overrides are named wherever its figures stand: ", --set K=V" each."""
    return "".join(f", --set {x}" for x in sets)


@dataclass(frozen=True)
class Evidence:
    path: Path  # the bounds file
    world: int  # the job's GPUs the runs stood for
    rank: int | None  # the rehearsed rank; None: a full run of `world` GPUs
    cap_gib: float | None  # the --cap-gib budget the runs ran under
    sets: tuple[str, ...] = ()  # the --set overrides the runs ran with (another workload, say)
    layers: int | None = None  # `train --layers N`: the model cut to N layers; None: full depth

    @property
    def words(self) -> str:
        cap = f" at {self.layers} layers" if self.layers else ""
        cap += f" at a {self.cap_gib:g} GiB budget" if self.cap_gib else ""
        cap += sets_words(self.sets)
        what = f"rank rehearsal ({self.rank} of {self.world})" if self.rank is not None else "full run"
        return f"{what}{cap}: {self.path.parent.name}/{self.path.name}"


def behind(recipe: Any, variants: Sequence[str], world: int) -> list[Evidence]:
    """The committed bounds files of `recipe` measured for exactly these variants at `world` GPUs."""

    out = []
    for name in getattr(recipe, "expected", []):
        path = recipe.dir / name
        try:
            # libyaml's parser where PyYAML has it, the same safe loader: ~60 ms a call in Python
            doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (OSError, yaml.YAMLError) as e:
            raise RecipeError(f"{path}: not readable YAML: {e}") from None
        if not isinstance(doc, dict) or doc.get("status") == "predicted" or "measured" not in doc:
            continue
        provs = [p for p in (doc.get("provenance") or {}).values() if isinstance(p, dict)]
        if not provs or sorted(provs[0].get("variants") or []) != sorted(variants):
            continue
        if provs[0].get("backend"):  # another training loop (DeepSpeed) stands behind none of verl's jobs
            continue
        rank = RankSpec.from_record(doc.get("rank_rehearsal"))
        if rank:
            job, r = rank.world, rank.rank
        else:  # a full run used the GPUs it measured
            job = len(
                {g for m in doc["measured"].values() for per in (m.get("memory_gib") or {}).values() for g in per}
            )
            r = None
        if job == world:
            cap = provs[0].get("cap_gib")
            sets = tuple(str(x) for x in provs[0].get("sets") or [])
            runs = doc.get("source_runs") or []
            depth = read_provenance(recipe.dir / runs[0]).argv_value("--layers") if runs else None
            layers = int(depth) if depth else None
            out.append(Evidence(path, job, r, float(cap) if cap else None, sets, layers))
    return out


def behind_line(recipe: Any, variants: Sequence[str], world: int) -> str:
    """One line for `plan`: what stands behind the figures of a job of `world` GPUs."""
    found = behind(recipe, variants, world)
    if found:
        return "behind it: " + "; ".join(e.words for e in found)
    return f"behind it: no run of these {world} GPUs yet, neither full nor rehearsed: a prediction only"
