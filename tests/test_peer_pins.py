"""A peer's pins (images/peers/*.toml) and the lock `wheelhouse --peer` resolves from them.

The committed locks are read as they are: each holds its peer at its version, the host's torch,
and every override in place of the pin it replaces. One test goes to PyPI (skipped without it):
uv's override beats a package's own pin and a never-true marker drops a dependency, which is
what the OpenRLHF pins file relies on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_recipes import RecipeError
from verl_recipes.paths import repo_root
from verl_recipes.stack.lock import Target, compile_lock, parse_freeze, parse_lock
from verl_recipes.stack.peer_pins import load_peer_pins

ROOT = repo_root()
PEERS = ROOT / "images" / "peers"
HOST = ROOT / "gpu" / "hosts" / "2026-11-29-h200x1" / "pip-freeze.txt"
TARGET = Target("3.12", "manylinux_2_39_x86_64")


@pytest.mark.parametrize("name", ["trl", "openrlhf"])
def test_each_peer_lock_holds_its_peer_the_hosts_torch_and_its_overrides(name: str) -> None:
    pins = load_peer_pins(PEERS / f"{name}.toml")
    lock_file = pins.default_lock(TARGET)
    assert lock_file == PEERS / f"{name}-py312.txt"
    lock = parse_lock(lock_file)
    assert lock[name].version == pins.version
    have = parse_freeze(HOST)
    assert lock["torch"].version == have["torch"] == "2.11.0"
    assert f"torch=={have['torch']}" in pins.requirements(have)
    for o in pins.overrides:
        dist = o.replaces.split("==")[0]
        if "never" in o.requirement:
            assert dist not in lock, f"{dist} is dropped by its override"
        else:
            assert lock[dist].version == o.requirement.split("==")[1] != o.replaces.split("==")[1]
    assert f"images/peers/{name}.toml" in lock_file.read_text().splitlines()[0]


def test_openrlhf_cannot_keep_its_vllm_pin_or_flash_attn_on_the_host() -> None:
    """OpenRLHF 0.11.2 pins vllm 0.29.0 (torch 2.13.0) and flash-attn 2.8.3 (no wheel): both are
    overridden, each with what it replaces and why."""
    pins = load_peer_pins(PEERS / "openrlhf.toml")
    replaced = {o.replaces: o.reason for o in pins.overrides}
    assert set(replaced) == {"vllm==0.29.0", "flash-attn==2.8.3"}
    assert "torch==2.13.0" in replaced["vllm==0.29.0"] and "sdist" in replaced["flash-attn==2.8.3"]
    assert not load_peer_pins(PEERS / "trl.toml").overrides  # TRL's pins all hold on the host


def test_a_peer_pins_file_names_what_it_needs(tmp_path: Path) -> None:
    bad = tmp_path / "x.toml"
    bad.write_text('[peer]\nname = "x"\nversion = "1"\nrequires = ["x==1"]\n[[override]]\nrequirement = "y==2"\n')
    with pytest.raises(RecipeError, match="requirement, replaces and reason"):
        load_peer_pins(bad)
    bad.write_text('[peer]\nname = "X Y"\nversion = "1"\nrequires = ["x==1"]\n')
    with pytest.raises(RecipeError, match="lowercase label"):
        load_peer_pins(bad)
    bad.write_text('[peer]\nname = "x"\nversion = "1"\nrequires = ["x==1"]\nfixed = ["torch"]\n')
    with pytest.raises(RecipeError, match="fixed torch is not in the target's pip freeze"):
        load_peer_pins(bad).requirements({"six": "1.0"})


def test_uv_overrides_beat_a_packages_own_pin_and_drop_a_dependency(tmp_path: Path, pypi: None) -> None:
    """flask 3.0.0 requires Werkzeug>=3.0.0 and click: the override puts Werkzeug 2.3.8 in the lock
    and the never-true marker leaves click out, as openrlhf.toml does with vllm and flash-attn."""
    out = tmp_path / "lock.txt"
    over = ["werkzeug==2.3.8", 'click; sys_platform == "never"']
    compile_lock(TARGET, out, ["flask==3.0.0"], overrides=over, what="a test's pins", made_by="this test")
    lock = parse_lock(out)
    assert lock["flask"].version == "3.0.0" and lock["werkzeug"].version == "2.3.8"
    assert "click" not in lock
    assert out.read_text().startswith("# A test's pins resolved for Python 3.12")
