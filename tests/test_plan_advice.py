"""`plan` as a gate a script can trust, and one story per recipe (verl_recipes.plan.advice).

Real compositions against verl's Hydra config and the committed calibrated prediction. The gate runs
the CLI as a separate process, as a script calls it, and checks its exit status; the rest call the
same `main` in this process, where verl is imported and composed once already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from verl_recipes.cli import main
from verl_recipes.plan.advice import calibrated, closing_line, whole_fix
from verl_recipes.plan.cli import judgement, load_setup
from verl_recipes.predict.gpus import parse_gpu
from verl_recipes.recipe.metadata import discover, get_recipe
from verl_recipes.recipe.run_config import Composition

ROOT = Path(__file__).resolve().parents[1]


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "common"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "verl_recipes.cli", "plan", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _plan_here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`plan` through the same entry point, in this process: its exit status and what it printed."""
    capsys.readouterr()
    code = main(["plan", *args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["verl-recipes", "plan", *args], code, out.out, out.err)


def test_plan_exits_1_when_the_job_does_not_fit_the_gpu_named() -> None:
    # two independent processes at once: each spends seconds importing verl and composing
    with ThreadPoolExecutor(2) as pool:
        fits = pool.submit(_plan, "7b-lora", "--variant", "24gib", "--gpu", "a10g-24g")
        r = _plan("13b-fsdp", "--gpu", "a100-40g")
    assert fits.result().returncode == 0, fits.result().stderr
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("a100-40g: does not fit"))
    # the variant the recipe ships for this card comes first, with its peak and its host RAM
    assert lines[i + 1].startswith("  a recipe variant fits: --variant 40gib (peak ")
    assert "host RAM about" in lines[i + 1]
    knobs = [ln for ln in lines[i + 1 :] if ln.startswith(("  best single knob", "  to fit "))]
    assert knobs and all("host RAM about" in ln for ln in knobs), knobs


def test_a_calibrated_prediction_decides_the_verdict_beside_the_planners_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """70b-3d on 32 x H100 80GB (79.65 GiB visible): the planner says 78.8 GiB in update_actor,
    the committed prediction (ranks 16 and 0 rehearsed at this very layout decide the phases they
    measured, rank 0 on an H100) 79.2 GiB there; the calibrated figure is shown beside the
    planner's and decides. It is under the card by less than what moves it, so the verdict is
    tight (exit 3), with the recipe's variant that buys the margin named."""
    r = _plan_here(capsys, "70b-3d", "--gpu", "h100-80g")
    assert r.returncode == 3, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "calibrated prediction" in ln)
    assert "expected/h100x32-ppo.yaml" in line and "79.2 of 79.6 GiB" in line and "78.8 GiB" in line
    assert "h100-80g: does not fit" not in r.stdout
    assert "does NOT fit" not in r.stdout  # one word set: fits, tight, does not fit (predict.margin)
    lines = r.stdout.splitlines()
    i = lines.index(next(ln for ln in lines if ln.startswith("h100-80g: tight: update_actor 79.2 of 79.6 GiB")))
    parts = [ln.split(":")[0].strip() for ln in lines[i + 1 : i + 5]]
    assert parts == [
        "run-to-run spread",
        "allocator fragmentation",
        "process group share",
        "what a fake group cannot allocate",
    ]
    assert lines[i + 5].startswith("  to buy the margin: --variant 80gib (peak update_actor ")
    # the same job truncated in depth is another job: the prediction does not apply
    recipe = get_recipe("70b-3d")
    _, s, _ = load_setup("70b-3d", [], [], layers=2)
    assert calibrated(recipe, [], s, parse_gpu("h100-80g")) is None
    # and so is another parallel layout set on the command line
    pp4 = [f"{k}.megatron.pipeline_model_parallel_size=4" for k in ("actor_rollout_ref.actor", "critic")]
    _, s4, _ = load_setup("70b-3d", [], pp4)
    assert calibrated(recipe, [], s4, parse_gpu("h100-80g")) is None


@pytest.mark.parametrize("rid", sorted(discover()))
def test_each_recipe_fits_the_hardware_its_metadata_names(rid: str) -> None:
    """The default, or the variant `gpus.variant` names, fits a GPU of `gpus.per_gpu_gib` on
    `gpus.count` GPUs: the metadata and the plan tell one story."""
    r = get_recipe(rid)
    variants = [r.gpus.variant] if r.gpus.variant else []
    label, s, _ = load_setup(rid, variants, [])
    gpu = parse_gpu(f"{r.gpus.per_gpu_gib:g}GiB")
    j = judgement(label, s, r, Composition(tuple(variants)), [gpu])
    assert s.world == r.gpus.count
    word = j.margins[gpu.id].word
    assert word != "does not fit", (
        f"{rid} {variants or 'default'} does not fit {r.gpus.per_gpu_gib} GiB; fix recipe.yaml"
    )
    # a job under its card by less than what moves it says so where it names its hardware
    assert word == "fits" or "tight" in r.gpus.target, (
        f"{rid}: tight on {r.gpus.per_gpu_gib} GiB; say so in recipe.yaml"
    )


def test_the_whole_fix_and_the_closing_line_agree_with_the_plan() -> None:
    recipe = get_recipe("13b-fsdp")
    gpu = parse_gpu("a100-40g")
    _, s, _ = load_setup("13b-fsdp", [], [])
    fix = whole_fix(s, gpu)
    assert fix.count("--set ") >= 2 and "host RAM about" in fix  # every knob at once, not one
    line = closing_line(recipe, Composition(), s, gpu, "this host has 0 NVIDIA GPU(s)")
    assert "does not fit a100-40g" in line and "--variant 40gib does" in line and "run the same command" not in line
    _, s24, _ = load_setup("7b-lora", ["24gib"], [])
    ok = closing_line(get_recipe("7b-lora"), Composition(("24gib",)), s24, parse_gpu("a10g-24g"), "no GPU here")
    assert "fits a10g-24g" in ok and "run the same command on a GPU host" in ok
    # 70b-3d's seed layout on an H100 80GB is tight: the line says so and names what buys the margin
    _, s70, _ = load_setup("70b-3d", [], [])
    tight = closing_line(get_recipe("70b-3d"), Composition(), s70, parse_gpu("h100-80g"), "no GPU here")
    assert "is tight on h100-80g" in tight and "--variant 80gib buys it" in tight, tight


def test_a_committed_run_of_the_job_on_that_gpu_is_shown_and_decides(capsys: pytest.CaptureFixture[str]) -> None:
    r = _plan_here(capsys, "7b-lora", "--gpu", "h200-141g")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("h200-141g: measured run"))
    assert line.startswith("h200-141g: measured run (recipes/7b-lora/results/") and "on NVIDIA H200" in line
    assert "the planner alone says" in line


def test_a_tight_jobs_margin_is_bought_first_with_a_knob_that_keeps_what_is_trained(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """verl's run_qwen2-7b_rm.sh on an H100 80GB is tight (79.2 of 79.6 GiB); LoRA would lower the
    peak most, but a full fine-tune turned into a LoRA one is another job: the micro-batches that
    buy the margin come first, and LoRA is never the knob named while such a one exists."""
    r = _plan_here(capsys, "--verl-example", "ppo-qwen2-7b-rm", "--gpu", "h100-80g")
    assert r.returncode == 3, r.stdout[-2000:]
    buy = [ln for ln in r.stdout.splitlines() if ln.startswith("  to buy the margin: ")]
    assert buy and buy[0].startswith("  to buy the margin: smaller micro-batches: "), buy
    assert not any("LoRA" in ln for ln in buy), buy


def test_knobs_applied_twice_read_as_one_change_with_each_key_once(capsys: pytest.CaptureFixture[str]) -> None:
    """verl's run_qwen2-7b.sh on an H100 fits after halving its micro-batches twice: the line a
    user copies names the knob once and sets each key once, at the last value (a key given twice
    on a command line is the later one, which a reader should not have to know)."""
    r = _plan_here(capsys, "--verl-example", "grpo-qwen2-7b", "--gpu", "h100-80g")
    assert r.returncode == 1
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("  to fit on 8 GPU(s): "))
    keys = [x.split("=")[0] for x in line.split(" --set ")[1:]]
    assert len(keys) == len(set(keys)), line
    assert "smaller micro-batches (x2): " in line and "ppo_micro_batch_size_per_gpu=10 " in line, line
