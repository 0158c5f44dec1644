"""noxfile.py: sessions derived from the recipe metadata, four per recipe, none listed by hand."""

from __future__ import annotations

import json
import os
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
        assert f"validate-{rid}" not in out
    assert "* tests" in out and "planner-errors [check,cpu] -> " in out
    assert "validate-planner" not in out


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


def test_uv_gets_the_wheels_pip_finds_on_this_host(root: Path, tmp_path: Path) -> None:
    """uv reads no pip configuration: the tests session hands it pip's find-links (where a host keeps
    wheels no index has, such as a CPU torch build), from the environment and from pip's config file."""
    env_links, file_link = [tmp_path / "a", tmp_path / "b"], tmp_path / "c"
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {file_link}\n")
    env = {"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": str(conf), "PIP_FIND_LINKS": " ".join(map(str, env_links))}
    code = "import json, sys; sys.argv = ['nox']; import noxfile; print(json.dumps(noxfile._pip_find_links()))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
    ).stdout
    args = json.loads(out)
    assert args[0::2] == ["--find-links"] * (len(args) // 2) and len(args) % 2 == 0, args
    # pip's site-wide config files may add their own; these three are there, each once
    assert sorted(a for a in args[1::2] if a.startswith(str(tmp_path))) == sorted(map(str, (file_link, *env_links))), (
        args
    )
