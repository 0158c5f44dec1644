"""compare-runs on the committed H200 runs: ratios follow from each run's own metrics."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from verl_recipes.measure.compare import compare, render, run_figures

R = Path("recipes/7b-lora/results")


def _steady_throughput(run: Path) -> float:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return statistics.median(r["metrics"]["perf/throughput"] for r in rows if r["step"] >= 2)


def test_recipe_grpo_against_verl_example_settings(root: Path) -> None:
    base, ours = root / R / "h200x1-grpo-verl-example", root / R / "h200x1-grpo"
    doc = compare(base, [ours])
    b, o = doc["rows"]
    assert b["throughput_ratio"] == pytest.approx(1.0) and b["peak_ratio"] == pytest.approx(1.0)
    assert o["throughput_ratio"] == pytest.approx(_steady_throughput(ours) / _steady_throughput(base))
    # a fair comparison: the same tokens per step (batch 8 x 512 response + prompts)
    assert abs(o["tokens_per_step"] - b["tokens_per_step"]) / b["tokens_per_step"] < 0.02
    assert "(baseline)" in render(doc)


def test_a_single_step_run_is_refused(root: Path, tmp_path: Path) -> None:
    import shutil

    from verl_recipes import RecipeError

    run = tmp_path / "one-step"
    shutil.copytree(root / R / "h200x1-grpo", run)
    first = (run / "metrics.jsonl").read_text().splitlines()[0]
    (run / "metrics.jsonl").write_text(first + "\n")
    with pytest.raises(RecipeError, match="fewer than 2 steps"):
        run_figures(run)
