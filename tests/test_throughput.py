"""verl_recipes.measure.throughput: the recipe's runs in NeMo RL's columns beside its published
figures, from comparisons/throughput.yaml; a run's cells are medians of its own steps 2+."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import yaml
from verl_recipes.measure.throughput import INDEX, NOT_MEASURED, run_row, table

RUN = Path("recipes/7b-lora/results/h200x1-grpo-8x8")


def test_a_runs_cells_are_its_own_medians_of_steps_2_on(root: Path) -> None:
    rows = [json.loads(x) for x in (root / RUN / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steady = [r["metrics"] for r in rows if r["step"] >= 2]
    f = run_row(root / RUN)
    assert f["tokens_per_s_per_gpu"] == statistics.median(m["perf/throughput"] for m in steady)
    assert f["avg_len"] == statistics.median(m["response_length/mean"] for m in steady)
    assert f["batch"] == "8 x 8 = 64 answers" and f["gpus"] == "1 x H200"


def test_the_table_carries_nemo_rls_figure_with_its_source_and_a_run_once_named(root: Path, tmp_path: Path) -> None:
    text = table("", root)
    assert "| 1,581 | 92.8 | [published](https://docs.nvidia.com/nemo/rl/0.5.0/" in text
    assert text.count(NOT_MEASURED) == 2  # no prod run is committed yet: no number stands in for one
    # a copy of the tree whose index names a committed run: its row carries the run's figures
    (tmp_path / INDEX).parent.mkdir(parents=True)
    shutil.copytree(root / RUN, tmp_path / "recipes/7b-lora/results" / RUN.name)
    doc = yaml.safe_load((root / INDEX).read_text())
    doc["runs"][0]["run"] = RUN.name
    (tmp_path / INDEX).write_text(yaml.safe_dump(doc))
    named = table("", tmp_path)
    assert named.count(NOT_MEASURED) == 1
    f = run_row(root / RUN)
    cells = f"| 1 x H200 | 8 x 8 = 64 answers | {f['avg_len']:,.0f} (answers) | {f['tokens_per_s_per_gpu']:,.0f} |"
    assert cells in named


def test_every_prose_mention_of_nemo_rls_rate_is_a_published_figure_of_the_index(root: Path) -> None:
    """A README sentence that quotes NeMo RL's tokens/s per GPU quotes a figure of
    comparisons/throughput.yaml, the one owner of the published figures (a stale 1,562 once stood
    in the 7b-lora summary beside the table's 1,581)."""
    import re

    published = {p["tokens_per_s_per_gpu"] for p in yaml.safe_load((root / INDEX).read_text())["published"]}
    said = re.compile(r"NeMo[- ]RL(?: v[\d.]+)? publishes ([\d,]+) tokens/s per GPU")
    found = []
    for readme in [root / "README.md", *sorted(root.glob("recipes/*/README.md"))]:
        for m in said.finditer(" ".join(readme.read_text().split())):
            found.append((readme.relative_to(root), int(m.group(1).replace(",", ""))))
    assert found, "no prose mention of NeMo RL's rate: the check reads nothing"
    assert [f for f in found if f[1] not in published] == []
