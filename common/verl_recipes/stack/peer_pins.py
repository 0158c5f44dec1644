"""A peer's pins: what another RL trainer needs, as its own package metadata resolves it.

The peers (TRL, OpenRLHF) are compared with the recipes on the same GPU host, each in its own
environment built from its own pins, not from ours: `images/peers/<name>.toml` names what a user
would `pip install`, which of the host's packages are fixed there (torch, whose CUDA libraries
come with it) and, where a pin of the peer's cannot be met on the host, the override used instead,
what it replaces and why. `verl-recipes wheelhouse --peer FILE` resolves it into
`images/peers/<name>-py<XY>.txt` and carries what the host lacks, as it does our stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from verl_recipes import RecipeError
from verl_recipes.stack.lock import Target, canonical
from verl_recipes.stack.pins import load_pins

_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class Override:
    """A requirement that stands in for one of the peer's own (uv's `--override`)."""

    requirement: str  # e.g. `vllm==0.26.0`, or `flash-attn; sys_platform == "never"` to drop one
    replaces: str  # the peer's own pin it stands in for
    reason: str


@dataclass(frozen=True)
class PeerPins:
    name: str  # trl, openrlhf: the run-name label and the lock's name
    version: str
    requires: tuple[str, ...]
    fixed: tuple[str, ...]  # host packages whose installed version is a constraint
    overrides: tuple[Override, ...]
    path: Path

    def requirements(self, have: dict[str, str]) -> list[str]:
        """The peer's requirements and the host's fixed versions, as uv reads them."""
        missing = [n for n in self.fixed if canonical(n) not in have]
        if missing:
            raise RecipeError(
                f"{self.path}: fixed {', '.join(missing)} is not in the target's pip freeze (--have); "
                "give the freeze of the host the peer runs on"
            )
        return [*self.requires, *(f"{n}=={have[canonical(n)]}" for n in self.fixed)]

    def override_lines(self) -> list[str]:
        return [o.requirement for o in self.overrides]

    def default_lock(self, target: Target) -> Path:
        """Beside the pins file: the peer's lock follows its own pins, not images/versions.toml."""
        return self.path.parent / f"{self.name}-py{target.py_nodot}.txt"


def load_peer_pins(path: Path) -> PeerPins:
    """Read and check `images/peers/<name>.toml`; every override says what it replaces and why."""
    raw = load_pins(path)
    peer = raw.get("peer")
    if not isinstance(peer, dict):
        raise RecipeError(f"{path}: no [peer] table; a peer pins file names the peer (images/peers/trl.toml)")
    name, version = str(peer.get("name", "")), str(peer.get("version", ""))
    if not _NAME.match(name):
        raise RecipeError(f"{path}: [peer] name {name!r} must be a lowercase label (trl, openrlhf)")
    requires = peer.get("requires")
    if not version or not isinstance(requires, list) or not requires:
        raise RecipeError(f"{path}: [peer] needs version and requires (what a user would pip install)")
    overrides = []
    for rule in raw.get("override", []):
        if not all(rule.get(k) for k in ("requirement", "replaces", "reason")):
            raise RecipeError(f"{path}: every [[override]] needs requirement, replaces and reason; fix {rule}")
        overrides.append(Override(str(rule["requirement"]), str(rule["replaces"]), str(rule["reason"])))
    unknown = sorted(set(raw) - {"peer", "override"})
    if unknown:
        raise RecipeError(f"{path}: unknown table(s) {', '.join(unknown)}; a peer pins file has [peer], [[override]]")
    return PeerPins(
        name=name,
        version=version,
        requires=tuple(str(r) for r in requires),
        fixed=tuple(str(f) for f in peer.get("fixed", [])),
        overrides=tuple(overrides),
        path=path,
    )
