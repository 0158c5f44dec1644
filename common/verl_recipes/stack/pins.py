"""Read the project's single source of version pins, `images/versions.toml`.

Every consumer (verify, the wheelhouse, Dockerfile checks) goes through `load_pins()` so that a
pin changes in one place only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from verl_recipes import RecipeError
from verl_recipes.paths import versions_file

# Build argument -> (versions.toml table, key). Every `ARG *_VERSION` of a Dockerfile must be here.
VERSION_ARGS: dict[str, tuple[str, str]] = {
    "VERL_VERSION": ("gpu", "verl"),
    "VLLM_VERSION": ("gpu", "vllm"),
    "TORCH_VERSION": ("gpu", "torch"),
    "CUDA_VERSION": ("gpu", "cuda"),
    "RAY_VERSION": ("gpu", "ray"),
    "TRANSFORMERS_VERSION": ("gpu", "transformers"),
    "DEEPSPEED_VERSION": ("gpu", "deepspeed"),
    "PYTHON_VERSION": ("python", "gpu"),
}


def pin_of_arg(pins: Mapping[str, Any], arg: str) -> str:
    """The version a build argument must carry (VERSION_ARGS names where it is pinned)."""
    table, key = VERSION_ARGS[arg]
    return str(pins[table][key])


def load_pins(path: Path | None = None) -> dict[str, Any]:
    """Return the whole versions.toml as nested dicts."""
    path = path or versions_file()
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise RecipeError(f"{path}: cannot read it ({e.strerror}); give the checkout's images/versions.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{path}: not valid TOML: {e}") from None


def gpu_pins(path: Path | None = None) -> dict[str, str]:
    """The GPU stack pins: package name -> exact version."""
    return {k: str(v) for k, v in load_pins(path)["gpu"].items()}
