"""noxfile.py: sessions derived from the recipe metadata, four per recipe, none listed by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from verl_recipes.docs import INDEX, recipe_index
from verl_recipes.recipe.metadata import discover


def test_nox_lists_four_sessions_per_recipe(root: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(root / "noxfile.py")], capture_output=True, text=True, check=True
    ).stdout
    for rid in discover():
        for kind in ("recipe", "smoke", "build", "bounds"):
            assert f"{kind}-{rid} " in out, f"nox -l lacks {kind}-{rid}"
        # the old name runs the same session for a release, and says what it is now called
        assert f"validate-{rid} [validate] -> the old name of bounds-{rid}: the same session." in out
    assert "* tests" in out and "planner-errors [check,cpu] -> " in out
    assert "validate-planner [validate] -> The old name of planner-errors: the same session." in out


def test_the_check_sessions_run_the_commands_by_their_names(root: Path) -> None:
    """`bounds-<id>` runs `verl-recipes check-bounds`, `planner-errors` runs `plan --errors`: the
    commands by their own names, never the old ones that print a note."""
    text = (root / "noxfile.py").read_text()
    assert '"verl-recipes", "check-bounds", rid' in text and '"verl-recipes", "plan", "--errors"' in text
    assert '"verl-recipes", "validate"' not in text and '"--validate"' not in text


def test_a_new_recipe_folder_gets_sessions(root: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(root, tmp_path / "tree", ignore=shutil.ignore_patterns(".git", ".venv", ".nox", "results", "runs"))
    src = tmp_path / "tree" / "recipes" / "7b-lora"
    dst = tmp_path / "tree" / "recipes" / "7b-lora-copy"
    shutil.copytree(src, dst)
    text = (dst / "recipe.yaml").read_text().replace("id: 7b-lora", "id: 7b-lora-copy")
    (dst / "recipe.yaml").write_text(text)
    # what `verl-recipes docs --write` does to the index noxfile.py reads (test_docs checks it is fresh)
    (tmp_path / "tree" / INDEX).write_text(recipe_index(discover(tmp_path / "tree" / "recipes")))
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(tmp_path / "tree" / "noxfile.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "recipe-7b-lora-copy" in out and "bounds-7b-lora-copy" in out
