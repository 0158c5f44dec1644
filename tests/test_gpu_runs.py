"""On a GPU host: rerun the committed 7b-lora runs and check them against their bounds.

`python3 -m pytest -m gpu tests/test_gpu_runs.py` on one H200 (about 8 minutes a run: the
synthetic 7B checkpoint, vLLM start-up and CUDA graphs come before the first step). Each run's
memory and host RAM are held to its bounds (`check-bounds --memory-only`); its speed is printed
against its band, a benchmark's to judge. CPU CI skips these (tests/conftest.py says why).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _train(root: Path, tmp_path: Path, *args: str) -> Path:
    # gpu/campaign.sh sets VERL_RECIPES_GPU_RUNS_DIR so the runs these tests make are kept as results.
    keep = os.environ.get("VERL_RECIPES_GPU_RUNS_DIR")
    run = Path(keep) / "-".join(["7b-lora", *[a for a in args if not a.startswith("-")]]) if keep else tmp_path / "run"
    env = {**os.environ, "VERL_RECIPES_ROOT": str(root)}
    cmd = [sys.executable, "-m", "verl_recipes.cli", "train", "7b-lora", "--steps", "3", "--run-dir", str(run)]
    proc = subprocess.run([*cmd, *args, "--quiet"], env=env, timeout=1500)
    assert proc.returncode == 0, f"verl failed; see {run}/train.log"
    return run


def test_7b_ppo_lora_matches_its_bounds(root: Path, tmp_path: Path) -> None:
    run = _train(root, tmp_path)
    assert (run / "summary.json").is_file() and (run / "timeline.png").is_file()
    rc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_recipes.cli",
            "check-bounds",
            "7b-lora",
            "--run",
            str(run),
            "--expected",
            "expected/h200x1-ppo.yaml",
            "--memory-only",
        ],
        env={**os.environ, "VERL_RECIPES_ROOT": str(root)},
    ).returncode
    assert rc == 0


def test_7b_grpo_lora_matches_its_bounds(root: Path, tmp_path: Path) -> None:
    import json

    run = _train(root, tmp_path, "--variant", "grpo")
    steps = [json.loads(line) for line in (run / "verl_metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(steps) >= 3
    env = {**os.environ, "VERL_RECIPES_ROOT": str(root)}
    cmd = [sys.executable, "-m", "verl_recipes.cli", "check-bounds", "7b-lora", "--run", str(run)]
    assert subprocess.run([*cmd, "--expected", "expected/h200x1-grpo.yaml", "--memory-only"], env=env).returncode == 0
