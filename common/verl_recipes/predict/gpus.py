"""The GPU catalogue (`verl_recipes/predict/gpus.yaml`) and `--gpu` parsing.

A plan is judged against the memory CUDA can hand out (`visible_bytes`), not the number on the
box: vLLM sizes its budget as `gpu_memory_utilization x` that total, and an ECC-enabled GDDR6
card loses 1/16 of its DRAM to check bits. `--gpu 24GiB` plans for an arbitrary cap (the
launcher's per-process cap on a bigger card), taken as exactly that many bytes visible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import GIB, RecipeError

CATALOGUE = Path(__file__).resolve().parent / "gpus.yaml"


@dataclass(frozen=True)
class GPU:
    id: str
    name: str
    memory_bytes: int
    visible_bytes: int
    source: str = ""
    nvml_names: tuple[str, ...] = ()  # what NVML calls this card: a run is matched to it by these
    bandwidth: float | None = None  # peak memory bytes/s (the vendor's page): the decode roofline
    bf16_flops: float | None = None  # peak dense bf16 FLOP/s: the step-time prediction

    def runs_as(self, nvml_name: str | None) -> bool:
        """Whether a run on the device NVML named `nvml_name` ran on this card."""
        return bool(nvml_name) and nvml_name in self.nvml_names

    @property
    def visible_gib(self) -> float:
        return self.visible_bytes / GIB


@lru_cache(maxsize=1)
def catalogue() -> dict[str, GPU]:
    raw: dict[str, Any] = yaml.safe_load(CATALOGUE.read_text())
    out: dict[str, GPU] = {}
    for gid, e in raw.items():
        mem = int(e["memory_bytes"])
        visible = int(e.get("visible_bytes") or mem * (1.0 - float(e.get("ecc_fraction", 0.0))))
        out[gid] = GPU(
            id=gid,
            name=str(e["name"]),
            memory_bytes=mem,
            visible_bytes=visible,
            source=e["source"],
            nvml_names=tuple(str(n) for n in e.get("nvml_names") or ()),
            bandwidth=float(e["memory_bandwidth_bytes_per_s"]) if "memory_bandwidth_bytes_per_s" in e else None,
            bf16_flops=float(e["bf16_dense_flops"]) if "bf16_dense_flops" in e else None,
        )
    return out


def catalogued(nvml_name: str | None) -> GPU | None:
    """The catalogue's entry for a device as NVML names it (a run's provenance), or None."""
    return next((g for g in catalogue().values() if g.runs_as(nvml_name)), None)


_CAP = re.compile(r"^(\d+(?:\.\d+)?)\s*(GiB|GB)$", re.IGNORECASE)


def parse_gpu(spec: str) -> GPU:
    """A catalogue id (`a10g-24g`, or a prefix naming one: `a10g`) or a cap such as `24GiB`
    (binary) / `24GB` (decimal)."""
    cat = catalogue()
    if spec in cat:
        return cat[spec]
    prefixed = [g for gid, g in cat.items() if gid.startswith(f"{spec}-")]
    if len(prefixed) == 1:
        return prefixed[0]
    m = _CAP.match(spec.strip())
    if m:
        n = float(m.group(1))
        unit = m.group(2).lower()
        b = int(n * (GIB if unit == "gib" else 1e9))
        if b <= 0:
            raise RecipeError(f"--gpu {spec}: the memory must be positive")
        return GPU(id=spec, name=f"{spec} cap", memory_bytes=b, visible_bytes=b)
    raise RecipeError(f"--gpu {spec}: not a catalogue GPU ({', '.join(cat)}) or a size like 24GiB")


@dataclass(frozen=True)
class Budget:
    """The GPU a job is judged against (`parse_gpu`: a catalogue id or a size like
    "139.80GiB") and how the refusal names it ("this GPU", "the --cap-gib budget")."""

    gpu: str
    label: str


def gpu_family_of(spec: str) -> str:
    """The family (`a10g`, `h200`) a run judged against `spec` is named for: a catalogued id's, or,
    for a size, the smallest catalogued card of at least that much memory (the largest when none
    is that large)."""
    cards, gpu = catalogue(), parse_gpu(spec)
    if gpu.id in cards:
        return gpu.id.split("-")[0]
    fits = sorted((g for g in cards.values() if g.memory_bytes >= gpu.memory_bytes), key=lambda g: g.memory_bytes)
    card = fits[0] if fits else max(cards.values(), key=lambda g: g.memory_bytes)
    return card.id.split("-")[0]
