"""verl_recipes.plan.evidence: what stands behind a multi-GPU figure (full run, rehearsed rank,
nothing), read from the committed bounds files, and how `plan`, the tables and the reports say it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from verl_recipes.cli import main
from verl_recipes.docs import gpus_table, results_table
from verl_recipes.layout import RankSpec
from verl_recipes.measure.report import render_markdown
from verl_recipes.plan.evidence import behind, behind_line
from verl_recipes.recipe.metadata import discover, get_recipe
from verl_recipes.rundir import read_provenance

ROOT = Path(__file__).resolve().parents[1]


def _rehearsed_bounds() -> list[tuple[str, str, dict]]:
    out = []
    for r in discover().values():
        for name in r.expected:
            doc = yaml.safe_load((r.dir / name).read_text())
            if doc.get("rank_rehearsal"):
                out.append((r.id, name, doc))
    return out


def test_a_bounds_file_of_rehearsed_runs_says_so_and_matches_its_runs() -> None:
    found = _rehearsed_bounds()
    assert found, "no committed rank rehearsal"
    for rid, name, doc in found:
        for run in doc["source_runs"]:
            rank = read_provenance(get_recipe(rid).dir / run).rank_rehearsal
            assert rank == RankSpec.from_record(doc["rank_rehearsal"]), (name, run)


def test_plan_names_a_rehearsed_rank_behind_a_multi_gpu_job_and_nothing_where_none_ran(
    capsys: pytest.CaptureFixture[str],
) -> None:
    recipe = get_recipe("13b-fsdp")
    words = [e.words for e in behind(recipe, [], 2)]
    assert any(w.startswith("rank rehearsal (0 of 2): expected/") for w in words), words
    tp2 = [e.words for e in behind(recipe, ["tp2"], 2)]
    assert tp2 and all("tp2-rank0of2" in w for w in tp2), tp2
    # the same variants at another world: nothing ran there
    assert behind(recipe, [], 4) == []
    # 70b-3d's 32 GPUs: rank 16 rehearsed at full depth and at 8 of the model's 80 layers, rank 0
    # at full depth, and the line says the depth where it is not the model's; tp8pp1's rank 0 at
    # full depth; tp1pp1 ran at one GPU only, so at 32 it is a prediction only
    assert behind_line(get_recipe("70b-3d"), [], 32) == (
        "behind it: rank rehearsal (16 of 32): expected/h200x1-ppo-rank16of32.yaml; "
        "rank rehearsal (16 of 32) at 8 layers: expected/h200x1-ppo-l8-rank16of32.yaml; "
        "rank rehearsal (0 of 32): expected/h100x1-ppo-rank0of32.yaml"
    )
    assert behind_line(get_recipe("70b-3d"), ["tp8pp1"], 32) == (
        "behind it: rank rehearsal (0 of 32): expected/h100x1-ppo-tp8pp1-rank0of32.yaml"
    )
    assert "a prediction only" in behind_line(get_recipe("70b-3d"), ["tp1pp1"], 32)
    # tp2 has rehearsed ranks only: they are named, and a rehearsed rank's rate (one rank's
    # compute) never prices the job
    assert main(["plan", "13b-fsdp", "--variant", "tp2", "--gpu", "h200-141g"]) == 0
    out = capsys.readouterr().out
    assert "behind it: rank rehearsal (0 of 2)" in out
    assert "per million tokens" not in out
    # the default ran as the two-GPU job too: the full run comes first and prices it
    assert main(["plan", "13b-fsdp", "--gpu", "h200-141g"]) == 0
    out = capsys.readouterr().out
    assert "behind it: full run: expected/h200x2-ppo.yaml; rank rehearsal (0 of 2)" in out
    assert "per million tokens" in out and "(measured run h200x2-ppo:" in out


def test_the_deepspeed_side_stands_behind_none_of_verls_jobs() -> None:
    """The bounds of verl-vs-deepspeed's DeepSpeed side (rank 0 of 4 and of 2) are another loop's
    memory: `plan` never names them behind verl's job, and the tables say whose they are."""
    recipe = get_recipe("verl-vs-deepspeed")
    assert any("deepspeed" in name for name in recipe.expected)
    for world in (2, 4):  # verl's own rehearsed ranks stand behind each, never the DeepSpeed side's
        words = [e.words for e in behind(recipe, [], world)]
        assert words[0] == f"rank rehearsal (0 of {world}): expected/h200x1-ppo-rank0of{world}.yaml", words
        assert all(w.startswith(f"rank rehearsal (0 of {world})") and "deepspeed" not in w for w in words), words
    rows = [x for x in results_table().splitlines() if "-deepspeed.yaml)" in x]
    assert len(rows) == 2 and all("[deepspeed, not verl; rank rehearsal (" in x for x in rows)


def test_the_tables_show_a_rehearsed_ranks_memory_and_never_its_speed() -> None:
    table = results_table()
    for rid, name, _doc in _rehearsed_bounds():
        (row,) = [x for x in table.splitlines() if f"/{rid}/expected/{Path(name).name})" in x]
        cells = [c.strip() for c in row.split("|")]
        assert "rank rehearsal (" in cells[2]
        assert cells[4] != "-" and cells[5:9] == ["-"] * 4, row  # peak yes; tokens/s, step, cost no
    assert "rank 0 of 2 rehearsed" in gpus_table()


def test_a_rehearsed_runs_report_says_what_it_cannot_measure() -> None:
    summary = {
        "run_dir": "r",
        "cmd": ["x"],
        "exit_code": 0,
        "samples": 1,
        "interval_s": 0.1,
        "wall_s": 1.0,
        "skipped_lines": 0,
        "gpus": [],
        "nvml_error": "none",
        "phases": {},
        "steps": [],
        "peak": {"gpu": {}, "host": {}},
    }
    text = render_markdown(summary, None, RankSpec(1, 4))
    assert "rank rehearsal (1 of 4)" in text and "NCCL buffers" in text and "not the job's speed" in text
    assert "rank rehearsal" not in render_markdown(summary, None, None)
    for rid, _, doc in _rehearsed_bounds():
        for run in doc["source_runs"]:
            rank = doc["rank_rehearsal"]
            report = (get_recipe(rid).dir / run / "report.md").read_text()
            assert f"rank rehearsal ({rank['rank']} of {rank['world']})" in report, run
    json.dumps(summary)


def test_a_run_with_set_overrides_says_them_wherever_it_stands_behind_a_job() -> None:
    """Runs made with `--set` overrides (EOS ignored, so every response has the same length) did
    other work than the job as written: `plan`'s "behind it", the fit table's link and the measured
    table name each override, so two rank rehearsals of one job never read as the same one."""
    recipe = get_recipe("13b-fsdp")
    found = {e.path.name: e for e in behind(recipe, [], 2)}
    plain, fixed = found["h200x1-ppo-rank0of2.yaml"], found["h200x1-ppo-rank0of2-fixedlen.yaml"]
    assert plain.sets == () and fixed.sets == ("actor_rollout_ref.rollout.ignore_eos=True",)
    assert "--set actor_rollout_ref.rollout.ignore_eos=True" in fixed.words
    assert "--set" not in plain.words
    assert "rank 0 of 2 rehearsed, --set actor_rollout_ref.rollout.ignore_eos=True](recipes/13b-fsdp/" in gpus_table()
    rows = [line for line in results_table().splitlines() if "h200x1-ppo-rank0of2-fixedlen.yaml" in line]
    assert len(rows) == 1 and "--set actor_rollout_ref.rollout.ignore_eos=True; rank rehearsal (0 of 2)" in rows[0]
