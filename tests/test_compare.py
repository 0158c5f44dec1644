"""compare-runs on the committed H200 runs: ratios follow from each run's own metrics."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from verl_recipes.measure.compare import compare, render, run_figures

R = Path("recipes/7b-lora/results")


def _steady(run: Path, key: str = "perf/throughput") -> float:
    """The median of `key` over steps 2+, read from the run's metrics.jsonl here, not by compare."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return statistics.median(r["metrics"][key] for r in rows if r["step"] >= 2)


def test_recipe_grpo_against_verl_example_settings(root: Path) -> None:
    base, ours = root / R / "h200x1-grpo-verl-example", root / R / "h200x1-grpo"
    doc = compare(base, [ours])
    b, o = doc["rows"]
    assert b["throughput_ratio"] == pytest.approx(1.0) and b["peak_ratio"] == pytest.approx(1.0)
    assert o["throughput_ratio"] == pytest.approx(_steady(ours) / _steady(base))
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


C = Path("recipes/7b-lora/comparisons")


def test_each_run_meets_the_bench_of_its_own_work(root: Path) -> None:
    """verl's gen over vLLM alone: a PPO run is set beside the PPO bench, never the GRPO one, and a
    run with a fix turned off (the same work for vLLM) beside the same bench as the default."""
    benches = [root / C / "rollout-bench-h200x1-ppo.json", root / C / "rollout-bench-h200x1-grpo-8x8.json"]
    runs = [root / R / n for n in ("h200x1-ppo-verl-poll", "h200x1-ppo-5", "h200x1-grpo-8x8-2")]
    doc = compare(runs[0], runs[1:], benches)
    alone = {p.name: json.loads(p.read_text())["median_s"] for p in benches}
    by_run = {r["run"]: r for r in doc["rows"]}
    for name, bench in [
        ("h200x1-ppo-verl-poll", "rollout-bench-h200x1-ppo.json"),
        ("h200x1-ppo-5", "rollout-bench-h200x1-ppo.json"),
        ("h200x1-grpo-8x8-2", "rollout-bench-h200x1-grpo-8x8.json"),
    ]:
        row = by_run[name]
        assert row["bench"] == bench
        assert row["gen_ratio"] == pytest.approx(_steady(root / R / name, "timing_s/gen") / alone[bench])
    assert "| gen / vLLM alone |" in render(doc).splitlines()[0]
    # without records the table keeps its columns
    assert "vLLM alone" not in render(compare(runs[0], runs[1:]))


def test_a_training_side_override_keeps_the_bench_a_rollout_override_does_not(root: Path) -> None:
    """verl's bypass mode (an `algorithm.` override) gives vLLM the same work: its run meets the
    GRPO 8x8 bench; an override of the rollout's own settings is other work and meets none."""
    from verl_recipes.measure.compare import rollout_work

    bench = root / C / "rollout-bench-h200x1-grpo-8x8.json"
    doc = compare(root / R / "h200x1-grpo-8x8-3", [root / R / "h200x1-grpo-8x8-bypass"], [bench])
    assert [r["bench"] for r in doc["rows"]] == [bench.name, bench.name]
    v = ("grpo", "8x8")
    assert rollout_work("7b-lora", v, ["algorithm.rollout_correction.bypass_mode=true"]) == ("7b-lora", v, ())
    assert rollout_work("7b-lora", v, ["+actor_rollout_ref.actor.x=1"]) == ("7b-lora", v, ())
    other = ["actor_rollout_ref.rollout.n=4"]
    assert rollout_work("7b-lora", v, other) == ("7b-lora", v, tuple(other))


def test_a_run_without_a_bench_of_its_work_shows_none(root: Path) -> None:
    doc = compare(root / R / "h200x1-grpo-8x8-2", [], [root / C / "rollout-bench-h200x1-ppo.json"])
    assert doc["rows"][0]["bench"] is None and doc["rows"][0]["gen_ratio"] is None


def test_two_records_of_one_work_or_a_stray_file_are_refused(root: Path, tmp_path: Path) -> None:
    from verl_recipes import RecipeError

    ppo = root / C / "rollout-bench-h200x1-ppo.json"
    again = tmp_path / "again.json"
    again.write_text(ppo.read_text())
    with pytest.raises(RecipeError, match="measure the same work; give one"):
        compare(root / R / "h200x1-ppo-5", [], [ppo, again])
    with pytest.raises(RecipeError, match="not a rollout-bench record"):
        compare(root / R / "h200x1-ppo-5", [], [root / R / "h200x1-ppo-5" / "summary.json"])


def test_the_committed_rollout_comparison_is_what_its_runs_give(root: Path) -> None:
    """comparisons/rollout-vs-vllm.md carries the tables its regenerate line prints."""
    md = (root / C / "rollout-vs-vllm.md").read_text()
    benches = [root / C / "rollout-bench-h200x1-ppo.json", root / C / "rollout-bench-h200x1-grpo-8x8.json"]
    for base, *runs in [
        ("h200x1-ppo-verl-poll", "h200x1-ppo-5"),
        ("h200x1-grpo-8x8-verl-poll", "h200x1-grpo-8x8-2"),
        ("h200x1-grpo-8x8-verl-poll-2", "h200x1-grpo-8x8-3", "h200x1-grpo-8x8-bypass"),
    ]:
        table = render(compare(root / R / base, [root / R / r for r in runs], benches))
        assert table in md, f"rollout-vs-vllm.md: the {base} table is stale; regenerate it"


def test_a_bench_of_other_engine_settings_stands_beside_the_default_bench(root: Path) -> None:
    """vLLM alone with async scheduling (a rollout-side `--set`) is other work than the PPO bench:
    both records are accepted together, and the default PPO run meets the default bench only."""
    ppo = root / C / "rollout-bench-h200x1-ppo.json"
    async_ = root / C / "rollout-bench-h200x1-ppo-async.json"
    want = ["+actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling=true"]
    assert json.loads(async_.read_text())["sets"] == want
    doc = compare(root / R / "h200x1-ppo-5", [], [ppo, async_])
    assert doc["rows"][0]["bench"] == ppo.name


def test_the_deepspeed_side_of_a_rank_says_what_it_is(root: Path) -> None:
    """verl's rehearsed rank 0 of 4 against the DeepSpeed loop's same rank: compare-runs reads the
    DeepSpeed run's derived metrics like verl's, and names its loop and the rehearsal on its row."""
    vvd = root / "recipes/verl-vs-deepspeed/results"
    doc = compare(vvd / "h200x1-ppo-rank0of4", [vvd / "h200x1-ppo-rank0of4-deepspeed"])
    verl, ds = doc["rows"]
    assert (verl["backend"], ds["backend"]) == (None, "deepspeed") and verl["rank"] == ds["rank"] == [0, 4]
    assert ds["throughput_tok_s"] == pytest.approx(_steady(vvd / "h200x1-ppo-rank0of4-deepspeed"))
    assert ds["tokens_per_step"] == 32 * 1024  # the rank's 32 prompts of 512 + 512 tokens
    row = next(x for x in render(doc).splitlines() if x.startswith("| h200x1-ppo-rank0of4-deepspeed"))
    assert "(rank rehearsal, 0 of 4)" in row and "| deepspeed, not verl |" in row


def test_vllm_alone_is_set_beside_its_decode_roofline_on_its_card(root: Path) -> None:
    """The PPO bench on an H200: 8 answers at once, each decode step reads the bf16 weights
    (6,738,415,616 x 2 B) and 8 sequences' KV (32 x 2 x 4,096 x 2 B a token) at the mean prompt
    plus half the mean answer, over 4.8 TB/s; vLLM alone's generated tokens/s over its median call."""
    from verl_recipes.measure.compare import bench_figures

    path = root / C / "rollout-bench-h200x1-ppo.json"
    rec = json.loads(path.read_text())
    b = bench_figures(path)
    answer = statistics.median(rec["generated_tokens"]) / 8
    context = statistics.mean(rec["prompt_tokens"]) + answer / 2
    step_s = (6_738_415_616 * 2 + 8 * context * 32 * 2 * 4096 * 2) / 4.8e12
    assert b["roofline_tok_s"] == pytest.approx(8 / step_s, rel=1e-9)
    assert b["vllm_alone_tok_s"] == pytest.approx(statistics.median(rec["generated_tokens"]) / rec["median_s"])
    assert 0.3 < b["vllm_alone_tok_s"] / b["roofline_tok_s"] < 1.0  # below the floor's rate, as it must be
