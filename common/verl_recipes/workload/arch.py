"""Model architectures: the bundled config.json files and the one resolver of an `--arch` value.

Memory and throughput depend on an architecture's shapes, not its weights, so a recipe names a
bundled architecture (`workload/archs/<name>/config.json`) and every run measures on a synthetic
checkpoint of it. `--arch` (train, synth-model, plan) also takes a config.json, or a folder that
holds one (a real checkpoint). Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError

ARCHS_DIR = Path(__file__).resolve().parent / "archs"


def bundled_archs() -> list[str]:
    """The names of the bundled architectures."""
    return sorted(p.name for p in ARCHS_DIR.iterdir() if (p / "config.json").is_file())


def arch_config_path(arch: str | Path) -> Path:
    """A bundled name, a folder holding a config.json, or a config.json -> that config.json."""
    bundled = ARCHS_DIR / str(arch) / "config.json"
    if bundled.is_file():
        return bundled
    path = Path(arch)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise RecipeError(f"--arch {arch}: not a bundled arch ({', '.join(bundled_archs())}) nor a config.json path")
    return path


def resolve_arch(arch: str | Path) -> dict[str, Any]:
    """The config dict of `arch` (see arch_config_path), checked to be an HF model config."""
    path = arch_config_path(arch)
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RecipeError(f"--arch {path}: not valid JSON ({e}); pass an HF config.json") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise RecipeError(f"--arch {path}: no model_type; pass an HF config.json")
    return cfg
