"""verl_recipes.recipe.run_names: every committed run folder and bounds file follows the naming rule
of recipes/README.md, and each name says what the run's own records say ran."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from verl_recipes import RecipeError
from verl_recipes.layout import RankSpec
from verl_recipes.recipe.metadata import discover, get_recipe
from verl_recipes.recipe.run_names import (
    RULE,
    RunName,
    algorithm,
    backend_label,
    gpu_family,
    parse_bounds_name,
    parse_run_name,
)
from verl_recipes.rundir import CONFIG, MODEL_CONFIG, PROVENANCE, read_provenance
from verl_recipes.workload.arch import resolve_arch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = discover()


def run_folders() -> list[tuple[str, Path]]:
    """(recipe id, folder) for every entry of results/ and results/failed/; a file there is listed
    too, so that it fails: results/ holds run folders only."""
    out = []
    for rid in RECIPES:
        results = ROOT / "recipes" / rid / "results"
        for entry in sorted(results.iterdir()) if results.is_dir() else []:
            if entry.name == "failed" and entry.is_dir():
                out += [(rid, e) for e in sorted(entry.iterdir())]
            else:
                out.append((rid, entry))
    return out


def _record_dir(run: Path) -> Path | None:
    """The folder holding the run's provenance.json: the run, or its one verl part (a comparison
    run keeps verl's run in verl/ beside the other framework's). A verl run has its
    verl_config.yaml beside it; a run of another loop (provenance.json `backend`) has none."""
    for d in (run, run / "verl"):
        if (d / PROVENANCE).is_file() and ((d / CONFIG).is_file() or not read_provenance(d).verl):
            return d
    return None


def what_ran(run: Path, rid: str) -> RunName | None:
    """The name the rule gives the run's own records (None for a run folder without them)."""
    d = _record_dir(run)
    if d is None:
        return None
    prov = read_provenance(d)
    if prov.verl:
        cfg = yaml.safe_load((d / CONFIG).read_text())
        estimator = cfg["algorithm"]["adv_estimator"]
        world = cfg["trainer"]["n_gpus_per_node"] * cfg["trainer"]["nnodes"]
    else:  # another loop's provenance names its estimator and world in verl's words
        estimator, world = prov.raw["adv_estimator"], int(prov.raw["world"])
    algo = "ppo" if estimator == "gae" else estimator
    layers = prov.argv_value("--layers")
    if layers is None and (d / MODEL_CONFIG).is_file():  # the model the run saved: the recipe's, cut short?
        model = json.loads((d / MODEL_CONFIG).read_text())
        full = resolve_arch(RECIPES[rid].model.arch)
        if model["hidden_size"] == full["hidden_size"] and model["num_hidden_layers"] < full["num_hidden_layers"]:
            layers = str(model["num_hidden_layers"])
    label = backend_label(prov.backend)
    return RunName(
        gpu=gpu_family(prov.gpu_names[0]) if prov.gpu_names else "",
        n=1 if prov.rank_rehearsal else world,  # a rehearsed rank ran on one GPU of the job's N
        algo=algo,
        variants=tuple(v for v in prov.variants if v != algo),
        layers=int(layers) if layers is not None else None,
        cap_gib=prov.cap_gib,
        rank=prov.rank_rehearsal,
        labels=(label,) if label else (),  # the records give the loop's label only; the others are words
        repeat=None,
    )


def _configuration(name: RunName) -> tuple:
    return (name.gpu, name.n, name.algo, name.variants, name.layers, name.cap_gib, name.rank)


#: labels the records give (a loop other than verl's): a name carries one exactly when its records say so
RECORDED_LABELS = {"deepspeed", "trl", "openrlhf"}


@pytest.mark.parametrize(("rid", "run"), run_folders(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_every_committed_run_is_named_by_what_ran(rid: str, run: Path) -> None:
    assert run.is_dir(), f"{run.relative_to(ROOT)}: results/ holds run folders only; move it beside results/"
    name = parse_run_name(run.name, RECIPES[rid].variants)
    ran = what_ran(run, rid)
    if ran is not None:
        # the name the rule gives what ran, with the words and the repeat only a person can give
        words = tuple(x for x in name.labels if x not in RECORDED_LABELS)
        want = replace(ran, labels=(*ran.labels, *words), repeat=name.repeat).text
        assert _configuration(name) == _configuration(ran), f"{run.relative_to(ROOT)} ran {want}"
        assert set(name.labels) & RECORDED_LABELS == set(ran.labels), f"{run.relative_to(ROOT)} ran {want}"


def test_the_deepspeed_side_is_named_by_its_records() -> None:
    """The DeepSpeed side of verl-vs-deepspeed is named from its provenance.json alone (no verl
    config): the rank it stood for, on one H200, PPO, and the label of its loop."""
    run = ROOT / "recipes" / "verl-vs-deepspeed" / "results" / "h200x1-ppo-rank0of2-deepspeed"
    ran = what_ran(run, "verl-vs-deepspeed")
    assert ran == RunName("h200", 1, "ppo", (), None, None, RankSpec(0, 2), ("deepspeed",), None)
    assert backend_label(None) is None
    with pytest.raises(RecipeError, match="not a lowercase label"):
        backend_label("DeepSpeed ZeRO-3")


def _bounds_files() -> list[tuple[str, Path]]:
    return [(rid, f) for rid in RECIPES for f in sorted((ROOT / "recipes" / rid / "expected").glob("*"))]


@pytest.mark.parametrize(("rid", "path"), _bounds_files(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_every_bounds_file_is_named_by_the_configuration_of_its_runs(rid: str, path: Path) -> None:
    name = parse_bounds_name(path.name, RECIPES[rid].variants)
    doc = yaml.safe_load(path.read_text())
    if doc.get("status") == "predicted":  # a prediction names its target: GPU type and count
        target = doc["target"]
        assert (name.gpu, name.n) == (target["gpu"].split("-")[0], target["gpus"]), path.name
        return
    runs = [path.parent.parent / r for r in doc.get("source_runs") or [doc["source_run"]]]
    for run in runs:
        assert run.is_dir(), f"{path.name}: source run {run} is not a folder"
        ran = what_ran(run, rid)
        assert ran is not None, f"{path.name}: {run.name} has no records"
        want = replace(ran, labels=(*ran.labels, *(x for x in name.labels if x not in RECORDED_LABELS))).configuration
        assert _configuration(name) == _configuration(ran), (
            f"{path.name}: {run.name} ran {want.text}; name it {want.text}.yaml"
        )


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("32gib-cap-grpo", "must start <gpu>x<n>-<algo>"),
        ("h200x1-24gib-cap24-grpo", "must start <gpu>x<n>-<algo>"),
        ("h200x1-ppo-cap24-24gib", "'24gib' is out of order"),
        ("h200x1-ppo-L4-sync-check", "'-L4-sync-check' is not a lowercase label"),
        ("comparison-verl-example.json", "must start"),
    ],
)
def test_a_name_off_the_rule_is_refused_saying_where(name: str, says: str) -> None:
    with pytest.raises(RecipeError) as e:
        parse_run_name(name, ["grpo", "24gib", "verl-example"])
    assert says in str(e.value) and RULE in str(e.value)


def test_the_rule_reads_every_part() -> None:
    got = parse_run_name(
        "h200x2-grpo-24gib-verl-example-l2-cap22.5-rank1of4-verl-sync-3", ["grpo", "24gib", "verl-example"]
    )
    assert got == RunName("h200", 2, "grpo", ("24gib", "verl-example"), 2, 22.5, RankSpec(1, 4), ("verl", "sync"), 3)
    # the one spelling: the parts give the name back, and a bounds file's name drops the repeat
    assert got.text == "h200x2-grpo-24gib-verl-example-l2-cap22.5-rank1of4-verl-sync-3"
    assert got.configuration.text == "h200x2-grpo-24gib-verl-example-l2-cap22.5-rank1of4-verl-sync"
    assert gpu_family("NVIDIA H100 80GB HBM3") == "h100" and gpu_family("NVIDIA A100-SXM4-80GB") == "a100"
    with pytest.raises(RecipeError, match="not a lowercase label"):  # bounds span repeats: no <k>
        parse_bounds_name("h200x1-ppo-2.yaml", [])


def test_the_rule_in_the_readme_is_the_rule_in_code() -> None:
    assert RULE in (ROOT / "recipes" / "README.md").read_text()


def test_the_algorithm_is_read_as_hydra_reads_the_value() -> None:
    """verl's scripts quote values (`algorithm.adv_estimator="grpo"`); Hydra reads both spellings as
    one value, so a run's name does too, and a quoted one never reaches a folder name."""
    recipe = get_recipe("7b-lora")
    assert algorithm(recipe, [], ['algorithm.adv_estimator="grpo"']) == "grpo"
    assert algorithm(recipe, [], ["algorithm.adv_estimator='grpo'"]) == "grpo"
    assert algorithm(recipe, [], ["algorithm.adv_estimator=gae"]) == "ppo"
