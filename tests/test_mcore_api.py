"""verl_recipes.stack.mcore_api: verl's uses of megatron-core / Megatron-Bridge / TE resolved in their sources.

First on a made-up package and a made-up verl whose answers are known, then on verl 0.9.1 as
installed against the pinned wheels from PyPI (images/versions.toml [megatron]): the names it
cannot find there are exactly the ones gpu/megatron-notes.md lists, each off recipe 70b-3d's path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from verl_recipes.stack.mcore_api import Sources, change, check, main


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


MEGATRON = {
    "megatron/core/__init__.py": "from .state import *\nfrom . import state as mpu\n",
    "megatron/core/state.py": "def get_rank(group=None):\n    pass\n\ndef gone_later():\n    pass\n",
    "megatron/core/config.py": (
        "from dataclasses import dataclass\n\n@dataclass\nclass Base:\n    tp: int = 1\n\n"
        "@dataclass\nclass Config(Base):\n    layers: int = 1\n\n"
        "class Helper:\n    def save_loss(self):\n        pass\n"
    ),
}
VERL = {
    "verl/engine.py": (
        "from megatron.core import mpu, get_rank\n"
        "from megatron.core.config import Config, Helper, Missing\n"
        "from megatron.core.nothere import x\n"
        "get_rank(group=1)\nmpu.gone_later()\nmpu.not_a_function()\n"
        "Config(tp=2, layers=4, pp=2)\n"
    ),
    "verl/other.py": "import os\n",
}


def test_finds_missing_names_modules_attributes_and_keywords(tmp_path: Path) -> None:
    verl = _tree(tmp_path / "verl-root", VERL)
    src = Sources([_tree(tmp_path / "mcore", MEGATRON)])
    rep = check(verl, src)
    assert rep.files == 1  # other.py names none of the packages
    assert sorted(f.what for f in rep.findings) == [
        "megatron.core.config has no Missing",
        "megatron.core.config.Config() takes no keyword 'pp'",  # a dataclass takes its bases' fields too
        "megatron.core.state has no not_a_function (used as mpu.not_a_function)",
        "no module megatron.core.nothere",
    ]
    assert ("megatron.core.state", "get_rank") in rep.used  # resolved through the star import


def test_base_tags_new_findings_and_lists_changed_signatures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verl = _tree(tmp_path / "verl-root", VERL)
    base = _tree(tmp_path / "base", MEGATRON)
    newer = {
        **MEGATRON,
        "megatron/core/state.py": "def get_rank(group=None, with_x=False):\n    pass\n",
        "megatron/core/config.py": MEGATRON["megatron/core/config.py"].replace("save_loss", "save_metrics"),
    }
    target = _tree(tmp_path / "target", newer)
    assert main([str(target), "--base", str(base), "--verl", str(verl)]) == 0
    out = capsys.readouterr().out
    assert "verl/engine.py:5: megatron.core.state has no gone_later (used as mpu.gone_later)  [new]" in out
    assert "no module megatron.core.nothere  [also in base]" in out
    assert "megatron.core.state.get_rank: (group) -> (group, with_x)" in out
    assert "megatron.core.config.Helper: removed save_loss" in out
    assert change({"": "a"}, {"": "a"}) == "" and change({"m": "self", "f": ""}, {"m": "self", "f": "", "g": ""}) == ""


def test_wheels_are_read_like_folders(tmp_path: Path) -> None:
    import zipfile

    whl = tmp_path / "megatron_core-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for rel, text in MEGATRON.items():
            z.writestr(rel, text)
    folder = Sources([_tree(tmp_path / "mcore", MEGATRON)])
    wheel = Sources([whl])
    assert wheel.resolve("megatron.core", "get_rank") == folder.resolve("megatron.core", "get_rank")
    assert wheel.keywords("megatron.core.config", "Config") == {"tp", "layers"}


#: What verl 0.9.1 uses that the pinned megatron-core 0.19.2 / Megatron-Bridge 0.6.2 / TE 2.20.2 do
#: not have, and why recipe 70b-3d (dense Llama, no MTP, no dynamic CP, no Muon, no async save,
#: Megatron-Bridge not mbridge) never reaches it. gpu/megatron-notes.md has the evidence.
KNOWN = {
    ("verl/models/mcore/mbridge.py", 21): "mbridge: the deprecated vanilla_mbridge path",
    ("verl/models/mcore/mbridge.py", 22): "mbridge: the deprecated vanilla_mbridge path",
    ("verl/models/mcore/util.py", 363): "dynamic context parallel only",
    ("verl/utils/checkpoint/megatron_checkpoint_manager.py", 1166): "checkpoint.async_save only (new in 0.19)",
    ("verl/utils/dynamic_cp_scheduler.py", 35): "dynamic context parallel only",
    ("verl/utils/megatron_utils.py", 69): "Muon layer-wise optimizer probe, inside try/except TypeError",
    ("verl/utils/megatron_utils.py", 191): "encoder_and_decoder models, asserted unsupported just above",
    ("verl/utils/megatron_utils.py", 195): "encoder_and_decoder models, asserted unsupported just above",
    ("verl/utils/megatron_utils.py", 199): "encoder_and_decoder models, asserted unsupported just above",
    ("verl/utils/megatron_utils.py", 200): "encoder_and_decoder models, asserted unsupported just above",
    ("verl/workers/engine/megatron/transformer_impl.py", 249): "dynamic context parallel only",
    ("verl/workers/engine/megatron/transformer_impl.py", 765): "dynamic context parallel only",
}
PINNED = ("megatron-core==0.19.2", "megatron-bridge==0.6.2", "transformer-engine==2.20.2")


@pytest.fixture(scope="module")
def pinned_wheels(tmp_path_factory: pytest.TempPathFactory, pypi: None) -> list[Path]:
    """The pinned Megatron wheels from PyPI, downloaded once for this module's tests."""
    where = tmp_path_factory.mktemp("pinned")
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(where)]
    target = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64"]
    subprocess.run([*pip, *target, "--platform", "any", *PINNED], check=True, timeout=600)
    return sorted(where.glob("*.whl"))


def test_the_committed_provider_fields_are_the_pinned_wheels(pinned_wheels: list[Path], root: Path) -> None:
    """images/megatron-provider-fields.txt, which the composition check reads, is what the pinned
    megatron-core and Megatron-Bridge give; and a field the recipe sets and a typo of it fall on
    either side of it."""
    from verl_recipes.recipe.provider_fields import PROVIDER_FIELDS, read_provider_fields
    from verl_recipes.stack.mcore_api import provider_fields_text

    mine = [w for w in pinned_wheels if w.name.startswith(("megatron_core-", "megatron_bridge-"))]
    assert len(mine) == 2, pinned_wheels
    assert (root / PROVIDER_FIELDS).read_text() == provider_fields_text(mine), (
        f"{PROVIDER_FIELDS} is stale: rewrite it with python -m verl_recipes.stack.mcore_api --provider-fields"
    )
    fields = read_provider_fields(root)
    assert {"gradient_accumulation_fusion", "recompute_granularity", "attention_backend"} <= fields
    assert "recompute_granularty" not in fields and len(fields) > 200


def test_verl_091_against_the_pinned_wheels(pinned_wheels: list[Path]) -> None:
    from importlib.metadata import version

    if version("verl") != "0.9.1":
        pytest.skip(f"KNOWN is for verl 0.9.1; verl {version('verl')} is installed")
    from verl_recipes.stack.mcore_api import _verl_root

    rep = check(_verl_root(), Sources(pinned_wheels))
    assert rep.files >= 30 and rep.uses >= 500
    found = [f"{f.file}:{f.line}: {f.what}" for f in rep.findings]
    assert {(f.file, f.line) for f in rep.findings} == set(KNOWN), found
