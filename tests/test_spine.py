"""The spine: nox sessions derived from the metadata, the README table, the CLI's honesty."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from verl_recipes.cli import SUBCOMMANDS, main
from verl_recipes.docs import INDEX, plans_table, recipe_index, recipe_table, render_readme, results_table
from verl_recipes.recipe.metadata import discover


def test_nox_lists_four_sessions_per_recipe(root: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(root / "noxfile.py")], capture_output=True, text=True, check=True
    ).stdout
    for rid in discover():
        for kind in ("recipe", "smoke", "build", "validate"):
            assert f"{kind}-{rid} " in out, f"nox -l lacks {kind}-{rid}"
    assert "* tests" in out and "validate-planner" in out


def test_a_new_recipe_folder_gets_sessions(root: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(root, tmp_path / "tree", ignore=shutil.ignore_patterns(".git", ".venv", ".nox", "results", "runs"))
    src = tmp_path / "tree" / "recipes" / "7b-lora"
    dst = tmp_path / "tree" / "recipes" / "7b-lora-copy"
    shutil.copytree(src, dst)
    text = (dst / "recipe.yaml").read_text().replace("id: 7b-lora", "id: 7b-lora-copy")
    (dst / "recipe.yaml").write_text(text)
    # what `verl-recipes docs --write` does to the index noxfile.py reads (test_recipe_index_is_fresh)
    (tmp_path / "tree" / INDEX).write_text(recipe_index(discover(tmp_path / "tree" / "recipes")))
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(tmp_path / "tree" / "noxfile.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "recipe-7b-lora-copy" in out and "validate-7b-lora-copy" in out


@pytest.fixture(scope="module")
def plans() -> str:
    return plans_table()  # composes every recipe and variant against verl's config: ~20 s


def test_recipe_index_is_fresh(root: Path) -> None:
    """noxfile.py names its sessions from recipes/index.json (no YAML parser before install)."""
    assert (root / INDEX).read_text() == recipe_index(), "run `verl-recipes docs --write`"


def test_readme_table_is_fresh(root: Path, plans: str) -> None:
    readme = (root / "README.md").read_text()
    assert render_readme(readme, recipe_table(), results_table(), plans) == readme, "run `verl-recipes docs --write`"


def _plan_cells(plans: str) -> dict[tuple[str, str], dict[str, str]]:
    lines = [r for r in plans.splitlines() if r.startswith("|") and not r.startswith("|---")]
    head = [c.strip().split(" ")[0] for c in lines[0].strip("|").split("|")]
    out = {}
    for row in lines[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        out[(cells[0], cells[1])] = dict(zip(head[3:], cells[3:], strict=True))
    return out


def test_plans_table_covers_every_recipe_variant_and_agrees_with_the_measured_peaks(root: Path, plans: str) -> None:
    """Every recipe and variant has a row; where a bounds file measured the same configuration on an
    H200, the predicted cell is within 10% of the measured peak (the planner's tolerance)."""
    cells = _plan_cells(plans)
    for r in discover().values():
        for v in ["default", *r.variants]:
            assert (r.id, v) in cells, f"no plans row for {r.id} {v}"
    for variant, bounds in (("default", "h200x1.yaml"), ("grpo", "h200x1-grpo.yaml")):
        doc = yaml.safe_load((root / "recipes/7b-lora/expected" / bounds).read_text())
        runs = doc["measured"].values() if "memory_gib" not in doc["measured"] else [doc["measured"]]
        peak = max(v for run in runs for per in run["memory_gib"].values() for v in per.values())
        predicted = float(cells[("7b-lora", variant)]["h200-141g"])
        assert predicted == pytest.approx(peak, rel=0.10), (variant, predicted, peak)
    # the 24 GB-card settings are predicted to fit a 24 GB card; the plain recipe is not
    assert not cells[("7b-lora", "24gib")]["a10g-24g"].startswith("no")
    assert cells[("7b-lora", "default")]["a10g-24g"].startswith("no")


def test_results_table_cost_follows_from_the_bounds_and_prices(root: Path) -> None:
    """Each row's $ per million tokens = GPUs x 1e6 / (tokens/s/GPU x GPUs) / 3600 x price."""
    import re

    from verl_recipes.plan.cost import load_prices, pick_offer, prices_file

    price = pick_offer(load_prices(prices_file()), "h200-141g")
    assert price is not None
    rows = [r for r in results_table().splitlines() if r.startswith("| 7b-lora")]
    assert len(rows) >= 3
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        gpus = int(re.match(r"(\d+)x", cells[2]).group(1))  # type: ignore[union-attr]
        tput, gh, usd = float(cells[4].replace(",", "")), float(cells[6]), float(cells[7])
        assert gpus == 1  # 7b-lora runs on one GPU, also when the host had two
        # the cells are rounded: GPU-h and $ to 0.01, tokens/s to 1 (0.1% at the rates here)
        want_gh = 1e6 / tput / 3600
        assert gh == pytest.approx(want_gh, abs=0.005 + 0.002 * want_gh)
        assert usd == pytest.approx(want_gh * price.usd_per_gpu_hour, abs=0.005 + 0.002 * usd)


def test_readme_table_numbers_come_from_expected_files() -> None:
    table = recipe_table()
    assert "expected/h200x1.yaml" in table
    assert "not measured yet" in table  # recipes without a run show no number


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert "not built yet" not in capsys.readouterr().out
