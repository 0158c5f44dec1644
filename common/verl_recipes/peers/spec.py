"""What `peers run` hands a peer's launcher, and what the launcher leaves about its environment.

The runner (our environment) composes the peer's command line and writes peer.json into the run
folder; the launcher (the peer's environment, `python3 -m verl_recipes.peers.run_<peer> RUN_DIR`)
reads it, writes environment.json (every distribution the peer's interpreter sees, with its
version and where it comes from: the peer's wheelhouse or the host) and runs the peer. Standard
library only: both sides read these files.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError, inflight
from verl_recipes.peers import data

SPEC = "peer.json"
ENVIRONMENT = "environment.json"
#: the distributions a peer run's provenance lists first (the rest are in environment.json)
KEY_PACKAGES = ("trl", "openrlhf", "vllm", "torch", "transformers", "peft", "accelerate", "deepspeed", "ray")


@dataclass(frozen=True)
class Spec:
    peer: str  # trl, openrlhf
    row: str  # docs, tuned, full
    batch: str  # the workload's batch
    argv: list[str]  # the peer's own command line
    model: str  # the checkpoint
    parquet: str  # the embedded dataset's train.parquet
    data_dir: str  # where the launcher writes the peer's prompts
    gpus: int

    def write(self, run_dir: Path) -> Path:
        path = run_dir / SPEC
        inflight.write_text(path, json.dumps(asdict(self), indent=1) + "\n", "the peer's spec")
        return path


def read_spec(run_dir: Path) -> Spec:
    path = run_dir / SPEC
    try:
        raw = json.loads(path.read_text())
        return Spec(**raw)
    except (OSError, ValueError, TypeError) as e:
        raise RecipeError(f"{path}: not a peer spec ({e}); run `verl-recipes peers run`, which writes it") from None


def environment() -> dict[str, Any]:
    """This interpreter's distributions: name -> version and the folder it is installed in."""
    dists: dict[str, dict[str, str]] = {}
    for d in metadata.distributions():
        name = d.metadata["Name"]
        if name and name.lower() not in dists:  # the first on sys.path wins, as imports do
            where = getattr(d, "_path", None)
            dists[name.lower()] = {"version": d.version, "from": str(Path(str(where)).parent) if where else ""}
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "sys_path": [p for p in sys.path if p],
        "packages": {k: (dists[k]["version"] if k in dists else None) for k in KEY_PACKAGES},
        "distributions": dict(sorted(dists.items())),
    }


def write_environment(run_dir: Path) -> Path:
    path = run_dir / ENVIRONMENT
    inflight.write_text(path, json.dumps(environment(), indent=1) + "\n", "the peer's environment")
    return path


def prepare(argv: list[str] | None, module: str) -> Spec | None:
    """What both peers' entry points do first, in the peer's own environment: read the run folder
    (the one argument) that `peers run` wrote, record that environment beside it, and write the
    workload's rows in the peer's own data format. None, after one line on stderr, where the call
    or the folder is wrong: the entry point exits 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python3 -m {module} RUN_DIR", file=sys.stderr)
        return None
    run_dir = Path(args[0])
    try:
        spec = read_spec(run_dir)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    write_environment(run_dir)
    data.write(data.render(data.rows(Path(spec.parquet)), Path(spec.model)), Path(spec.data_dir))
    return spec
