"""Recipe metadata: discovery, schema errors that name file and key, unknown ids."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.recipe.metadata import discover, get_recipe, load_recipe

EXPECTED_IDS = {"7b-lora", "13b-fsdp", "70b-3d", "verl-vs-deepspeed"}


def test_discovers_the_four_recipes() -> None:
    assert set(discover()) == EXPECTED_IDS


def _copy(root: Path, tmp_path: Path, rid: str = "7b-lora") -> Path:
    dst = tmp_path / "recipes" / rid
    shutil.copytree(root / "recipes" / rid, dst)
    return dst / "recipe.yaml"


def _edit(path: Path, fn) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data))


def test_unknown_key_names_file_key_and_suggestion(root: Path, tmp_path: Path) -> None:
    path = _copy(root, tmp_path)
    _edit(path, lambda d: d["gpus"].update({"per_gpu_gb": 24}))
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    msg = str(e.value)
    assert str(path) in msg and "gpus.per_gpu_gb" in msg and "per_gpu_gib" in msg


def test_wrong_type_names_file_and_key(root: Path, tmp_path: Path) -> None:
    path = _copy(root, tmp_path)
    _edit(path, lambda d: d["gpus"].update({"count": "one"}))
    with pytest.raises(RecipeError, match=r"recipe\.yaml: gpus\.count: "):
        load_recipe(path)


def test_bad_backend_and_missing_config_file(root: Path, tmp_path: Path) -> None:
    path = _copy(root, tmp_path)
    _edit(path, lambda d: d.update({"backend": "jax"}))
    with pytest.raises(RecipeError, match="backend"):
        load_recipe(path)
    path = _copy(root, tmp_path / "b")
    _edit(path, lambda d: d.update({"config": "nope.yaml"}))
    with pytest.raises(RecipeError, match=r"nope\.yaml: file does not exist"):
        load_recipe(path)


def test_id_must_match_folder(root: Path, tmp_path: Path) -> None:
    path = _copy(root, tmp_path)
    _edit(path, lambda d: d.update({"id": "7b-lora-copy"}))
    with pytest.raises(RecipeError, match="must equal the folder name"):
        load_recipe(path)


def test_unknown_recipe_lists_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RecipeError) as e:
        get_recipe("7b-lorra")
    assert "did you mean '7b-lora'" in str(e.value)
    for rid in EXPECTED_IDS:
        assert rid in str(e.value)
    assert main(["show", "nonexistent-recipe"]) == 2
    assert "recipes: " in capsys.readouterr().err


def test_unknown_variant() -> None:
    with pytest.raises(RecipeError, match="variants: grpo, 24gib"):
        get_recipe("7b-lora").config_files(["grp"])
