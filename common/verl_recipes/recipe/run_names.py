"""How run folders and bounds files are named: the rule of recipes/README.md, as code.

    <gpu>x<n>-<algo>[-<variant>...][-l<L>][-cap<G>][-rank<R>of<N>][-<label>...][-<k>]

`gpu` is the GPU family (h200, h100, a100), `n` the GPUs the run used, `algo` ppo or grpo (verl's
adv_estimator: gae is PPO), then the recipe's variants in the order they compose (the variant
named like the algorithm is not repeated), `l<L>` a model truncated to L layers (`train
--layers`), `cap<G>` a `--cap-gib G` budget, `rank<R>of<N>` a rank rehearsal; labels are lowercase
words for what else sets the run apart (a fix turned off, a --set, a start mode, `partial`, and
`deepspeed` for a run of another training loop than verl's: `backend_label`); `k`
(2, 3, ...) is a repeat of one configuration. A bounds file (`expected/<name>.yaml`) is named by
the configuration its runs share: the same rule without the repeat. A rehearsed rank keeps its
`rank<R>of<N>`: one GPU standing in for rank 0 of 2 is another configuration than the same job on
one GPU, and its figures are a rank's, never the whole job's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import yaml

from verl_recipes import RecipeError
from verl_recipes.layout import RankSpec
from verl_recipes.recipe.metadata import Recipe

RULE = "<gpu>x<n>-<algo>[-<variant>...][-l<L>][-cap<G>][-rank<R>of<N>][-<label>...][-<k>]"
ALGOS = ("ppo", "grpo")
_HEAD = re.compile(r"([a-z]+[0-9]+)x([1-9][0-9]*)-(ppo|grpo)(?=-|$)")
_LAYERS = re.compile(r"-l([1-9][0-9]*)(?=-|$)")
_CAP = re.compile(r"-cap([0-9]+(?:\.[0-9]+)?)(?=-|$)")
_RANK = re.compile(r"-rank([0-9]+)of([1-9][0-9]*)(?=-|$)")
_LABEL = re.compile(r"-([a-z0-9.]*[a-z][a-z0-9.]*)(?=-|$)")
_REPEAT = re.compile(r"-([2-9]|[1-9][0-9]+)$")


@dataclass(frozen=True)
class RunName:
    gpu: str  # the GPU family: h200, h100, a100
    n: int  # GPUs the run used
    algo: str  # ppo or grpo
    variants: tuple[str, ...]  # the recipe's variants, in compose order, less the one named `algo`
    layers: int | None  # `train --layers`
    cap_gib: float | None  # `train --cap-gib`
    rank: RankSpec | None  # the rank of a rank rehearsal
    labels: tuple[str, ...]
    repeat: int | None  # 2, 3, ...: another run of the same configuration

    @property
    def text(self) -> str:
        """The name by the rule (`RULE`), which `parse_run_name` reads back: the one spelling of a
        run's name for `train`'s run folder, a campaign line, results/ and expected/."""
        parts = [f"{self.gpu}x{self.n}-{self.algo}", *self.variants]
        parts += [f"l{self.layers}"] if self.layers is not None else []
        parts += [f"cap{self.cap_gib:g}"] if self.cap_gib is not None else []
        parts += [f"rank{self.rank.rank}of{self.rank.world}"] if self.rank is not None else []
        parts += [*self.labels, *([str(self.repeat)] if self.repeat is not None else [])]
        return "-".join(parts)

    @property
    def configuration(self) -> RunName:
        """The name less its repeat: what a bounds file is named by, and what two runs of one
        configuration share."""
        return replace(self, repeat=None)


def algorithm(recipe: Recipe, variants: Sequence[str], sets: Iterable[str] = ()) -> str:
    """The algorithm the job runs, as the name says it: verl's `algorithm.adv_estimator` after the
    recipe's layers and `--set` (`gae` is PPO; verl's default is `gae`), read from the layers'
    YAML without composing verl's config (the name is decided before the pre-flight composes)."""
    estimator = "gae"
    for path in recipe.config_files(list(variants)):
        doc = yaml.safe_load(path.read_text()) or {}
        value = (doc.get("algorithm") or {}).get("adv_estimator") if isinstance(doc, dict) else None
        estimator = str(value) if value else estimator
    for line in sets:
        key, _, value = line.partition("=")
        if key.strip() == "algorithm.adv_estimator":  # a Hydra value: "grpo" and grpo are one
            estimator = str(yaml.safe_load(value) or estimator).strip()
    return "ppo" if estimator == "gae" else estimator


def check_label(label: str) -> str:
    """A label as the rule wants it (lowercase letters, digits and dots, one letter at least, not
    a part of the rule's own), or a RecipeError that says so."""
    if not _LABEL.fullmatch(f"-{label}") or re.fullmatch(r"l[0-9]+|cap[0-9.]+|rank[0-9]+of[0-9]+|[0-9]+", label):
        raise RecipeError(f"--label {label!r}: a label is one lowercase word (a-z, 0-9, '.'); the rule: {RULE}")
    return label


def backend_label(backend: str | None) -> str | None:
    """The label a run of another training loop than verl's carries, from its provenance.json
    `backend` (`deepspeed`: recipe verl-vs-deepspeed's ZeRO-3 loop); None for a verl run. Without
    it the DeepSpeed side of a comparison and verl's side of the same rank would share one name."""
    if not backend:
        return None
    if not _LABEL.fullmatch(f"-{backend}"):
        raise RecipeError(f"backend {backend!r} is not a lowercase label; the rule: {RULE}")
    return backend


def gpu_family(nvml_name: str) -> str:
    """NVML's name -> the family a name starts with: 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    m = re.search(r"\b([A-Z]+[0-9]+)", nvml_name.replace("NVIDIA", ""))
    return m.group(1).lower() if m else ""


def parse_run_name(name: str, variants: Iterable[str], *, bounds: bool = False) -> RunName:
    """A run folder's name (or, with `bounds`, a bounds file's name without .yaml) as its parts;
    a RecipeError says where it leaves the rule."""
    what = "bounds file" if bounds else "run folder"
    m = _HEAD.match(name)
    if not m:
        raise RecipeError(f"{what} {name!r}: must start <gpu>x<n>-<algo> (e.g. h200x1-ppo); the rule: {RULE}")
    pos = m.end()
    names = sorted((v for v in variants if v not in ALGOS), key=len, reverse=True)
    found: list[str] = []
    while True:
        v = next(
            (
                v
                for v in names
                if name.startswith(f"-{v}", pos) and name[pos + len(v) + 1 : pos + len(v) + 2] in ("", "-")
            ),
            None,
        )
        if v is None:
            break
        found.append(v)
        pos += len(v) + 1
    parts: dict[str, re.Match[str]] = {}
    for key, pattern in (("layers", _LAYERS), ("cap", _CAP), ("rank", _RANK)):
        hit = pattern.match(name, pos)
        if hit:
            parts[key] = hit
            pos = hit.end()
    repeat = None if bounds else _REPEAT.search(name, pos)
    end = repeat.start() if repeat else len(name)
    labels: list[str] = []
    while pos < end:
        hit = _LABEL.match(name, pos, end)
        if not hit:
            raise RecipeError(f"{what} {name!r}: {name[pos:end]!r} is not a lowercase label; the rule: {RULE}")
        label = hit.group(1)
        if label in names or re.fullmatch(r"l[0-9]+|cap[0-9.]+|rank[0-9]+of[0-9]+", label):
            raise RecipeError(f"{what} {name!r}: {label!r} is out of order; the rule: {RULE}")
        labels.append(label)
        pos = hit.end()
    layers, cap, rank = parts.get("layers"), parts.get("cap"), parts.get("rank")
    return RunName(
        gpu=m.group(1),
        n=int(m.group(2)),
        algo=m.group(3),
        variants=tuple(found),
        layers=int(layers.group(1)) if layers else None,
        cap_gib=float(cap.group(1)) if cap else None,
        rank=RankSpec(int(rank.group(1)), int(rank.group(2))) if rank else None,
        labels=tuple(labels),
        repeat=int(repeat.group(1)) if repeat else None,
    )


def parse_bounds_name(filename: str, variants: Iterable[str]) -> RunName:
    """A bounds file's name (`<configuration>.yaml`) as its parts."""
    if not filename.endswith(".yaml"):
        raise RecipeError(f"bounds file {filename!r}: must end .yaml")
    return parse_run_name(filename.removesuffix(".yaml"), variants, bounds=True)
