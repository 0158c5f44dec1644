"""Where the repository's parts are, and where made things are cached.

The recipes, images and validation folders live in the repository, not in the installed
package, because users copy and edit them. `VERL_RECIPES_ROOT` points at a checkout; without
it we look upwards from the working directory and then from this file (an editable install).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from verl_recipes import PACKAGE_DIR, RecipeError


def _is_root(p: Path) -> bool:
    return (p / "recipes").is_dir() and (p / "images" / "versions.toml").is_file()


def repo_root() -> Path:
    """Return the checkout root, or raise a RecipeError that says how to point at one."""
    env = os.environ.get("VERL_RECIPES_ROOT")
    if env:
        p = Path(env).resolve()
        if not _is_root(p):
            raise RecipeError(
                f"VERL_RECIPES_ROOT={env} has no recipes/ and images/versions.toml; point it at a checkout"
            )
        return p
    for start in (Path.cwd().resolve(), PACKAGE_DIR):
        for p in (start, *start.parents):
            if _is_root(p):
                return p
    raise RecipeError("no verl-recipes checkout found: run inside one or set VERL_RECIPES_ROOT=/path/to/checkout")


def cache_dir() -> Path:
    """Where made things are kept between runs (synthetic models, the dataset, wheels):
    VERL_RECIPES_CACHE, else ~/.cache/verl-recipes."""
    return Path(os.environ.get("VERL_RECIPES_CACHE", Path.home() / ".cache" / "verl-recipes"))


def recipes_dir() -> Path:
    return repo_root() / "recipes"


def versions_file() -> Path:
    return repo_root() / "images" / "versions.toml"


#: the caches of the libraries a run loads (Hugging Face's hub, datasets and transformers under
#: HF_HOME; vLLM's compiled graphs; Triton's kernels), each by its own variable and default
LIBRARY_CACHES: dict[str, str] = {
    "HF_HOME": "huggingface",
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
}


def _writable(path: Path) -> bool:
    """Whether `path` can be written: its nearest existing folder takes new files (os.access says
    no on a read-only filesystem, as on a folder without permission)."""
    for p in (path, *path.parents):
        if p.exists():
            return p.is_dir() and os.access(p, os.W_OK | os.X_OK)
    return False


def library_caches(env: dict[str, str] | os._Environ[str]) -> tuple[dict[str, str], str | None]:
    """Where the libraries' caches go when their defaults under the home cannot be written (a
    read-only home): the variables to set and the one line that says so; ({}, None) when the
    defaults are writable or the user set each variable.

    Hugging Face datasets takes a lock file in its cache even to read a parquet file verl's
    RLHFDataset loads, so a read-only home otherwise fails deep in verl with a traceback. The
    place is VERL_RECIPES_CACHE when that is writable, else a folder of this user's in the
    system's temporary folder."""
    home = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")
    unset = {var: home / sub for var, sub in LIBRARY_CACHES.items() if not env.get(var)}
    stuck = {var: d for var, d in unset.items() if not _writable(d)}
    if not stuck:
        return {}, None
    ours = env.get("VERL_RECIPES_CACHE")
    base = Path(ours) if ours and _writable(Path(ours)) else Path(tempfile.gettempdir()) / f"verl-recipes-{os.getuid()}"
    out = {var: str(base / LIBRARY_CACHES[var]) for var in stuck}
    first = next(iter(stuck.values()))
    line = (
        f"note: {first.parent} cannot be written (a read-only or foreign home); the library caches go to "
        f"{base} ({', '.join(f'{k}={v}' for k, v in out.items())}); set them yourself to choose another place"
    )
    return out, line
