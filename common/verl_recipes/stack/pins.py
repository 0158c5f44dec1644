"""Read the project's single source of version pins, `images/versions.toml`.

Every consumer (verify, the wheelhouse, Dockerfile checks) goes through `load_pins()` so that a
pin changes in one place only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from verl_recipes.paths import versions_file


def load_pins(path: Path | None = None) -> dict[str, Any]:
    """Return the whole versions.toml as nested dicts."""
    with open(path or versions_file(), "rb") as f:
        return tomllib.load(f)


def gpu_pins(path: Path | None = None) -> dict[str, str]:
    """The GPU stack pins: package name -> exact version."""
    return {k: str(v) for k, v in load_pins(path)["gpu"].items()}
