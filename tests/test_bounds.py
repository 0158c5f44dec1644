"""`check-bounds` (verl_recipes.measure.bounds): measured runs against expected bounds, on the committed H200 runs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from verl_recipes import RecipeError
from verl_recipes.cli import main
from verl_recipes.measure.bounds import check, measured, write_bounds
from verl_recipes.recipe.metadata import get_recipe
from verl_recipes.rundir import read_provenance
from verl_recipes.rundir import read_summary as load_summary

RUN = Path("recipes/7b-lora/results/h200x1-ppo")  # verl's merged sync: expected/h200x1-ppo-verl-sync.yaml
DEFAULT = Path("recipes/7b-lora/results/h200x1-ppo-5")  # the recipe's default: expected/h200x1-ppo.yaml
# the first run on vLLM's empty compile cache, at micro-batches of 2: expected/h200x1-ppo-micro2.yaml
FAST = Path("recipes/7b-lora/results/h200x1-ppo-fast")


def test_committed_run_passes_its_bounds(root: Path) -> None:
    assert main(["check-bounds", "7b-lora"]) == 0


def test_check_bounds_names_the_bounds_files_a_recipe_has(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`verl-recipes check-bounds` refuses a bounds file the recipe lacks in one line naming those it has."""
    assert main(["check-bounds", "7b-lora", "--expected", "expected/no-such.yaml"]) == 2
    assert "no such bounds file; recipe 7b-lora has: expected/" in capsys.readouterr().err


def _edited(root: Path, tmp_path: Path, src: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of a committed run folder whose summary.json `edit` has changed."""
    run = tmp_path / "doctored"
    shutil.copytree(root / src, run)
    summary = json.loads((run / "summary.json").read_text())
    edit(summary)
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def _doctored(root: Path, tmp_path: Path, phase: str, factor: float, src: Path = RUN) -> Path:
    def edit(summary: dict) -> None:
        summary["phases"][phase]["gpu"]["0"]["used_gib"] *= factor

    return _edited(root, tmp_path, src, edit)


def test_doctored_run_fails_naming_phase_and_gpu(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _doctored(root, tmp_path, "update_actor", 1.10)
    assert main(["check-bounds", "7b-lora", "--run", str(run)]) == 1
    out = capsys.readouterr().out
    assert "phase update_actor GPU 0" in out and "> upper bound" in out


def test_a_run_far_under_the_bound_fails_too(root: Path, tmp_path: Path) -> None:
    run = _doctored(root, tmp_path, "gen", 0.5, DEFAULT)
    doc = yaml.safe_load((root / "recipes/7b-lora/expected/h200x1-ppo.yaml").read_text())
    errors = check(load_summary(run), doc, "x")
    assert any("phase gen GPU 0" in e and "< lower bound" in e for e in errors)


def test_bounds_are_measured_times_margins(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.yaml"
    doc = write_bounds([root / RUN], out, get_recipe("7b-lora"))
    m = measured(load_summary(root / RUN))
    lo, hi = doc["bounds"]["memory_gib"]["update_actor"]["0"]
    assert hi == pytest.approx(m["memory_gib"]["update_actor"]["0"] * 1.05, abs=1e-3)
    assert lo == pytest.approx(m["memory_gib"]["update_actor"]["0"] * 0.8, abs=1e-3)
    assert doc["provenance"]["results/h200x1-ppo"]["gpu"]["gpus"][0]["name"] == "NVIDIA H200"
    assert m["steps"] >= 3


RUN2 = Path("recipes/7b-lora/results/h200x1-ppo-2")  # the same config, measured on GPU 1 of an x2 host


def test_bounds_from_two_runs_span_both(root: Path, tmp_path: Path) -> None:
    """update_weights' short KV-resume peak was sampled in one run (70.9 GiB) and not the other (44.6)."""
    doc = write_bounds([root / RUN, root / RUN2], tmp_path / "b.yaml", get_recipe("7b-lora"))
    a, b = measured(load_summary(root / RUN)), measured(load_summary(root / RUN2))
    lo, hi = doc["bounds"]["memory_gib"]["update_weights"]["0"]
    uw = [a["memory_gib"]["update_weights"]["0"], b["memory_gib"]["update_weights"]["0"]]
    assert lo == pytest.approx(min(uw) * 0.8, abs=1e-3) and hi == pytest.approx(max(uw) * 1.05, abs=1e-3)
    assert max(uw) / min(uw) > 1.3  # the two runs really differ there
    for run in (RUN, RUN2):
        assert check(load_summary(root / run), doc, "x") == []


def test_gpus_are_compared_by_position_not_nvml_index(root: Path) -> None:
    """RUN2 ran on NVML GPU 1 (CUDA_VISIBLE_DEVICES=1); its peaks are the run's GPU 0."""
    summary = load_summary(root / RUN2)
    assert [g["index"] for g in summary["gpus"]] == [1]
    assert set(summary["phases"]["gen"]["gpu"]) == {"1"}
    assert set(measured(summary)["memory_gib"]["gen"]) == {"0"}


def _with_throughput(root: Path, factor: float) -> dict:
    summary = load_summary(root / DEFAULT)
    for st in summary["steps"]:
        st["throughput"] = (st.get("throughput") or 0) * factor
    return summary


def test_time_bounds_are_one_sided(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((root / "recipes/7b-lora/expected/h200x1-ppo.yaml").read_text())
    slower = check(_with_throughput(root, 0.5), doc, "x")
    assert any("throughput_tok_s" in e and "slower than the bound" in e for e in slower)
    assert check(_with_throughput(root, 1.5), doc, "x") == []
    assert "faster than" in capsys.readouterr().out


def test_memory_only_prints_the_time_and_judges_the_memory(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--memory-only` (what the GPU tests hold): a run at half the throughput and twice the step
    time passes with both printed against their bands; the same run with a phase 30% over its
    bound still fails, naming the phase."""
    doc = yaml.safe_load((root / "recipes/7b-lora/expected/h200x1-ppo.yaml").read_text())
    slow = _with_throughput(root, 0.5)
    for st in slow["steps"]:
        st["time_s"] *= 2
    assert len(check(slow, doc, "x")) == 2
    assert check(slow, doc, "x", judge_time=False) == []
    out = capsys.readouterr().out
    assert "step_time_s" in out and "throughput_tok_s" in out and out.count("not judged (--memory-only)") == 2
    phase, gpus = next(iter(doc["bounds"]["memory_gib"].items()))
    gpu, band = next(iter(gpus.items()))
    for name, ph in slow["phases"].items():
        if name == phase:
            ph["gpu"][str(gpu)]["used_gib"] = band[1] * 1.3
    errs = check(slow, doc, "x", judge_time=False)
    assert len(errs) == 1 and f"phase {phase} GPU {gpu}" in errs[0], errs


def test_memory_only_refuses_to_write_bounds(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--memory-only` judges a run; with `--write-bounds` it is one line, exit 2, nothing written."""
    out = tmp_path / "b.yaml"
    argv = ["check-bounds", "7b-lora", "--memory-only", "--write-bounds", str(root / DEFAULT), "--out", str(out)]
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "--memory-only" in err[0] and not out.exists()


def test_step_time_is_the_median_of_steps_two_on(root: Path) -> None:
    """Step 1 carries compile and warm-up (49.9 s in h200x1-ppo-fast against 9.0-10.2 s after):
    the bounds' step time is the median of steps 2+, the figure the README and compare-runs give."""
    summary = load_summary(root / FAST)
    times = {s["step"]: s["time_s"] for s in summary["steps"]}
    assert times[1] > 3 * max(t for k, t in times.items() if k > 1)
    later = sorted(t for k, t in times.items() if k >= 2)
    assert measured(summary)["step_time_s"] == pytest.approx(later[len(later) // 2])
    one = {**summary, "steps": summary["steps"][:1]}  # a one-step run keeps its one step
    assert measured(one)["step_time_s"] == pytest.approx(times[1])


def test_a_step_cut_open_counts_neither_in_the_steps_nor_in_the_time(root: Path) -> None:
    """70b-3d's rank 0 on an H100 ran steps 1 and 2 whole and step 3 to its actor update, where its
    host went away: the bounds hold it to two steps at step 2's time, not three at a median with a
    step that never ended."""
    summary = load_summary(root / "recipes/70b-3d/results/h100x1-ppo-rank0of32-partial")
    assert [s["step"] for s in summary["steps"]] == [1, 2, 3] and summary["exit_code"] is None
    m = measured(summary)
    assert m["steps"] == 2 and m["step_time_s"] == summary["steps"][1]["time_s"]
    assert m["memory_gib"]["update_actor"]["0"] > 70  # the step cut open still counts in the peaks


CAPPED = Path("recipes/7b-lora/results/h200x1-ppo-24gib-cap22.5")  # expected/h200x1-ppo-24gib-cap22.5.yaml
CAPPED_BOUNDS = "recipes/7b-lora/expected/h200x1-ppo-24gib-cap22.5.yaml"


def _host_doctored(root: Path, tmp_path: Path, factor: float) -> Path:
    def edit(summary: dict) -> None:
        summary["peak"]["host"]["rss_gib"] *= factor

    return _edited(root, tmp_path, CAPPED, edit)


@pytest.mark.parametrize(("factor", "words"), [(1.2, "> upper bound"), (0.5, "< lower bound")])
def test_host_ram_of_a_doctored_capped_run_fails(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], factor: float, words: str
) -> None:
    """The offloaded recipe's host RAM is bounded on both sides: far more is a leak or a host
    unlike the bounds' one, far less means the weights did not go to the host."""
    run = _host_doctored(root, tmp_path, factor)
    expected = str(Path(CAPPED_BOUNDS).relative_to("recipes/7b-lora"))
    assert main(["check-bounds", "7b-lora", "--run", str(run), "--expected", expected]) == 1
    out = capsys.readouterr().out
    assert "host RSS peak" in out and words in out
    assert main(["check-bounds", "7b-lora", "--run", str(root / CAPPED), "--expected", expected]) == 0


def test_host_bounds_are_rss_only_and_a_run_without_host_data_fails(root: Path, tmp_path: Path) -> None:
    """PSS is read once a minute, so only the 2 Hz RSS peak is bounded; a run whose monitor read
    no host memory cannot pass a file that bounds it."""
    doc = write_bounds([root / CAPPED], tmp_path / "b.yaml", get_recipe("7b-lora"))
    m = measured(load_summary(root / CAPPED))
    assert set(doc["bounds"]["host_gib"]) == {"rss"}
    rss = m["host_gib"]["rss"]
    assert doc["bounds"]["host_gib"]["rss"] == pytest.approx([rss * 0.8, rss * 1.05], abs=1e-3)
    assert m["host_gib"]["pss"] < m["host_gib"]["rss"]
    summary = load_summary(root / CAPPED)
    del summary["peak"]["host"]
    assert any("host RSS peak not measured" in e for e in check(summary, doc, "x"))


def test_every_capped_bounds_run_fits_under_its_cap_for_three_steps(root: Path) -> None:
    """The 24 GB card verdict in numbers: each capped run behind a bounds file finished 3+ steps
    with the whole device's NVML peak (every process, not one allocator) under its cap."""
    recipe = get_recipe("7b-lora")
    capped = 0
    for name in recipe.expected:
        doc = yaml.safe_load((recipe.dir / name).read_text())
        for src, prov in doc["provenance"].items():
            if prov.get("cap_gib") is None:
                continue
            capped += 1
            summary = load_summary(recipe.dir / src)
            peak = max(float(v["used_gib"]) for v in summary["peak"]["gpu"].values())
            assert peak < float(prov["cap_gib"]), (name, src, peak)
            assert measured(summary)["steps"] >= 3 and summary["ended"]["ok"], (name, src)
    assert capped >= 5


def test_a_summary_cut_short_fails_its_check_and_the_others_still_run(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "cut"
    shutil.copytree(root / RUN, run)
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text[: len(text) // 3])  # a copy that stopped a third of the way
    assert main(["check-bounds", "7b-lora", "--run", str(run)]) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith(("FAIL", "ok"))]
    assert len(lines) == len(get_recipe("7b-lora").expected)  # every bounds file still checked
    assert "ends early" in out


def test_the_7b_readme_names_every_bounds_file_with_its_runs(root: Path) -> None:
    """recipes/7b-lora/README.md's "Expected results" table is written by hand: each bounds file of
    recipe.yaml has its row, and the row names every run the file was written from."""
    import re

    rd = root / "recipes/7b-lora"
    readme = (rd / "README.md").read_text().splitlines()
    for expected in get_recipe("7b-lora").expected:
        rows = [ln for ln in readme if ln.startswith("| [`") and f"]({expected})" in ln.split("|")[1]]
        assert len(rows) == 1, f"7b-lora README: {expected} has {len(rows)} rows in Expected results"
        named = set(re.findall(r"\((results/[^)/]+)/", rows[0].split("|")[3]))
        sources = set(yaml.safe_load((rd / expected).read_text())["source_runs"])
        assert sources <= named, f"7b-lora README: the {expected} row leaves out {sorted(sources - named)}"


RANK_RUN = Path("recipes/13b-fsdp/results/h200x1-ppo-rank0of2")  # ran the job's whole CPU worker pools
RANK_BOUNDS = "expected/h200x1-ppo-rank0of2.yaml"


def _rank_share(root: Path, tmp_path: Path, rss_factor: float) -> Path:
    """A copy of a whole-pool rank rehearsal recorded as one that ran its share of the pools, its
    host RSS peak scaled (a rank's share of 13b-fsdp's pools holds about 8 GiB less of 36)."""

    def edit(summary: dict) -> None:
        summary["peak"]["host"]["rss_gib"] *= rss_factor

    run = _edited(root, tmp_path, RANK_RUN, edit)
    prov = json.loads((run / "provenance.json").read_text())
    prov["rank_rehearsal"]["pools"] = "rank share"
    (run / "provenance.json").write_text(json.dumps(prov))
    return run


def test_a_rank_that_ran_its_share_of_the_pools_is_not_held_to_whole_pool_host_bounds(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed bounds of a rank rehearsal that ran the job's whole CPU worker pools carry
    their host RSS; a rerun of the same rank with its share of them holds less, which is not the
    rank doing less work: its device phases are still judged, its host RSS is not, and it says so.
    Bounds written from such runs say so, and judge such runs' host RSS again."""
    run = _rank_share(root, tmp_path, 0.75)
    run_rss = load_summary(run)["peak"]["host"]["rss_gib"]
    args = ["check-bounds", "13b-fsdp", "--run", str(run), "--expected", RANK_BOUNDS]
    assert main(args) == 0
    assert "host RSS not judged" in capsys.readouterr().out
    doc = write_bounds([run], tmp_path / "b.yaml", get_recipe("13b-fsdp"))
    assert doc["rank_rehearsal"] == {"rank": 0, "world": 2, "pools": "rank share"}
    assert check(load_summary(root / RANK_RUN), doc, "x", judge_host=True)  # the whole-pool run holds more
    whole = _edited(root, tmp_path / "w", RANK_RUN, lambda s: s["peak"]["host"].update(rss_gib=run_rss))
    assert main(["check-bounds", "13b-fsdp", "--run", str(whole), "--expected", RANK_BOUNDS]) == 1
    assert "host RSS peak" in capsys.readouterr().out
    with pytest.raises(RecipeError, match="one file each"):
        write_bounds([root / RANK_RUN, run], tmp_path / "mixed.yaml", get_recipe("13b-fsdp"))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "give a recipe id or --verl-example NAME"),
        (["7b-lora", "--verl-example", "gsm8k-quickstart"], "give a recipe id or --verl-example NAME"),
        (["7b-lora", "--set", "data.train_batch_size=8"], "--set applies to --verl-example"),
        (["--verl-example", "ppo-gemma"], "validation/verl-examples/expected/ppo-gemma/"),
        (["--verl-example", "gsm8k-quickstar"], "did you mean gsm8k-quickstart?"),
    ],
)
def test_check_bounds_of_a_verl_example_refuses_bad_input_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verl example's runs are held to bounds under validation/verl-examples/expected/NAME/
    (`check-bounds --verl-example NAME`); a recipe and an example at once, neither, or an example
    with no bounds yet is one line, exit 2."""
    assert main(["check-bounds", *argv]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and says in err[0], err


EXAMPLES = Path(__file__).resolve().parents[1] / "validation" / "verl-examples"
EXAMPLE_BOUNDS = sorted(p.name for p in (EXAMPLES / "expected").iterdir())


@pytest.mark.parametrize("example", EXAMPLE_BOUNDS)
def test_each_verl_examples_committed_runs_hold_its_bounds(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every verl example with bounds (validation/verl-examples/expected/NAME/) passes
    `check-bounds --verl-example NAME`, given the `--set` lines its runs were made with (an entry
    out as written, such as a script on sglang, is planned through them): each bounds file
    against its own source runs, one `ok` line for each run of each file."""
    files = sorted((EXAMPLES / "expected" / example).glob("*.yaml"))
    assert files
    runs = [EXAMPLES / r for f in files for r in yaml.safe_load(f.read_text())["source_runs"]]
    sets = sorted({v for run in runs for v in read_provenance(run).user_sets})
    assert main(["check-bounds", "--verl-example", example, *(a for v in sets for a in ("--set", v))]) == 0
    ok = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ok ")]
    assert len(ok) == len(runs), ok
