"""verl_recipes.docs: the READMEs' generated tables, fresh, and each number from a bounds file or the planner."""

from __future__ import annotations

import json
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


# --- dated status paragraphs ----------------------------------------------------------------------

#: a figure a status paragraph states: "70.43 GiB", "13.3 s a step", "817 tokens/s"
FIGURE = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s*/\s*\d+(?:\.\d+)?)?\s*(GiB|s a step|tokens/s)")
#: what a status paragraph names as its source: a run folder or a file of the checkout
NAMED = re.compile(r"(results/(?:failed/)?[\w.+-]+|gpu/[\w./-]+\.md|(?:expected|comparisons)/[\w.+-]+\.(?:yaml|md))")


def _leaves(x: object) -> list[float]:
    if isinstance(x, dict):
        return [v for item in x.values() for v in _leaves(item)]
    if isinstance(x, list):
        return [v for item in x for v in _leaves(item)]
    return [float(x)] if isinstance(x, int | float) and not isinstance(x, bool) else []


def status_paragraph(text: str) -> str:
    """The README's status: the paragraph that opens with `Status`, or the `## Status` section."""
    out: list[str] = []
    for line in text.splitlines():
        if not out and (line.startswith("Status") or line.startswith("## Status")):
            out.append(line)
        elif out and (line.startswith("## ") or (not line.strip() and not out[0].startswith("## "))):
            break
        elif out:
            out.append(line)
    return "\n".join(out)


def tree_figures(root: Path, recipe_dirs: list[Path], paragraph: str) -> list[float]:
    """What the tree holds behind a status: each bounds file's measured figures and prediction, the
    card sizes the recipe's variants and caps are named for, its comparisons, and every number of
    the runs and notes the paragraph names."""
    vals: list[float] = []
    for d in recipe_dirs:
        # the card sizes its variants and caps are named for ("the seed's 40 GiB card"), and the
        # comparisons of its runs (generated from them)
        names = " ".join(p.stem for p in (*d.glob("config-*.yaml"), *d.glob("expected/*.yaml")))
        vals += [float(x) for x in re.findall(r"(?:cap|-)(\d+(?:\.\d+)?)(?=gib|\b)", names)]
        for f in d.glob("comparisons/*.md"):  # their tables: differences as signed numbers
            vals += [abs(float(x.replace(",", ""))) for x in re.findall(r"[-+]?\d[\d,]*\.\d+", f.read_text())]
        for f in d.glob("expected/*.yaml"):
            doc = yaml.safe_load(f.read_text()) or {}
            vals += _leaves(doc.get("measured")) + _leaves(doc.get("predicted_gib")) + _leaves(doc.get("planner_gib"))
        for name in set(NAMED.findall(paragraph)):
            for base in (d, root):
                path = base / name
                if (path / "summary.json").is_file():
                    vals += _leaves(json.loads((path / "summary.json").read_text()))
                elif path.is_file():
                    vals += [float(m.group(1).replace(",", "")) for m in FIGURE.finditer(path.read_text())]
    return vals


def contradictions(root: Path, readme: Path, recipe_dirs: list[Path]) -> list[str]:
    paragraph = status_paragraph(readme.read_text())
    vals = tree_figures(root, recipe_dirs, paragraph)
    bad = []
    for m in FIGURE.finditer(paragraph):
        text = m.group(1).replace(",", "")
        places = len(text.split(".")[1]) if "." in text else 0
        if not any(round(v, places) == float(text) for v in vals):
            bad.append(f"{readme.relative_to(root)}: {m.group(0)!r}")
    return bad


def test_each_readmes_dated_status_agrees_with_the_expected_files_and_the_plan(root: Path, tmp_path: Path) -> None:
    """Every figure a README's status states (GiB, s a step, tokens/s) is one the tree holds: a
    bounds file's measurement or prediction (`plan --from-layers` writes those), or a run or note
    the paragraph names; a status left behind by newer runs or predictions fails here."""
    dirs = sorted(p.parent for p in (root / "recipes").glob("*/recipe.yaml"))
    bad = [b for d in dirs for b in contradictions(root, d / "README.md", [d])]
    bad += contradictions(root, root / "recipes" / "README.md", dirs)
    assert not bad, "a README's status states what no file of the tree holds:\n" + "\n".join(bad)
    # the status this replaced said the 70B prediction was 85.8 GiB: the tree holds no such prediction
    stale = tmp_path / "README.md"
    stale.write_text("Status (2026-12-02): predicted, not measured: 85.8 GiB per GPU in the critic's update.\n")
    assert contradictions(tmp_path, stale, [root / "recipes" / "70b-3d"]) == ["README.md: '85.8 GiB'"]


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
