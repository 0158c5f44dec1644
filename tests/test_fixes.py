"""verl_recipes.fixes: the verl fixes as one table, which the workers patch by and the planner,
the bounds and the docs judge runs by."""

from __future__ import annotations

import re
from pathlib import Path

from verl_recipes.fixes import FIXES, MEGATRON_PIN_FIX, PACKED_ATTN_FIX, RAY_START_FIX, RunKind, concerns, executes
from verl_recipes.worker import verl_fixes

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_has_its_patch_and_one_number() -> None:
    """The workers patch exactly the table's fixes, and each fix has one number, in order."""
    assert list(verl_fixes.PATCHES) == list(FIXES)
    numbers = [f.number for f in FIXES.values()]
    assert numbers == sorted(set(numbers)) and 3 not in numbers  # the README's 3 is a configuration
    assert all(f.module.startswith("verl.") and f.what for f in FIXES.values())


def test_the_readmes_number_the_fixes_as_the_table_does() -> None:
    """A README's `N. **Title** (`name`` is fix N of the table: one numbering everywhere."""
    found = {}
    for readme in ("recipes/7b-lora/README.md", "recipes/70b-3d/README.md"):
        for number, name in re.findall(
            r"^(\d+)\. \*\*[^*]+\*\*[^\n]*?\(`([a-z0-9-]+)`", (ROOT / readme).read_text(), re.M
        ):
            found[(readme, name)] = int(number)
    assert len({name for _, name in found}) >= 8, found
    wrong = {k: n for k, n in found.items() if k[1] not in FIXES or FIXES[k[1]].number != n}
    assert not wrong, wrong


def test_a_fix_concerns_only_what_it_changes_in_code_the_run_executes() -> None:
    fsdp = RunKind(backend="fsdp", padding_free=False, critic=True)
    assert concerns(RAY_START_FIX, "host memory", fsdp) and not concerns(RAY_START_FIX, "device memory", fsdp)
    assert not executes(MEGATRON_PIN_FIX, fsdp) and executes(MEGATRON_PIN_FIX, RunKind("megatron", False, True))
    assert not executes(PACKED_ATTN_FIX, fsdp) and executes(PACKED_ATTN_FIX, RunKind("fsdp", True, False))
