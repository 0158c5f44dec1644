"""gpu/campaign.sh: plan lines, `requires` (passed / `!failed`), pytest lines, and the status file.

Runs the real script with the real `verl-recipes` on this host; the runs it starts fail fast on
purpose (an unknown recipe), which is what the bisection lines react to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_campaign_plan_semantics(root: Path, tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "verl-recipes").exists():
        pytest.skip(f"verl-recipes is not installed beside {sys.executable} (pip install -e .)")
    plan = tmp_path / "plan.txt"
    plan.write_text(
        "# comment line\n"
        "bad|60|-|no-such-recipe --steps 1\n"
        "after-pass|60|bad|7b-lora --steps 1\n"
        "after-fail|120|!bad|pytest --collect-only -q tests/test_reap.py\n"
        "never|60|!after-fail-missing|7b-lora\n"
        "script|60|-|bash recipes/verl-vs-deepspeed/run-both.sh not-a-count\n"
    )
    out = tmp_path / "lane"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "gpu/campaign.sh", str(plan), str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in (out / "status.tsv").read_text().splitlines()]
    status = {r[0]: r[1] for r in rows}
    assert status["bad"] == "2"  # one-line error from verl-recipes train, exit 2
    assert status["after-pass"] == "skipped"
    # pytest -m gpu deselects every test of the file: exit 5 ("no tests collected"), and it did run
    assert status["after-fail"] == "5"
    assert (out / "runs" / "after-fail" / "pytest.log").is_file()
    assert status["never"] == "skipped"
    # `bash SCRIPT ARGS` gets the run folder first: run-both.sh OUT NPROC refuses NPROC "not-a-count"
    assert status["script"] == "2"
    assert "NPROC must be a positive number" in (out / "runs" / "script" / "script.log").read_text()
    assert (out / "DONE").is_file()


def _plan_lines(path: Path) -> list[tuple[str, str, str, str]]:
    out = []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, limit, requires, what = raw.split("|", 3)
        out.append((name.strip(), limit.strip(), requires.strip(), what.strip()))
    return out


@pytest.mark.parametrize("plan", sorted(p.name for p in (Path(__file__).parents[1] / "gpu").glob("plan-*.txt")))
def test_committed_gpu_plans_compose(root: Path, plan: str, tmp_path: Path) -> None:
    """A typo in a committed GPU plan costs scarce device minutes, so each line is checked here:
    unique names, `requires` naming an earlier line, existing scripts and test files, and every
    `train` line parsed by the real `train` parser and composed against verl's config schema with
    the GPU layout the launcher would give it (no model or dataset is made)."""
    import argparse
    import shlex

    from verl_recipes import train
    from verl_recipes.recipe.metadata import get_recipe
    from verl_recipes.recipe.run_config import compose_run, gpu_layout

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    seen: list[str] = []
    for name, limit, requires, what in _plan_lines(root / "gpu" / plan):
        assert name not in seen, f"{plan}: {name} twice"
        assert limit.isdigit() and 0 < int(limit) <= 1800, f"{plan}: {name}: limit {limit!r}"
        if requires != "-":
            assert requires.lstrip("!") in seen, f"{plan}: {name} requires {requires}, not an earlier line"
        seen.append(name)
        words = shlex.split(what)
        if words[0] == "pytest":
            for w in words[1:]:
                if w.startswith("tests/"):
                    assert (root / w.split("::")[0]).is_file(), f"{plan}: {name}: no {w}"
            continue
        if words[0] == "bash":
            assert (root / words[1]).is_file(), f"{plan}: {name}: no {words[1]}"
            continue
        args = parser.parse_args(["train", *words])
        recipe = get_recipe(args.recipe)
        layout = gpu_layout(recipe, args.gpus, args.smoke)
        cfg = compose_run(
            recipe,
            args.variant,
            args.sets,
            layout,
            model=Path("/m"),
            data=Path("/d"),
            run_dir=tmp_path,
            steps=args.steps,
        )
        assert cfg.trainer.total_training_steps == args.steps
