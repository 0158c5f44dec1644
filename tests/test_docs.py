"""verl_recipes.docs: the READMEs' generated tables, fresh, and each number from a bounds file or the planner."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from verl_recipes.cli import main
from verl_recipes.docs import generated, gpus_table, plans_table, recipe_table, results_table
from verl_recipes.predict.margin import WORDS
from verl_recipes.recipe.metadata import discover


@pytest.fixture(scope="module")
def plans() -> str:
    return plans_table()  # composes every recipe and variant against verl's config: ~20 s


@pytest.fixture(scope="module")
def results() -> str:
    return results_table()  # reads every committed run's verl config: ~4 s


def test_readme_tables_are_fresh(root: Path) -> None:
    for path, text in generated(root).items():
        assert text == path.read_text(), f"{path.relative_to(root)} is stale: run `verl-recipes docs --write`"


def test_the_front_readme_gives_the_two_commands_then_one_table_in_the_users_words(root: Path) -> None:
    """The README opens with the two commands, then the one table a user chooses GPUs from: every
    job by its title, every setting in words with the variant that gives it."""
    readme = (root / "README.md").read_text()
    start, table = readme.index("nox -s recipe-7b-lora"), readme.index("<!-- gpus:begin -->")
    assert start < readme.index("nox -s tests") < table
    assert readme.index("\n|") > table  # the first table is the GPU table
    rows = gpus_table().splitlines()[2:]
    for r in discover().values():
        assert f"[{r.title}](recipes/{r.id}/README.md)" in readme
        for v in r.variants:
            (row,) = [x for x in rows if f"(`--variant {v}`)" in x and x.split("|")[2].strip() != v]
            assert any(w in row for w in WORDS), row  # `plan`'s three words, as the plans table


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
    for variant, bounds in (("default", "h200x1-ppo.yaml"), ("grpo", "h200x1-grpo.yaml")):
        doc = yaml.safe_load((root / "recipes/7b-lora/expected" / bounds).read_text())
        runs = doc["measured"].values() if "memory_gib" not in doc["measured"] else [doc["measured"]]
        peak = max(v for run in runs for per in run["memory_gib"].values() for v in per.values())
        word, predicted = cells[("7b-lora", variant)]["h200-141g"].split(" ")[:2]
        assert word in WORDS
        predicted = float(predicted)
        assert predicted == pytest.approx(peak, rel=0.10), (variant, predicted, peak)
    # the 24 GB-card settings are predicted to fit a 24 GB card; the plain recipe is not
    assert cells[("7b-lora", "24gib")]["a10g-24g"].startswith("fits ")
    assert cells[("7b-lora", "default")]["a10g-24g"].startswith("does not fit")
    # the seed's 70B layout is under an 80 GB card by less than what moves it; its 80gib settings are not
    assert cells[("70b-3d", "default")]["h100-80g"].startswith("tight ")
    assert cells[("70b-3d", "80gib")]["h100-80g"].startswith("fits ")


def test_results_table_cost_follows_from_the_bounds_and_prices(root: Path, results: str) -> None:
    """Each row's $ per million tokens = GPUs x 1e6 / (tokens/s/GPU x GPUs) / 3600 x price."""
    import re

    from verl_recipes.predict.cost import load_prices, pick_offer, prices_file

    price = pick_offer(load_prices(prices_file()), "h200-141g")
    assert price is not None
    rows = [r for r in results.splitlines() if r.startswith("| 7b-lora")]
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


def test_readme_table_numbers_come_from_expected_files(tmp_path: Path) -> None:
    table = recipe_table()
    assert "expected/h200x1-ppo.yaml" in table
    # a recipe without a bounds file or a run shows no number
    bare = discover()["13b-fsdp"].model_copy(update={"expected": [], "dir": tmp_path / "recipes" / "13b-fsdp"})
    row = recipe_table({"13b-fsdp": bare}).splitlines()[-1]
    assert row.endswith("| not measured yet |"), row


def test_docs_results_prints_the_readmes_results_table(capsys: pytest.CaptureFixture[str], results: str) -> None:
    """`docs --results` prints the measured-results table the README carries, and writes nothing."""
    assert main(["docs", "--results"]) == 0
    assert capsys.readouterr().out.strip() == results.strip()


def test_a_row_names_each_fix_its_runs_went_without_as_plan_judges_them(results: str) -> None:
    """A row measured before a fix that changes what it shows was written names the fix as the
    `--verl-fix-off` that reproduces it, as `plan` declines to price such a run for the recipe:
    7b-lora's GRPO row ran verl's 2 s replay-buffer poll (its record lists the fixes of its day).
    A rank rehearsal shows memory only, so a fix of the rate alone is not its concern."""
    from verl_recipes.plan.runs import lacks, read_run, run_setup

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "7b-lora"
    (source,) = yaml.safe_load((recipe / "expected" / "h200x1-grpo.yaml").read_text())["source_runs"]
    grpo = read_run(recipe / source)
    assert "replay-buffer-poll" in lacks(grpo, run_setup(grpo), "rate")
    row = next(r for r in results.splitlines() if "(recipes/7b-lora/expected/h200x1-grpo.yaml)" in r)
    assert "--verl-fix-off replay-buffer-poll" in row
    rank = next(r for r in results.splitlines() if "(recipes/13b-fsdp/expected/h200x1-ppo-rank0of2.yaml)" in r)
    assert "replay-buffer-poll" not in rank


def test_no_text_file_holds_a_merge_conflict_marker(root: Path) -> None:
    """A merge left unresolved commits its markers as text: a campaign order file once held them and
    every line after them was read as a step. Any tracked text file with one fails here, by name."""
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.split(b"\0")
    found = []
    for name in filter(None, names):
        path = root / name.decode()
        if not path.is_file() or path.suffix in {".gz", ".png", ".parquet", ".tgz"}:
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:
            continue  # binary
        if marker.search(data.decode("utf-8", "replace")):
            found.append(name.decode())
    assert not found, f"merge conflict markers in: {', '.join(found)}"
