"""GPU-hours and dollars from a throughput and `validation/prices.yaml`.

    gpu_hours_per_million_tokens = gpus x (1e6 / tokens_per_s) / 3600
    usd_per_million_tokens       = gpu_hours_per_million_tokens x usd_per_gpu_hour
    step_seconds                 = tokens_per_step / tokens_per_s
    usd_per_step                 = gpus x step_seconds / 3600 x usd_per_gpu_hour

`tokens_per_s` is the whole job's rate (prompt + response tokens of the batch per wall-clock
second, all GPUs together), not verl's per-GPU `perf/throughput`; `from_verl_throughput` converts.
Prices are on-demand list prices, each with its source and date in the YAML; the estimate uses
the cheapest listed offer unless a provider is named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verl_recipes import RecipeError
from verl_recipes.paths import repo_root


@dataclass(frozen=True)
class Offer:
    gpu: str
    provider: str
    product: str
    usd_per_gpu_hour: float
    date: str
    source: str


@dataclass(frozen=True)
class Cost:
    offer: Offer
    gpus: int
    tokens_per_s: float
    gpu_hours_per_million_tokens: float
    usd_per_million_tokens: float
    step_seconds: float | None = None
    usd_per_step: float | None = None


def prices_file(root: Path | None = None) -> Path:

    return (root or repo_root()) / "validation" / "prices.yaml"


def load_prices(path: Path) -> dict[str, list[Offer]]:
    """GPU id -> its offers; every offer must carry a price, a date and a source URL."""
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RecipeError(f"{path}: cannot read prices: {e}") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: expected a mapping of GPU id to a list of offers")
    out: dict[str, list[Offer]] = {}
    for gpu, offers in raw.items():
        lst: list[Offer] = []
        for i, o in enumerate(offers or []):
            for k in ("provider", "usd_per_gpu_hour", "date", "source"):
                if not o.get(k):
                    raise RecipeError(f"{path}: {gpu}[{i}]: missing {k}; every price needs a date and a source")
            price = float(o["usd_per_gpu_hour"])
            if price <= 0:
                raise RecipeError(f"{path}: {gpu}[{i}]: usd_per_gpu_hour must be positive")
            src = str(o["source"])
            if not src.startswith("https://"):
                raise RecipeError(f"{path}: {gpu}[{i}]: source must be an https:// URL")
            lst.append(Offer(gpu, str(o["provider"]), str(o.get("product", "")), price, str(o["date"]), src))
        out[str(gpu)] = lst
    return out


def pick_offer(offers: dict[str, list[Offer]], gpu: str, provider: str | None = None) -> Offer | None:
    """The cheapest offer for a GPU (or the named provider's); None when no price is listed."""
    cands = [o for o in offers.get(gpu, []) if provider is None or o.provider.lower() == provider.lower()]
    return min(cands, key=lambda o: o.usd_per_gpu_hour) if cands else None


def from_verl_throughput(per_gpu_tokens_per_s: float, gpus: int) -> float:
    """verl's `perf/throughput` is tokens per second per GPU; the job's rate is that x GPUs."""
    return per_gpu_tokens_per_s * gpus


def compute_cost(offer: Offer, gpus: int, tokens_per_s: float, tokens_per_step: int | None = None) -> Cost:
    if tokens_per_s <= 0:
        raise RecipeError(f"--tokens-per-s {tokens_per_s}: must be positive")
    if gpus <= 0:
        raise RecipeError("the number of GPUs must be positive")
    gh = gpus * (1e6 / tokens_per_s) / 3600.0
    step_s = usd_step = None
    if tokens_per_step:
        step_s = tokens_per_step / tokens_per_s
        usd_step = gpus * step_s / 3600.0 * offer.usd_per_gpu_hour
    return Cost(offer, gpus, tokens_per_s, gh, gh * offer.usd_per_gpu_hour, step_s, usd_step)
