"""`plan --from-layers`: the truncated-depth calibration of recipe 70b-3d (verl_recipes.plan.layers).

The runs here are built from the planner itself, with a known error added (a fixed offset and a
per-layer factor), so the answer is known in closed form: the fit must recover the error and carry
it to the full depth. Their configs are composed for real against verl's schema, the same way
`verl-recipes train 70b-3d --gpus 2 --layers N` composes them (gpu/campaigns/70b-layers.txt).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from verl_recipes import GIB, RecipeError
from verl_recipes.cli import main
from verl_recipes.fixes import FIXES
from verl_recipes.plan.cli import load_setup
from verl_recipes.plan.layers import _planned_peaks, _with_layers, fit_line, predict
from verl_recipes.predict.gpus import GPU, parse_gpu
from verl_recipes.predict.phases import Constants
from verl_recipes.workload.arch import ARCHS_DIR

H200 = GPU(id="NVIDIA H200", name="NVIDIA H200", memory_bytes=round(140.4 * GIB), visible_bytes=round(140.4 * GIB))
CAMPAIGN = Path(__file__).resolve().parents[1] / "gpu" / "campaigns" / "70b-layers.txt"


def _plan_sets(name: str) -> list[str]:
    """The `--set` overrides of one line of the committed 70B plan: the layouts the GPU runs use."""
    for raw in CAMPAIGN.read_text().splitlines():
        if raw.startswith(f"{name}|"):
            words = shlex.split(raw.split("|", 3)[3])
            return [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    raise AssertionError(f"{CAMPAIGN}: no line {name}")


TP2, PP2 = _plan_sets("70b-3d/h200x2-ppo-l2-tp2"), _plan_sets("70b-3d/h200x2-ppo-l2-pp2")
ONE_GPU = CAMPAIGN.with_name("70b-tp1.txt")


def _one_gpu_runs() -> dict[int, tuple[list[str], int, list[str]]]:
    """Layers -> (variants, GPUs, `--set`s) of the one-GPU campaign's runs as the recipe has them
    (its fallback line, with another offload layout, is not one of the depths the fit reads)."""
    out = {}
    for raw in ONE_GPU.read_text().splitlines():
        if raw.startswith("#") or not raw.strip() or raw.split("|")[2].startswith("!"):
            continue
        words = shlex.split(raw.split("|", 3)[3])
        flags = list(zip(words[1::2], words[2::2], strict=True))  # `70b-3d --flag value ...`
        one = dict(flags)
        variants = [v for k, v in flags if k == "--variant"]
        out[int(one["--layers"])] = (variants, int(one["--gpus"]), [v for k, v in flags if k == "--set"])
    return out


def _make_run(
    where: Path,
    layers: int,
    sets: list[str],
    offset_gib: float,
    per_layer_factor: float,
    variants: list[str] | None = None,
    gpus: int = 2,
) -> tuple[Path, dict[str, int]]:
    """A run folder as `verl-recipes train` + `report` leave it, whose 'measured' peaks are the
    planner's plus `offset_gib` plus `per_layer_factor - 1` times the planner's per-layer part."""
    from omegaconf import OmegaConf
    from verl_recipes.predict.inputs import setup_from_config
    from verl_recipes.predict.model import Arch
    from verl_recipes.recipe.compose import compose_recipe
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import launcher_settings

    run = where / f"l{layers}"
    run.mkdir(parents=True)
    recipe = get_recipe("70b-3d")
    extra = launcher_settings(recipe, Path("/m"), Path("/d"), run, 3, gpus, 1)
    cfg = compose_recipe(recipe, variants or [], sets, extra=extra)
    (run / "verl_config.yaml").write_text(OmegaConf.to_yaml(cfg))
    model_cfg = json.loads((ARCHS_DIR / "llama-2-70b" / "config.json").read_text())
    model_cfg["num_hidden_layers"] = layers
    (run / "model_config.json").write_text(json.dumps(model_cfg))
    setup = setup_from_config(cfg, Arch.from_config(model_cfg))
    here = _planned_peaks(setup, H200, Constants())
    other = _planned_peaks(_with_layers(setup, 2 * layers), H200, Constants())
    slope = {ph: (other[ph] - here[ph]) / layers for ph in here}  # the planner's bytes per layer
    measured = {ph: round(here[ph] + offset_gib * GIB + (per_layer_factor - 1) * slope[ph] * layers) for ph in here}
    phases = {ph: {"gpu": {"0": {"used_gib": v / GIB}}} for ph, v in measured.items()}
    summary = {
        "schema": "verl-recipes/monitor-summary/1",
        "gpus": [{"index": 0, "name": "NVIDIA H200", "total_gib": 140.4}],
        "phases": phases,
        "steps": [],
    }
    (run / "summary.json").write_text(json.dumps(summary))
    # made as a run of today's `train` records itself: every fix applied
    prov = {"note": "made by tests/test_plan_layers.py", "verl_fixes_off": [], "verl_fixes": list(FIXES)}
    (run / "provenance.json").write_text(json.dumps(prov))
    return run, measured


def test_fit_line_least_squares_and_needs_two_depths() -> None:
    line = fit_line([(2, 10.0), (4, 14.0), (8, 22.0)])
    assert line.intercept == pytest.approx(6.0) and line.slope == pytest.approx(2.0)
    with pytest.raises(RecipeError, match="two different depths"):
        fit_line([(2, 10.0), (2, 11.0)])


def test_runs_that_match_the_planner_give_the_planner(tmp_path: Path) -> None:
    runs = [_make_run(tmp_path / "tp2", n, TP2, 0.0, 1.0)[0] for n in (2, 4)]
    _, target, _ = load_setup("70b-3d", [], [])
    gpu = parse_gpu("h100-80g")
    result, fits = predict(target, gpu, runs)
    assert len(fits) == 1 and fits[0].depths == [2, 4]
    for ph, v in result["predicted_gib"].items():
        assert v == pytest.approx(result["planner_gib"][ph], abs=0.02), ph


def test_an_offset_and_a_per_layer_error_carry_to_full_depth(tmp_path: Path) -> None:
    """Measured = planner + 1.5 GiB + 20% more per layer, in both layouts: the 80-layer prediction is
    the planner's full fixed part + 1.5 GiB + 1.2 x its full per-layer part, and the larger layout wins."""
    runs = [_make_run(tmp_path / "tp2", n, TP2, 1.5, 1.2)[0] for n in (2, 4)]
    runs += [_make_run(tmp_path / "pp2", n, PP2, 0.0, 1.0)[0] for n in (2, 4)]
    _, target, _ = load_setup("70b-3d", [], [])
    gpu = parse_gpu("h100-80g")
    result, fits = predict(target, gpu, runs)
    assert len(fits) == 2
    full = _planned_peaks(target, gpu, Constants())
    half = _planned_peaks(_with_layers(target, 40), gpu, Constants())
    for ph in ("update_actor", "update_critic", "old_log_prob"):
        per_layer = (full[ph] - half[ph]) / 40
        want = (full[ph] - 80 * per_layer + 1.5 * GIB + 1.2 * 80 * per_layer) / GIB
        tp2 = next(v for k, v in result["per_layout_gib"].items() if "TP2 PP1" in k)
        assert tp2[ph] == pytest.approx(want, rel=1e-3), ph
        assert result["predicted_gib"][ph] == pytest.approx(max(v[ph] for v in result["per_layout_gib"].values()))
    assert result["fits"] == (max(result["predicted_gib"].values()) * GIB <= gpu.visible_bytes)


def test_runs_of_the_target_layout_decide_and_a_phase_a_run_died_in_is_not_fitted(tmp_path: Path) -> None:
    """TP1 runs 20% over the planner per layer beside runs of 70b-3d's own TP4 x PP2 x 32 layout that
    match it (rank rehearsals at 8 and 80 layers): the own layout decides, so the prediction is the
    planner's, not the larger TP1 figure. The 80-layer run died in update_actor with a peak far
    over the planner's (phases.jsonl: ok false there): that phase is fitted from the 8-layer run
    alone, the planner's per-layer terms with its fixed terms shifted by that depth's difference."""
    tp1 = [
        _make_run(tmp_path / "tp1", n, sets, 0.0, 1.2, variants, gpus)[0]
        for n, (variants, gpus, sets) in _one_gpu_runs().items()
    ]
    own8, _ = _make_run(tmp_path / "own", 8, [], 0.5, 1.0, gpus=32)
    own80, measured80 = _make_run(tmp_path / "own", 80, [], 0.5, 1.0, gpus=32)
    summary = json.loads((own80 / "summary.json").read_text())
    summary["phases"]["update_actor"]["gpu"]["0"]["used_gib"] += 50.0  # how far the dying phase got: not a peak
    (own80 / "summary.json").write_text(json.dumps(summary))
    (own80 / "phases.jsonl").write_text(
        "".join(
            json.dumps(e) + "\n"
            for e in (
                {"event": "begin", "name": "update_critic", "step": 1},
                {"event": "end", "name": "update_critic", "step": 1, "ok": True},
                {"event": "begin", "name": "update_actor", "step": 1},
                {"event": "end", "name": "update_actor", "step": 1, "ok": False},
                {"event": "end", "name": "step", "step": 1, "ok": False},
            )
        )
    )
    _, target, _ = load_setup("70b-3d", [], [])
    gpu = parse_gpu("h100-80g")
    result, fits = predict(target, gpu, [*tp1, own8, own80])
    own = next(f for f in fits if "TP4 PP2 CP1 x 32 GPUs" in f.layout)
    assert own.depths == [8, 80] and "update_actor" in own.single and "update_actor" not in own.measured
    tp1_fit = next(v for k, v in result["per_layout_gib"].items() if "TP1 PP1" in k)
    for ph in ("update_actor", "update_critic", "values"):
        # the made-up runs are the planner's + 0.5 GiB on this layout; TP1's would say far more
        assert result["predicted_gib"][ph] == pytest.approx(result["planner_gib"][ph] + 0.5, abs=0.02), ph
        assert tp1_fit[ph] > result["predicted_gib"][ph] + 1.0, ph
    assert measured80["update_actor"] / GIB + 50 > result["predicted_gib"]["update_actor"] + 40


def test_the_one_gpu_campaign_gives_three_depths_and_a_residual(tmp_path: Path) -> None:
    """The depths gpu/campaigns/70b-tp1.txt runs (TP1 x PP1 on one GPU), made up as the planner plus
    2 GiB plus 10% per layer: one layout, three depths, so the fit has a residual (none here: made-up
    runs lie on their line), and the calibration carries to the 80-layer target as with two layouts."""
    runs = _one_gpu_runs()
    assert sorted(runs) == [1, 2, 4]
    made = [_make_run(tmp_path, n, sets, 2.0, 1.1, variants, gpus)[0] for n, (variants, gpus, sets) in runs.items()]
    _, target, _ = load_setup("70b-3d", [], [])
    gpu = parse_gpu("h100-80g")
    result, fits = predict(target, gpu, made)
    assert len(fits) == 1 and fits[0].depths == [1, 2, 4] and "TP1 PP1 CP1 x 1 GPUs, vLLM TP1" in fits[0].layout
    full = _planned_peaks(target, gpu, Constants())
    half = _planned_peaks(_with_layers(target, 40), gpu, Constants())
    for ph in ("update_actor", "update_critic", "values"):
        assert fits[0].residual_gib[ph] == pytest.approx(0.0, abs=0.01), ph
        per_layer = (full[ph] - half[ph]) / 40
        want = (full[ph] - 80 * per_layer + 2.0 * GIB + 1.1 * 80 * per_layer) / GIB
        assert result["predicted_gib"][ph] == pytest.approx(want, rel=1e-3), ph


def test_three_depths_give_an_error_band_from_the_pairs_of_depths(tmp_path: Path) -> None:
    """One GPU, depths 1, 2 and 3 as gpu/campaigns/70b-tp1-l3.txt adds them: 1 and 2 exactly the
    planner's, 3 with 0.6 GiB more. The line through 1 and 2 then predicts the planner's own
    80-layer figure, the band's low end; the lines through 3 predict more, and the full fit's
    prediction lies inside. Two depths give no band (the file says so)."""
    variants, gpus, sets = _one_gpu_runs()[2]
    made = [_make_run(tmp_path, n, sets, off, 1.0, variants, gpus)[0] for n, off in ((1, 0.0), (2, 0.0), (3, 0.6))]
    _, target, _ = load_setup("70b-3d", [], [])
    gpu = parse_gpu("h100-80g")
    result, fits = predict(target, gpu, made)
    assert fits[0].depths == [1, 2, 3]
    band = result["band_gib"]
    for ph in ("update_actor", "update_critic", "values"):
        assert fits[0].residual_gib[ph] == pytest.approx(0.2, abs=0.01), ph  # 0.6 GiB off at depth 3: 0.1, 0.2, 0.1
        lo, hi = band[ph]
        assert lo == pytest.approx(result["planner_gib"][ph], abs=0.02), ph
        assert lo < result["predicted_gib"][ph] < hi, ph
    assert result["fits_across_band"] == (band[result["peak_phase"]][1] * GIB <= gpu.visible_bytes)
    two, _ = predict(target, gpu, made[:2])
    assert two["band_gib"] is None and "fits_across_band" not in two


def test_plan_takes_the_launchers_gpus_and_layers(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan 70b-3d --variant tp1pp1 --gpus 1 --layers 2` plans the run `train` makes with the same
    flags: one GPU, two layers (the campaign header quotes these predictions)."""
    assert main(["plan", "70b-3d", "--variant", "tp1pp1", "--gpus", "1", "--layers", "2", "--gpu", "h200-141g"]) == 0
    out = capsys.readouterr().out
    assert "at 2 layer(s)" in out and "2 layers, h=8192" in out
    assert "Megatron TP1 x PP1 x CP1 x DP1 (1 node(s) x 1)" in out and "h200-141g: fits" in out
    with pytest.raises(RecipeError, match="--layers 0"):
        load_setup("70b-3d", ["tp1pp1"], [], layers=0)


def test_written_file_is_marked_predicted_and_check_bounds_refuses_it(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [str(_make_run(tmp_path / "tp2", n, TP2, 0.5, 1.1)[0]) for n in (2, 4)]
    out = tmp_path / "h100x32-ppo.yaml"
    assert main(["plan", "70b-3d", "--gpu", "h100-80g", "--from-layers", *runs, "--write", str(out)]) == 0
    assert "two depths: no residual" in capsys.readouterr().out
    assert out.read_text().startswith("# PREDICTED, not measured")
    doc = yaml.safe_load(out.read_text())
    assert doc["status"] == "predicted" and doc["schema"] == "verl-recipes/predicted/1"
    assert doc["target"]["gpus"] == 32 and doc["target"]["layers"] == 80
    assert sorted(doc["provenance"]) == sorted(runs)
    # a predicted file is never taken for measured bounds
    from verl_recipes.measure.bounds import check_bounds
    from verl_recipes.recipe.metadata import get_recipe

    recipe = get_recipe("70b-3d")
    rel = Path("expected") / "test-predicted.yaml"
    dest = recipe.dir / rel
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(out.read_text())
    try:
        with pytest.raises(RecipeError, match="status: predicted"):
            check_bounds(recipe, Path(runs[0]), str(rel))
    finally:
        dest.unlink()
        if not any(dest.parent.iterdir()):
            dest.parent.rmdir()


def test_runs_of_other_widths_are_refused(root: Path) -> None:
    """A committed 0.5B run cannot calibrate the 70B widths."""
    _, target, _ = load_setup("70b-3d", [], [])
    run = root / "recipes/7b-lora/results/h200x1-ppo-bringup-qwen2-0.5b"
    with pytest.raises(RecipeError, match="not the target's"):
        predict(target, parse_gpu("h100-80g"), [run])


def test_from_layers_needs_one_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "70b-3d", "--from-layers", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exactly one --gpu" in err[0]


def test_of_the_ranks_rehearsed_at_one_depth_the_heaviest_stands_for_the_job() -> None:
    """70b-3d's ranks 0 and 16 at full depth (the first ranks of its two pipeline stages) beside
    rank 16 at 8 layers: at 80 layers each phase's point is the heavier rank's peak (the job's
    per-GPU peak is its heaviest GPU's), never the mean of the two, and rank 0's update_actor,
    which it died in, is not a point at all."""
    from verl_recipes.plan.layers import _peaks, fit_layout
    from verl_recipes.plan.runs import read_run

    results = Path(__file__).resolve().parents[1] / "recipes" / "70b-3d" / "results"
    l8, r16, r0 = (
        read_run(results / n)
        for n in ("h200x1-ppo-l8-rank16of32", "h200x1-ppo-rank16of32", "h200x1-ppo-rank0of32-partial")
    )
    fit = fit_layout([l8, r16, r0], Constants())
    p16, p0 = _peaks(r16), _peaks(r0)
    assert "update_actor" not in p0 and p0["update_critic"] < p16["update_critic"] - 0.5 * GIB
    for ph, pts in fit.points.items():
        at80 = [y for n, y in pts if n == 80]
        assert at80 == [max(p16[ph], p0.get(ph, 0))], ph


def test_a_rank_measured_on_the_target_card_is_a_floor_for_its_phases() -> None:
    """70b-3d's rank 0 at full depth on an H100 80GB, the target card: without it the line through
    the H200 ranks carries `outside` (vLLM's start on a 140 GiB card, Megatron's build of a whole
    model on an 80 GB one) about 15 GiB below what the H100 showed; with it no phase is predicted
    below that rank's peak plus what its rehearsal lacks (the job's planned terms less the rank's)."""
    from verl_recipes.plan.layers import _peaks
    from verl_recipes.plan.runs import read_run

    results = Path(__file__).resolve().parents[1] / "recipes" / "70b-3d" / "results"
    h200 = [results / n for n in ("h200x1-ppo-l8-rank16of32", "h200x1-ppo-rank16of32")]
    h100_run = results / "h100x1-ppo-rank0of32-partial"
    h100 = parse_gpu("h100-80g")
    _, target, _ = load_setup("70b-3d", [], [])
    without, _ = predict(target, h100, h200)
    with_it, _ = predict(target, h100, [*h200, h100_run])
    got = {ph: v / GIB for ph, v in _peaks(read_run(h100_run)).items()}
    assert without["predicted_gib"]["outside"] < got["outside"] - 10
    for ph, v in with_it["predicted_gib"].items():
        assert v >= round(got.get(ph, 0.0), 2) - 0.01, ph
        assert v >= without["predicted_gib"][ph] - 0.01, ph  # a floor never lowers a phase
    # an A100 80GB (80.0 GiB) is a card of the same size; an H200 (140.4) is not
    a100, _ = predict(target, parse_gpu("a100-80g"), [*h200, h100_run])
    assert a100["predicted_gib"]["outside"] >= round(got["outside"], 2) - 0.01
    h200_with, _ = predict(target, parse_gpu("h200-141g"), [*h200, h100_run])
    h200_without, _ = predict(target, parse_gpu("h200-141g"), h200)
    assert h200_with["predicted_gib"]["outside"] == h200_without["predicted_gib"]["outside"]


def test_a_rank_of_the_targets_layout_at_its_depth_stands_alone() -> None:
    """70b-3d's tp8pp1 rank 0, measured at full depth on an H100 80GB, is a prediction for the
    32-GPU tp8pp1 job on its own: nothing is carried across depths, so no second depth is needed.
    Each phase is the rank's peak plus the job's planned terms its rehearsal lacks. A single depth
    of another layout, or of the target's layout at fewer layers, still needs a second depth."""
    from verl_recipes.plan.layers import _peaks, _planned_peaks
    from verl_recipes.plan.runs import read_run, run_setup

    results = Path(__file__).resolve().parents[1] / "recipes" / "70b-3d" / "results"
    rank = results / "h100x1-ppo-tp8pp1-rank0of32"
    h100 = parse_gpu("h100-80g")
    _, target, _ = load_setup("70b-3d", ["tp8pp1"], [])
    result, fits = predict(target, h100, [rank])
    assert len(fits) == 1 and fits[0].depths == [80] and not fits[0].measured
    run = read_run(rank)
    got = _peaks(run)
    card = max(run.gpu_totals.values())
    as_run = _planned_peaks(run_setup(run), replace(h100, visible_bytes=card), Constants())
    job = _planned_peaks(target, h100, Constants())
    for ph, v in result["predicted_gib"].items():
        assert v == pytest.approx((got[ph] + job[ph] - as_run[ph]) / GIB, abs=0.02), ph
        assert v >= got[ph] / GIB - 0.01, ph  # the job holds at least what its rank held
    assert result["band_gib"] is None
    # the default layout (TP4 x PP2) is another layout: this rank alone is no fit for it
    _, default, _ = load_setup("70b-3d", [], [])
    with pytest.raises(RecipeError, match="need two different depths"):
        predict(default, h100, [rank])
    # the target's own layout, truncated: one depth is not enough
    l8 = results / "h200x1-ppo-l8-rank16of32"
    with pytest.raises(RecipeError, match="need two different depths"):
        predict(default, h100, [l8])


def test_megatron_builds_a_model_whole_before_verl_offloads_it() -> None:
    """70b-3d's training worker reached 69.3-69.5 GiB while loading, once per model, in every
    full-depth rank (before vLLM starts; on an H100 that is the loading phase's peak): Megatron
    builds weights, main-grad buffer and optimizer states before verl offloads them. The planner's
    `outside` holds one model's build on a card where vLLM's budget is smaller, and the measured
    build is within 10% of it."""
    from verl_recipes.plan.runs import read_run, run_setup
    from verl_recipes.predict.phases import plan_gpu

    run = read_run(Path(__file__).resolve().parents[1] / "recipes/70b-3d/results/h100x1-ppo-rank0of32-partial")
    s, h100 = run_setup(run), parse_gpu("h100-80g")
    loaded = next(p for p in plan_gpu(s, h100, Constants()).phases if p.phase == "outside")
    names = [t.name for t in loaded.terms if t.bytes]
    assert any("main-grad buffer" in n for n in names) and any("optimizer" in n for n in names)
    assert loaded.total == pytest.approx(max(run.phases["outside"].values()), rel=0.10)
